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
// A synchronous op's device interval is the interval its work ran on its
// stream; a launched op's (ops/LaunchedOps.h) is taken by the stream's
// worker when it runs the work. Both are registered at load time.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ember::observe {

// Registers the ProfilerStubs; the Kineto profiler registers itself
// statically. Idempotent.
void register_profiler();

// What the worker needs to record launched work as a device event.
struct LaunchTrace {
  uint64_t correlation;  // the launching CPU op's
  std::string route;     // how it runs ("delegated", ember's route)
  int64_t stream;
};
// Called by the launching op: nullopt unless a session records PrivateUse1
// activity; otherwise the op's host interval is not recorded (the worker
// records the work instead).
std::optional<LaunchTrace> trace_launch(int64_t stream);
// Called by the worker: the launched work ran on `device` from start_ns to
// end_ns.
void record_launched(const LaunchTrace& trace, int device, int64_t start_ns,
                     int64_t end_ns);
int64_t profiler_time_ns();

}  // namespace ember::observe
