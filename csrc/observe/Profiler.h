// ember in PyTorch's profiler, through the registration points torch gives
// PrivateUse1 backends:
//  - a Kineto activity profiler (REGISTER_PRIVATEUSE1_PROFILER): under
//    torch.profiler.profile(activities=[..., ProfilerActivity.PrivateUse1])
//    every op that ran an ember kernel (native or delegated, see
//    ExecutionPath.h) becomes a device event: kernel activity on its
//    device's stream row, linked to the CPU op that launched it (Kineto's
//    correlation id), so key_averages() reports device time and
//    export_chrome_trace shows ember stream rows;
//  - ProfilerStubs (registerPrivateUse1Methods) for the autograd profiler's
//    use_device="ember" (KINETO_PRIVATEUSE1_FALLBACK): stream-ordered
//    timestamps around each op.
// Execution is synchronous today: a kernel's device interval is the interval
// the op's work ran on its stream. Both are registered at load time.
#pragma once

namespace ember::observe {

// Registers the ProfilerStubs; the Kineto profiler registers itself
// statically. Idempotent.
void register_profiler();

}  // namespace ember::observe
