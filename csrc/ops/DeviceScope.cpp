// The engine's glue to ATen's intra-op parallelism (the thread count of a
// device's workers, and of threads bound to a device), and the copies the
// engine queues.
#include "ops/DeviceScope.h"

#include <ATen/Parallel.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include "core/EmberPinnedAllocator.h"
#include "core/RuntimeErrors.h"
#include "ember/runtime/device.h"
#include "ember/runtime/stream.h"
#include "flags/BackendFlags.h"
#include "graphs/GraphCapture.h"
#include "ops/kernels/ParallelChunks.h"

namespace ember {
namespace {

// ATen initialises a thread's OpenMP thread count lazily, from the global
// setting, on its first parallel region; done first here so that
// initialisation cannot undo the device's count later.
void init_aten_threads() {
  (void)at::get_num_threads();
  at::internal::lazy_init_num_threads();
}

thread_local bool t_stream_worker = false;

// Runs on every new stream worker (already pinned to its device's cores):
// its kernels' OpenMP teams use exactly that many threads, and inherit the
// worker's affinity.
void on_worker_start(const runtime::WorkerConfig& config) {
  t_stream_worker = true;
  init_aten_threads();
  if (!config.cores.empty()) {
    omp_set_num_threads(static_cast<int>(config.cores.size()));
  }
}

// Runs on a stream worker idle for a while after work: ends the OpenMP team
// its CPU kernels opened. While two threads of the process own a team,
// libgomp counts more threads than cores and every team's barrier sleeps
// after ~100 spins instead of polling: 256^3 mm on the host 94 -> 150 us,
// BERT-base on CPU +17%, for the rest of the process. The next parallel
// region on the worker starts a fresh team (tens of us).
void on_worker_idle() { (void)omp_pause_resource_all(omp_pause_soft); }

const bool worker_hook_installed =
    (runtime::set_worker_start_hook(&on_worker_start),
     runtime::set_worker_idle_hook(&on_worker_idle), true);

}  // namespace

int launching_thread_count(c10::DeviceIndex device) {
  const int threads = at::get_num_threads();
  // cpu_parity promises CPU's bits at the launching thread's count.
  if (flags::cpu_parity()) return threads;
  const auto cores = static_cast<int>(runtime::device_cores(device).size());
  return cores > 0 && cores < threads ? cores : threads;
}

bool on_stream_worker() { return t_stream_worker; }

RestoreThreadCount::RestoreThreadCount() : threads_(omp_get_max_threads()) {}

void match_thread_count(int threads) {
  if (omp_get_max_threads() != threads) omp_set_num_threads(threads);
}

int bind_thread_to_device(c10::DeviceIndex device) {
  const std::vector<int>& cores =
      translate_runtime_errors([&]() -> const std::vector<int>& {
        return runtime::device_cores(device);
      });
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int core : cores) {
    if (core >= 0 && core < CPU_SETSIZE) CPU_SET(core, &set);
  }
  const int error = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  TORCH_CHECK(error == 0,
              "ember: cannot bind this thread to the cores of ember:", device,
              " (pthread_setaffinity_np: error ", error, ")");
  runtime::forget_thread_affinity();
  init_aten_threads();
  omp_set_num_threads(static_cast<int>(cores.size()));
  return static_cast<int>(cores.size());
}

int64_t inline_result_numel() {
  static const int64_t threshold = [] {
    constexpr int64_t kDefault = int64_t{1} << 16;
    const char* value = std::getenv("EMBER_ASYNC_INLINE_NUMEL");
    if (value == nullptr || *value == '\0') return kDefault;
    char* end = nullptr;
    const long long parsed = std::strtoll(value, &end, 10);
    return *end == '\0' && parsed >= 0 ? static_cast<int64_t>(parsed)
                                       : kDefault;
  }();
  return threshold;
}

bool runs_at_call(runtime::Stream& stream, int64_t result_numel,
                  bool long_running) {
  if (result_numel >= inline_result_numel() ||
      stream.host_confined_to_worker_core()) {
    return stream.query();
  }
  if (long_running || !stream.worker_asleep()) return false;
  return !stream.note_work_at_call_while_asleep();
}

