// The default path of every ember op: run ATen's CPU kernel on CPU aliases
// of the ember tensors (ops/CpuAlias.h), on the current stream of the op's
// device, and turn the results back into ember tensors without copying.
//
// Data path: dispatcher (PrivateUse1) -> cpu_delegation_fallback -> swap
// ember tensors for CPU aliases, check devices, give random ops the ember
// generator's engine -> redispatch to the CPU kernel under a
// CpuAllocationCapture -> results adopted as ember tensors, resized out=
// arguments written back.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

namespace ember {

void cpu_delegation_fallback(const c10::OperatorHandle& op,
                             c10::DispatchKeySet keys,
                             torch::jit::Stack* stack);

}  // namespace ember
