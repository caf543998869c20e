// Running a unit of op work on an ember device: make the device current for
// the duration (so allocations land in its pool) and submit the work to the
// device's current stream. Every op implementation goes through
// run_on_device, so the execution engine behind Stream::run can change
// without touching the ops.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <functional>
#include <utility>

#include "core/CpuAllocationCapture.h"
#include "ember/runtime/device.h"
#include "flags/BackendFlags.h"
#include "graphs/GraphCapture.h"
#include "observe/ExecutionPath.h"
#include "observe/Profiler.h"
#include "ops/LaunchStats.h"
#include "ops/WithDevice.h"
#include "ops/kernels/SerialScope.h"

namespace ember {

// Binds the calling thread to `device`'s cores: its affinity becomes the
// device's cores and its OpenMP thread count their number, so the ops it
// runs (inline, on this thread) use exactly the device's cores. Explicit
// (torch.ember.use_device_cores), never implicit: ops otherwise follow the
// thread's own settings, as on CPU (cpu_parity stays bitwise equal to CPU
// at the same torch.set_num_threads). Returns the device's core count.
int bind_thread_to_device(c10::DeviceIndex device);

inline c10::DeviceIndex current_device_index() {
  return static_cast<c10::DeviceIndex>(runtime::current_device());
}

// A synchronous op: runs on the calling thread once the work queued on the
// current stream has finished (a wait that is counted: launch_stats()).
// Refused while that stream captures a graph (run_on_device_recorded is the
// form a graph can replay).
template <class Work>
void run_on_device(c10::DeviceIndex device, Work&& work) {
  with_device_current(device, [&] {
    runtime::Stream& stream = runtime::device(device).streams().current();
    if (capture::underway() && stream.capture() != nullptr) [[unlikely]] {
      capture::refuse(observe::t_current_op ? observe::t_current_op : "an op",
                      "it runs synchronously and has no replayable form yet");
    }
    stream.submit_held();  // a held chain runs by its own rules, not as a wait
    if (!stream.query()) [[unlikely]]
      count_wait(observe::t_current_op);
    stream.run(std::forward<Work>(work));
  });
}

// The intra-op thread count launched work runs with, and setting it on a
// worker before it runs the work: the launching thread's count (ATen's, as
// the kernel would have used there: results, including cpu_parity's
// bitwise equality at a given torch.set_num_threads, do not depend on
// launching), capped at the device's cores (a device that owns a part of
// the machine never runs more threads than it has cores) except under
// cpu_parity, whose promise is CPU's bits at the launching thread's count.
int launching_thread_count(c10::DeviceIndex device);
void match_thread_count(int threads);
// Restores the calling thread's OpenMP count on scope exit: launched work
// run at the call sets the count it was launched with, and a changed count
// would fail Dynamo's global-state guard (num_threads) in the caller.
class RestoreThreadCount {
 public:
  RestoreThreadCount();
  ~RestoreThreadCount() { match_thread_count(threads_); }
  RestoreThreadCount(const RestoreThreadCount&) = delete;
  RestoreThreadCount& operator=(const RestoreThreadCount&) = delete;

