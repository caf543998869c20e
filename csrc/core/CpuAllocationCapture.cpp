#include "core/CpuAllocationCapture.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include "core/EmberAllocator.h"

namespace ember {
namespace {

// -1: no capture; otherwise the ember device whose pool serves CPU requests.
thread_local c10::DeviceIndex tls_capture_device = -1;

c10::DeleterFnPtr base_raw_deleter = nullptr;

// raw_deallocate() may run long after the op that allocated (oneDNN caches
// scratch buffers), so the pointer itself decides whose memory it is.
void free_raw(void* data) {
  if (!free_cpu_kernel_memory(data) && base_raw_deleter != nullptr) {
    base_raw_deleter(data);
  }
}

class CapturingCpuAllocator final : public c10::Allocator {
 public:
  explicit CapturingCpuAllocator(c10::Allocator* base) : base_(base) {}

  c10::DataPtr allocate(size_t nbytes) override {
    if (tls_capture_device < 0) return base_->allocate(nbytes);
    return device_allocator()->allocate_for_cpu_kernel(tls_capture_device,
                                                       nbytes);
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return base_->raw_deleter() == nullptr ? nullptr : &free_raw;
  }
  void copy_data(void* dest, const void* src,
                 std::size_t count) const override {
    base_->copy_data(dest, src, count);
  }

 private:
  c10::Allocator* base_;
};

}  // namespace

void install_cpu_allocation_capture() {
  static const bool installed = [] {
    static CapturingCpuAllocator allocator(c10::GetCPUAllocator());
    base_raw_deleter = c10::GetCPUAllocator()->raw_deleter();
    // Priority above the default registration (0) so ours is the one used.
    c10::SetCPUAllocator(&allocator, /*priority=*/1);
    return true;
  }();
  (void)installed;
}

CpuAllocationCapture::CpuAllocationCapture(c10::DeviceIndex device)
    : previous_(tls_capture_device) {
  tls_capture_device = device;
}

CpuAllocationCapture::~CpuAllocationCapture() {
  tls_capture_device = previous_;
}

}  // namespace ember
