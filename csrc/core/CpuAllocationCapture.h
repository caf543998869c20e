// While a CPU kernel runs on behalf of an ember op, the CPU memory it
// allocates (its outputs and scratch) comes from the ember device's pool.
// The outputs can then become ember tensors without a copy, and ember's
// statistics and memory limit stay true for everything the op touched.
//
// Implemented as a CPU allocator installed over PyTorch's default one that
// forwards every request unchanged unless a CpuAllocationCapture is active on
// the calling thread.
#pragma once

#include <c10/core/Device.h>

namespace ember {

// Installs the forwarding CPU allocator; idempotent.
void install_cpu_allocation_capture();

class CpuAllocationCapture final {
 public:
  explicit CpuAllocationCapture(c10::DeviceIndex device);
  ~CpuAllocationCapture();
  CpuAllocationCapture(const CpuAllocationCapture&) = delete;
  CpuAllocationCapture& operator=(const CpuAllocationCapture&) = delete;

 private:
  c10::DeviceIndex previous_;
};

}  // namespace ember