 private:
  int threads_;
};

// Whether the calling thread is a stream worker.
bool on_stream_worker();

// Runs an ATen kernel whose bits do not depend on how many threads split
// it (mul, div, relu, argmax, layer norm, cat, index_select, copies): on
// a stream worker with a one-thread OpenMP team (and MKL count), anywhere
// else as it is. A worker that opens multi-thread regions gets a libgomp
// pool of its own beside the host thread's; once the pools hold more
// threads than the process has cores, libgomp cuts every pool's spin-wait
// to ~100 spins, so each later parallel region of either thread pays a
// futex wake-up: CPU's bf16 tanh over 3072 values (a region above VML's
// 2048-element grain) went from 6 to 15-100 us on the host thread once the
// worker had run one (Intel host, 2 cores). ember's own kernels split
// their work with parallel_chunks and keep the worker's thread count.
template <class Fn>
void run_split_free(Fn&& fn) {
  if (!on_stream_worker()) {
    fn();
    return;
  }
  const kernels::SerialScope one_thread;
  fn();
}

// Launched op work: what the stream's worker runs. Below autograd (as the
// kernel would be on the launching thread), with the device's pool serving
// the CPU allocations of the kernel.
template <class Work>
struct LaunchedWork {
  c10::DeviceIndex device;
  int threads;
  std::optional<observe::LaunchTrace> trace;  // set while the profiler records
  Work work;
  void operator()() {
    c10::impl::ExcludeDispatchKeyGuard below_autograd(
        c10::autograd_dispatch_keyset_with_ADInplaceOrView);
    CpuAllocationCapture capture(device);
    match_thread_count(threads);
    if (!trace) [[likely]] {
      work();
      return;
    }
    const int64_t start = observe::profiler_time_ns();
    work();
    observe::record_launched(*trace, device, start,
                             observe::profiler_time_ns());
  }
};

// Whether op work may be launched asynchronously now
// (torch.backends.ember.async_execution, and not cpu_parity). A graph
// captures whichever form runs, so its replay takes the same kernels as
// eager execution. cpu_parity runs every op at its call: most of its ops
// (CPU's GEMMs, delegated kernels) cannot be launched, and the few that can
// only roused the worker, which then polled beside CPU's OpenMP team (batch-1
// MLP 2.0x the synchronous engine's time, GPT-2 decode 1.25x).
inline bool launch_async() {
  return flags::async_execution() && !flags::cpu_parity();
}

// Launched work whose result has at least this many elements runs at the
// call instead of on the stream's worker while the stream has nothing
// queued (behind queued work it is queued too: waiting would undo the
// overlap running ahead gives). Such a kernel (a GEMM of a prefill, an
// elementwise op over a whole activation) runs long against the host's per-op
// overhead, so running ahead hides little, and on cores the host thread shares,
// the worker's OpenMP team would run beside the host's Python and lose:
// measured on 2 cores, BERT-base ran 7-15% slower queued than at the call.
// Small results (decode, batch-1 MLPs) are queued: there the host overhead is
// what running ahead hides. EMBER_ASYNC_INLINE_NUMEL (a non-negative
// integer; anything else keeps the default) overrides it (0: every launched
// op on an idle stream runs at the call; a huge value: queue all).
int64_t inline_result_numel();

// Whether launched work with a result of `result_numel` elements would run
// at the call on `device` now (launch_on_device's rule): for a kernel whose
// launched form costs more than its synchronous one (oneDNN's packed GEMM
// copies its result into the preallocated one), so the caller can take the
// synchronous form instead.
bool runs_at_call(c10::DeviceIndex device, int64_t result_numel);

// Tiny work (at most kTinyWorkNumel elements) runs at the call on an idle
// stream in either engine: queuing it (the unit, the worker's hand-off)
// costs the host more than the kernel, and the synchronous engine's CPU
// delegation more than ember's own loop (an 8x8 add, 2-core Zen 3: CPU eager
// 1.58 us, launched 1.91, synchronous 2.41, at the call on ember's loop 1.45).
// Returns the device's current stream where `numel` elements of work run at
// the call now, nullptr where the work takes its usual path: a stream with
// queued or held work keeps its order by queueing behind it, a capture
// records every launch, and tests that count launches keep every worker
// awake (Stream::keep_workers_awake).
inline constexpr int64_t kTinyWorkNumel = 4096;
runtime::Stream* idle_stream_for_tiny_work(c10::DeviceIndex device,
                                           int64_t numel);
// Turns the rule off (A/B measurements, tests): tiny work then takes the
// usual path, as larger work does.
void set_tiny_work_at_call(bool on);
// The same for `stream` (not capturing), which is idle or not: a large
// result on an idle stream, or any result while the stream's worker sleeps
// with nothing queued (queued, the work would wait for the worker's
// wake-up, ~150 us on a halted vCPU, where a small kernel takes a few: a
// batch-1 MLP called after a 2 ms pause ran 275 us queued against 87 us at
// the call); once the host has gone on launching for a while, the worker is
// roused, so that the ops which follow find it polling and are queued
// (Stream::note_work_at_call_while_asleep), and queued for the rest of that
// burst even when the worker falls asleep between them.
// `long_running`: work that takes long whatever its result's size (a
// skinny GEMM streaming megabytes of weight for one row): queued even while
// the worker sleeps, since the host goes on with its own work (a decode
// step's Python) while the worker wakes and runs it.
// Any work runs at the call on an idle stream where the launching thread is
// the process's lone launcher and may run only on the stream's one worker
// core (Stream::host_confined_to_worker_core): host and worker would take
// turns on that core.
bool runs_at_call(runtime::Stream& stream, int64_t result_numel,
                  bool long_running = false);

// Runs launched work at the call: as the worker would (below autograd,
// the device's pool, the launching thread count), restoring the calling
// thread's OpenMP thread count afterwards. `beside_worker`: the work is
// small and ran here only because the worker slept, which the next launch
// may wake: ember's kernels then split it on the calling thread's chunk
// team, not its OpenMP team (kernels/ParallelChunks.h, ChunkTeamOnHost).
void run_launched_inline(runtime::Stream& stream, const char* name,
                         c10::DeviceIndex device,
                         const std::function<void()>& work,
                         bool beside_worker = false);

// Queues `work` on `device`'s current stream (the stream's worker runs it,
// in stream order) and returns true at once. `work` owns everything it uses
// (CPU aliases of the ember tensors, owned copies of other arguments): the
// caller's arguments may be gone when it runs. `name` (static) names it in
// an asynchronous error. The result tensors must exist before the call (the
// host allocated them from the op's known output layout). A result of
// `result_numel` >= inline_result_numel() elements is instead computed at
// the call (false returned; not while the stream captures a graph, which
// records every launched unit).
// `long_running`: as runs_at_call's. launch_on_stream: the same on a given
// stream of `device` (a held chain, submitted to the stream that holds it).
template <class Work>
bool launch_on_stream(runtime::Stream& stream, c10::DeviceIndex device,
                      const char* name, Work work, int64_t result_numel = 0,
                      bool long_running = false) {
  bool queued = true;
  with_device_current(device, [&] {
    // Held work goes first, and by its own rules: the stream's state
    // (idle, worker asleep) is then the one this launch follows.
    stream.submit_held();
    // A capturing stream records the unit as it is queued (Stream::enqueue);
    // a recorded unit carries no profiler trace of its capture.
    const bool capturing = capture::underway() && stream.capture() != nullptr;
    if (!capturing && runs_at_call(stream, result_numel, long_running)) {
      queued = false;
      run_launched_inline(stream, name, device, std::ref(work),
                          result_numel < inline_result_numel());
      return;
    }
    stream.enqueue(
        name, LaunchedWork<Work>{
                  device, launching_thread_count(device),
                  capturing ? std::nullopt : observe::trace_launch(stream.id()),
                  std::move(work)});
  });
  return queued;
}

template <class Work>
bool launch_on_device(c10::DeviceIndex device, const char* name, Work work,
                      int64_t result_numel = 0, bool long_running = false) {
  return launch_on_stream(runtime::device(device).streams().current(), device,
                          name, std::move(work), result_numel, long_running);
}

// A synchronous op that a graph can replay: runs `work` as run_on_device
// does and, while the current stream captures, records `make_replay()` (a
// callable owning everything it uses, run by each replay as launched work
// is: on the stream's worker, or on the replaying thread when asynchronous
// execution is off) under the name `op`. make_replay is called
// after `work` has run, so it may take the results.
template <class Work, class MakeReplay>
void run_on_device_recorded(c10::DeviceIndex device, std::string_view op,
                            Work&& work, MakeReplay&& make_replay) {
  with_device_current(device, [&] {
    runtime::Stream& stream = runtime::device(device).streams().current();
    runtime::CapturedGraph* graph =
        capture::underway() ? stream.capture() : nullptr;
    stream.submit_held();
    if (!stream.query()) [[unlikely]]
      count_wait(observe::t_current_op);
    stream.run(std::forward<Work>(work));
    if (graph != nullptr) [[unlikely]] {
      auto replay = make_replay();
      graph->record(
          capture::interned(op),
          LaunchedWork<decltype(replay)>{device, launching_thread_count(device),
                                         std::nullopt, std::move(replay)},
          &stream);
    }
  });
}

// A non_blocking copy from pinned host memory (pin_memory()) into an ember
// tensor: queued on the destination device's current stream, as CUDA's
// cudaMemcpyAsync, when both are dense with the same dtype and layout.
// Returns false (nothing queued) for any other copy, which then runs
// synchronously. The queued work holds both tensors until it has run.
bool enqueue_pinned_upload(const at::Tensor& src, const at::Tensor& dst);

// A blocking copy of at most kMaxStagedUploadBytes from pageable host
// memory into a dense ember tensor, while the destination's stream has work
// queued: the source's bytes are copied into a host buffer at the call and
// the write into the device tensor is queued behind that work, as CUDA
// stages a pageable upload, instead of the host waiting for the queue (the
// position ids, masks and scalars models build on the host each decode
// step: a Falcon step waited ~3 times). Nothing the caller can observe
// differs: its memory may change after the call, a host read of the
// destination waits for the queue. Returns false, having done nothing,
// where asynchronous execution is off, a graph may capture, the stream is
// idle (the copy is then cheaper at the call) or the copy is not a plain
// memcpy. A staged copy is counted as launched in launch_stats().
inline constexpr int64_t kMaxStagedUploadBytes = 64 * 1024;
bool enqueue_staged_upload(const at::Tensor& src, const at::Tensor& dst);

// Before the host (or another device) reads `device`'s memory: waits for
// the work queued on its streams and raises a pending asynchronous error.
void synchronize_for_host_read(c10::DeviceIndex device);

}  // namespace ember
