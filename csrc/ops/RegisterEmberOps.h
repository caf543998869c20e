#pragma once

namespace ember {

// Points ops that have both a CPU kernel and a generic composite at the CPU
// delegation (see RegisterCpuKernelDelegation.cpp). Idempotent; returns how
// many ops it registered.
int register_cpu_kernel_delegation();

}  // namespace ember
