// Making a device current for work that is not stream work.
#pragma once

#include <c10/core/Device.h>

#include <utility>

#include "ember/runtime/device.h"

namespace ember {

// Runs `work` on the calling thread with `device` current, outside stream
// order: for work that only allocates (empty, empty_strided), which must
// not wait for the work queued on the stream (as CUDA's allocations do
// not). Op work goes through run_on_device (DeviceScope.h) instead.
template <class Work>
void with_device_current(c10::DeviceIndex device, Work&& work) {
  const int previous = runtime::current_device();
  if (previous != device) runtime::set_current_device(device);
  struct Restore {
    int previous;
    int device;
    ~Restore() {
      if (previous != device) runtime::set_current_device(previous);
    }
  } restore{previous, device};
  std::forward<Work>(work)();
}

}  // namespace ember
