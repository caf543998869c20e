#include "ops/LaunchedOps.h"

#include <ATen/ops/empty_strided.h>

namespace ember::unboxed {

at::Tensor empty_like_meta(const at::Tensor& meta, c10::DeviceIndex device) {
  return at::empty_strided(
      meta.sizes(), meta.strides(),
      meta.options().device(c10::Device(c10::DeviceType::PrivateUse1, device)));
}

}  // namespace ember::unboxed
