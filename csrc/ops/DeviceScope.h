// Running a unit of op work on an ember device: make the device current for
// the duration (so allocations land in its pool) and submit the work to the
// device's current stream. Every op implementation goes through
// run_on_device, so the execution engine behind Stream::run can change
// without touching the ops.
#pragma once

#include <c10/core/Device.h>

#include <utility>

#include "ember/runtime/device.h"

namespace ember {

inline c10::DeviceIndex current_device_index() {
  return static_cast<c10::DeviceIndex>(runtime::current_device());
}

template <class Work>
void run_on_device(c10::DeviceIndex device, Work&& work) {
  const int previous = runtime::current_device();
  if (previous != device) runtime::set_current_device(device);
  struct Restore {
    int previous;
    int device;
    ~Restore() {
      if (previous != device) runtime::set_current_device(previous);
    }
  } restore{previous, device};
  runtime::device(device).streams().current().run(std::forward<Work>(work));
}

}  // namespace ember
