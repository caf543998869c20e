#include "core/EmberHooks.h"

#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include "core/EmberGenerator.h"
#include "core/EmberPinnedAllocator.h"
#include "core/RuntimeErrors.h"
#include "core/StorageResize.h"
#include "ember/runtime/device.h"

namespace ember {

namespace rt = ember::runtime;

void EmberHooks::init() const {
  translate_runtime_errors([] { return rt::device_count(); });
}

bool EmberHooks::isAvailable() const { return deviceCount() > 0; }

c10::DeviceIndex EmberHooks::deviceCount() const {
  try {
    return static_cast<c10::DeviceIndex>(rt::device_count());
  } catch (...) {
    return 0;
  }
}

void EmberHooks::setCurrentDevice(c10::DeviceIndex device) const {
  translate_runtime_errors([&] { rt::set_current_device(device); });
}

c10::DeviceIndex EmberHooks::getCurrentDevice() const {
  return static_cast<c10::DeviceIndex>(rt::current_device());
}

c10::DeviceIndex EmberHooks::exchangeDevice(c10::DeviceIndex device) const {
  const auto previous = getCurrentDevice();
  if (device != previous) setCurrentDevice(device);
  return previous;
}

c10::DeviceIndex EmberHooks::maybeExchangeDevice(
    c10::DeviceIndex device) const {
  if (device < 0 || device >= deviceCount()) return getCurrentDevice();
  return exchangeDevice(device);
}

const at::Generator& EmberHooks::getDefaultGenerator(
    c10::DeviceIndex device) const {
  return default_generator(device < 0 ? getCurrentDevice() : device);
}

at::Generator EmberHooks::getNewGenerator(c10::DeviceIndex device) const {
  return new_generator(device);
}

at::Device EmberHooks::getDeviceFromPtr(void* data) const {
  for (int i = 0; i < rt::device_count(); ++i) {
    if (rt::device(i).allocator().owns(data)) {
      return at::Device(c10::DeviceType::PrivateUse1,
                        static_cast<c10::DeviceIndex>(i));
    }
  }
  TORCH_CHECK(false, "pointer ", data, " is not ember device memory");
}

bool EmberHooks::isPinnedPtr(const void* data) const {
  return is_pinned_ptr(data);
}

at::Allocator* EmberHooks::getPinnedMemoryAllocator() const {
  // Page-locked CPU memory (csrc/core/EmberPinnedAllocator.h): what
  // pin_memory() and pin_memory=True return, and what non_blocking copies
  // to ember queue on the stream instead of running inline.
  return pinned_memory_allocator();
}

void EmberHooks::resizePrivateUse1Bytes(const c10::Storage& storage,
                                        size_t new_bytes) const {
  resize_storage_bytes(storage.unsafeGetStorageImpl(), new_bytes);
}

namespace {

// The at::HostAllocator ATen's device-generic code asks for by device type
// (torch.accelerator.empty_host_cache, host stats). Without one registered
// for PrivateUse1, at::getHostAllocator returns null and
// torch.accelerator.empty_host_cache() dereferenced it (a segfault as soon as
// ember was initialised). Host buffers for ember are the hooks' pinned
// allocator's: nothing is cached here, so there is nothing to empty and the
// statistics stay zero.
class EmberHostAllocator final : public at::HostAllocator {
 public:
  explicit EmberHostAllocator(const EmberHooks& hooks) : hooks_(hooks) {}

  at::DataPtr allocate(size_t n) override {
    return hooks_.getPinnedMemoryAllocator()->allocate(n);
  }
  at::DeleterFnPtr raw_deleter() const override {
    return hooks_.getPinnedMemoryAllocator()->raw_deleter();
  }
  void copy_data(void* dest, const void* src, size_t count) const override {
    hooks_.getPinnedMemoryAllocator()->copy_data(dest, src, count);
  }
  // Execution completes before a host buffer can be reused.
  bool record_event(void*, void*, c10::Stream) override { return true; }
  void empty_cache() override {}
  at::HostStats get_stats() override { return {}; }
  void reset_accumulated_stats() override {}
  void reset_peak_stats() override {}

 private:
  const EmberHooks& hooks_;
};

}  // namespace

void register_hooks() {
  static const bool registered = [] {
    static EmberHooks hooks;
    at::RegisterPrivateUse1HooksInterface(&hooks);
    static EmberHostAllocator host_allocator(hooks);
    at::setHostAllocator(c10::DeviceType::PrivateUse1, &host_allocator);
    return true;
  }();
  (void)registered;
}

}  // namespace ember
