// Running a unit of op work on an ember device: make the device current for
// the duration (so allocations land in its pool) and submit the work to the
// device's current stream. Every op implementation goes through
// run_on_device, so the execution engine behind Stream::run can change
// without touching the ops.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <utility>

#include "ember/runtime/device.h"
#include "ops/WithDevice.h"

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

template <class Work>
void run_on_device(c10::DeviceIndex device, Work&& work) {
  with_device_current(device, [&] {
    runtime::device(device).streams().current().run(std::forward<Work>(work));
  });
}

// A non_blocking copy from pinned host memory (pin_memory()) into an ember
// tensor: queued on the destination device's current stream, as CUDA's
// cudaMemcpyAsync, when both are dense with the same dtype and layout.
// Returns false (nothing queued) for any other copy, which then runs
// synchronously. The queued work holds both tensors until it has run.
bool enqueue_pinned_upload(const at::Tensor& src, const at::Tensor& dst);

// Before the host (or another device) reads `device`'s memory: waits for
// the work queued on its streams and raises a pending asynchronous error.
void synchronize_for_host_read(c10::DeviceIndex device);

}  // namespace ember
