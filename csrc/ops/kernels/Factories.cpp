#include <ATen/EmptyTensor.h>

#include "core/EmberAllocator.h"
#include "core/RuntimeErrors.h"
#include "ops/DeviceScope.h"
#include "ops/WithDevice.h"
#include "ops/kernels/EmberKernels.h"

namespace ember::kernels {
namespace {

constexpr c10::DispatchKeySet kEmberKeys{c10::DispatchKey::PrivateUse1};

c10::DeviceIndex target_device(const std::optional<c10::Device>& device) {
  if (!device.has_value() || !device->has_index()) {
    return current_device_index();
  }
  translate_runtime_errors(
      [&] { runtime::check_device_index(device->index()); });
  return device->index();
}

void check_strided(std::optional<c10::Layout> layout) {
  TORCH_CHECK(!layout.has_value() || *layout == c10::Layout::Strided,
              "ember supports only strided tensors, got layout ", *layout);
}

}  // namespace

at::Tensor empty_memory_format(c10::IntArrayRef size,
                               std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout,
                               std::optional<c10::Device> device,
                               std::optional<bool> /*pin_memory*/,
                               std::optional<c10::MemoryFormat> memory_format) {
  check_strided(layout);
  at::Tensor result;
  with_device_current(target_device(device), [&] {
    result =
        at::detail::empty_generic(size, device_allocator(), kEmberKeys,
                                  c10::dtype_or_default(dtype), memory_format);
  });
  return result;
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout,
                         std::optional<c10::Device> device,
                         std::optional<bool> /*pin_memory*/) {
  check_strided(layout);
  at::Tensor result;
  with_device_current(target_device(device), [&] {
    result = at::detail::empty_strided_generic(size, stride, device_allocator(),
                                               kEmberKeys,
                                               c10::dtype_or_default(dtype));
  });
  return result;
}

}  // namespace ember::kernels
