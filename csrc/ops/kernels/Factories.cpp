#include <ATen/EmptyTensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/arange_ops.h>
#include <ATen/ops/empty.h>

#include "core/EmberAllocator.h"
#include "core/RuntimeErrors.h"
#include "ops/CpuAlias.h"
#include "ops/CpuDelegation.h"
#include "ops/DeviceScope.h"
#include "ops/LaunchStats.h"
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

// Longer ranges are computed where they land (one pass, no host copy).
constexpr int64_t kHostComputedRange = int64_t{1} << 16;

}  // namespace

at::Tensor& arange_start_out(const at::Scalar& start, const at::Scalar& end,
                             const at::Scalar& step, at::Tensor& out) {
  if (launch_async() && out.is_privateuseone()) {
    // CPU's kernel: its argument checks, its size and its values.
    at::Tensor values = at::empty({0}, out.options().device(c10::kCPU));
    at::_ops::arange_start_out::call(start, end, step, values);
    if (values.numel() <= kHostComputedRange) {
      if (out.numel() != values.numel()) out.resize_({values.numel()});
      static const std::string name = "aten::arange.start_out";
      launch_on_device(out.device().index(), name.c_str(),
                       [values, out_cpu = cpu_alias(out)] {
                         run_split_free([&] { out_cpu.copy_(values); });
                       });
      count_launch(name);
      return out;
    }
  }
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::arange",
                                                     "start_out");
  torch::jit::Stack stack{start, end, step, out};
  cpu_delegation_fallback(
      op, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), &stack);
  return out;
}

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
