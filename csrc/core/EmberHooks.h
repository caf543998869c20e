// PrivateUse1HooksInterface for ember: how ATen's device-generic code
// (torch.accelerator, generators, storage resize, pointer queries) reaches
// the device.
#pragma once

#include <ATen/detail/PrivateUse1HooksInterface.h>

namespace ember {

struct EmberHooks final : public at::PrivateUse1HooksInterface {
  void init() const override;
  bool isBuilt() const override { return true; }
  bool isAvailable() const override;
  bool hasPrimaryContext(c10::DeviceIndex) const override { return true; }
  c10::DeviceIndex deviceCount() const override;
  void setCurrentDevice(c10::DeviceIndex device) const override;
  c10::DeviceIndex getCurrentDevice() const override;
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override;
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override;
  const at::Generator& getDefaultGenerator(
      c10::DeviceIndex device) const override;
  at::Generator getNewGenerator(c10::DeviceIndex device) const override;
  at::Device getDeviceFromPtr(void* data) const override;
  bool isPinnedPtr(const void* data) const override;
  at::Allocator* getPinnedMemoryAllocator() const override;
  void resizePrivateUse1Bytes(const c10::Storage& storage,
                              size_t new_bytes) const override;
};

// Registers the hooks with ATen; idempotent.
void register_hooks();

}  // namespace ember
