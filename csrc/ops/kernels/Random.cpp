// Random ops whose CPU kernel draws from the process's CPU generator
// internally (no Generator argument to redirect). They are written here in
// terms of ember ops, so their randomness comes from the ember generator.
#include <ATen/ops/empty_like.h>
#include <ATen/ops/ones_like.h>

#include "ops/kernels/EmberKernels.h"

namespace ember::kernels {

std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input,
                                                  double p,
                                                  std::optional<bool> train) {
  const auto mask_options = input.options().dtype(at::kBool);
  if (input.numel() == 0) {
    return {input, at::empty_like(input, input.options())};
  }
  if (train.has_value() && !*train) {
    return {input.clone(), at::ones_like(input, mask_options)};
  }
  const double keep = 1.0 - p;
  // keep == 0 drops everything; avoid the 0 * inf = NaN a 1/keep would give.
  const double scale = keep == 0.0 ? 0.0 : 1.0 / keep;
  at::Tensor mask = at::empty_like(input, mask_options);
  mask.bernoulli_(keep);  // ember op: draws from the ember generator
  at::Tensor output = input.mul(mask).mul_(scale);
  return {output, mask};
}

}  // namespace ember::kernels
