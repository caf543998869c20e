// The engine's glue to ATen's intra-op parallelism: the thread count of a
// device's workers and of threads running ops on a device that owns a
// share of the cores.
#include "ops/DeviceScope.h"

#include <ATen/Parallel.h>
#include <omp.h>

#include <cstring>

#include "core/EmberPinnedAllocator.h"
#include "core/RuntimeErrors.h"
#include "ember/runtime/device.h"
#include "ember/runtime/stream.h"

namespace ember {
namespace {

// ATen initialises a thread's OpenMP thread count lazily, from the global
// setting, on its first parallel region; done first here so that
// initialisation cannot undo the device's count later.
void init_aten_threads() {
  (void)at::get_num_threads();
  at::internal::lazy_init_num_threads();
}

// Runs on every new stream worker (already pinned to its device's cores):
// its kernels' OpenMP teams use exactly that many threads, and inherit the
// worker's affinity.
void on_worker_start(const runtime::WorkerConfig& config) {
  init_aten_threads();
  if (!config.cores.empty()) {
    omp_set_num_threads(static_cast<int>(config.cores.size()));
  }
}

const bool worker_hook_installed =
    (runtime::set_worker_start_hook(&on_worker_start), true);

}  // namespace

IntraOpThreads::IntraOpThreads(c10::DeviceIndex device) {
  const int cores = static_cast<int>(runtime::device_cores(device).size());
  init_aten_threads();
  // At most the device's cores; fewer if the thread asked for fewer
  // (torch.set_num_threads keeps working below the device's share).
  const int current = omp_get_max_threads();
  if (current > cores) {
    omp_set_num_threads(cores);
    previous_ = current;
  }
}

IntraOpThreads::~IntraOpThreads() {
  if (previous_ != 0) omp_set_num_threads(previous_);
}

bool enqueue_pinned_upload(const at::Tensor& src, const at::Tensor& dst) {
  if (!src.device().is_cpu() || !dst.is_privateuseone()) return false;
  if (src.scalar_type() != dst.scalar_type() || src.numel() != dst.numel() ||
      src.numel() == 0 || src.is_conj() != dst.is_conj() ||
      src.is_neg() != dst.is_neg() || !src.is_contiguous() ||
      !dst.is_contiguous() || src.layout() != c10::kStrided ||
      dst.layout() != c10::kStrided) {
    return false;
  }
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
