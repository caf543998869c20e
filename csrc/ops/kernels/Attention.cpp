// Fused-attention selection for scaled_dot_product_attention on ember.
// ember makes exactly CPU's choice (CPU flash attention when its constraints
// hold, else the math path), so attention results are bitwise equal to CPU's
// and the flash path keeps memory O(L*d).
#include <ATen/ops/_fused_sdp_choice_native.h>

#include "ops/kernels/EmberKernels.h"

namespace ember::kernels {

int64_t fused_sdp_choice(const at::Tensor& query, const at::Tensor& key,
                         const at::Tensor& value,
                         const std::optional<at::Tensor>& attn_mask,
                         double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa) {
  // CPU's selection reads only metadata (shapes, strides, dtypes) and the
  // global sdp flags, so it applies to ember tensors as they are.
  return at::native::_fused_sdp_choice_cpp(
      query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa);
}

}  // namespace ember::kernels