bool runs_at_call(c10::DeviceIndex device, int64_t result_numel) {
  if (!launch_async()) return false;
  runtime::Stream& stream = runtime::device(device).streams().current();
  stream.submit_held();  // its state decides
  return !(capture::underway() && stream.capture() != nullptr) &&
         runs_at_call(stream, result_numel);
}

namespace {
std::atomic<bool> tiny_work_at_call_on{true};
}  // namespace

void set_tiny_work_at_call(bool on) {
  tiny_work_at_call_on.store(on, std::memory_order_relaxed);
}

runtime::Stream* idle_stream_for_tiny_work(c10::DeviceIndex device,
                                           int64_t numel) {
  if (numel > kTinyWorkNumel || capture::underway() ||
      !tiny_work_at_call_on.load(std::memory_order_relaxed) ||
      runtime::Stream::workers_kept_awake()) {
    return nullptr;
  }
  runtime::Stream& stream = runtime::device(device).streams().current();
  return stream.query() ? &stream : nullptr;
}

void run_launched_inline(runtime::Stream& stream, const char* name,
                         c10::DeviceIndex device,
                         const std::function<void()>& work,
                         bool beside_worker) {
  if (!stream.query()) [[unlikely]]
    count_wait(name);
  RestoreThreadCount restore;
  std::optional<kernels::ChunkTeamOnHost> chunk_team;
  if (beside_worker) chunk_team.emplace();
  stream.run(LaunchedWork<std::reference_wrapper<const std::function<void()>>>{
      device, launching_thread_count(device), std::nullopt, std::cref(work)});
}

namespace {

// A host tensor and an ember tensor whose bytes a plain memcpy copies.
bool dense_upload(const at::Tensor& src, const at::Tensor& dst) {
  return src.device().is_cpu() && dst.is_privateuseone() &&
         src.scalar_type() == dst.scalar_type() && src.numel() == dst.numel() &&
         src.numel() != 0 && src.is_conj() == dst.is_conj() &&
         src.is_neg() == dst.is_neg() && src.is_contiguous() &&
         dst.is_contiguous() && src.layout() == c10::kStrided &&
         dst.layout() == c10::kStrided;
}

}  // namespace

bool enqueue_staged_upload(const at::Tensor& src, const at::Tensor& dst) {
  if (!launch_async() || capture::underway() || !dense_upload(src, dst) ||
      src.nbytes() > kMaxStagedUploadBytes) {
    return false;
  }
  const c10::DeviceIndex device = dst.device().index();
  bool queued = false;
  translate_runtime_errors([&] {
    runtime::Stream& stream = runtime::device(device).streams().current();
    stream.submit_held();
    if (stream.query()) return;  // nothing to wait for: copied at the call
    // The caller may change its host memory once the copy returns: the
    // queued write reads a copy made now.
    at::Tensor staged = src.clone();
    const auto bytes = static_cast<std::size_t>(src.nbytes());
    static const std::string name = "aten::copy_ (host to ember, staged)";
    stream.enqueue(name.c_str(), [staged = std::move(staged), dst, bytes] {
      std::memcpy(dst.data_ptr(), staged.const_data_ptr(), bytes);
    });
    count_launch(name);
    queued = true;
  });
  return queued;
}

bool enqueue_pinned_upload(const at::Tensor& src, const at::Tensor& dst) {
  if (!dense_upload(src, dst)) return false;
  if (!is_pinned_ptr(src.storage().data()) ||
      !is_pinned_ptr(static_cast<const char*>(src.data_ptr()) + src.nbytes() -
                     1)) {
    return false;
  }
  const auto bytes = static_cast<std::size_t>(src.nbytes());
  const c10::DeviceIndex device = dst.device().index();
  translate_runtime_errors([&] {
    runtime::device(device).streams().current().enqueue(
        "aten::copy_ (non_blocking, pinned host to ember)", [src, dst, bytes] {
          std::memcpy(dst.data_ptr(), src.data_ptr(), bytes);
        });
  });
  return true;
}

void synchronize_for_host_read(c10::DeviceIndex device) {
  translate_runtime_errors([&] { runtime::device(device).synchronize(); });
}

}  // namespace ember
