// torch.autocast("ember"): exactly CUDA's op policies, from the op lists
// ATen publishes for backends to share (AT_FORALL_* in ATen/autocast_mode.h).
// Ops not listed fall through to their normal kernels.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace ember {
namespace {

using at::IntArrayRef;
using at::Scalar;
using at::ScalarType;
using at::Tensor;
using at::autocast::CastPolicy;

// Same refusal and message as CUDA autocast: this op is not safe to autocast.
Tensor binary_cross_entropy_refused(const Tensor&, const Tensor&,
                                    const std::optional<Tensor>&, int64_t) {
  TORCH_CHECK(
      false,
      "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are "
      "unsafe to autocast.\nMany models use a sigmoid layer right before the "
      "binary cross entropy layer.\nIn this case, combine the two layers "
      "using torch.nn.functional.binary_cross_entropy_with_logits\nor "
      "torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and "
      "BCEWithLogits are\nsafe to autocast.");
}

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

#define ADD_NS(RAW_OP) at::RAW_OP
#define EMBER_LOWER_PRECISION_FP(...) \
  KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define EMBER_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define EMBER_FP32_SET_OPT_DTYPE(...) \
  KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define EMBER_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
#define EMBER_DIFFERENT_SIGNATURE(FUNC, NAME, SIGNATURE, REDISPATCH, POLICY) \
  KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE(FUNC, NAME, SIGNATURE, \
                                                      REDISPATCH, POLICY)

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
  AT_FORALL_LOWER_PRECISION_FP(EMBER_LOWER_PRECISION_FP)
  AT_FORALL_FP32(EMBER_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(EMBER_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(EMBER_DIFFERENT_SIGNATURE)
  AT_FORALL_PROMOTE(EMBER_PROMOTE)
  m.impl("binary_cross_entropy", TORCH_FN(binary_cross_entropy_refused));
}

}  // namespace
}  // namespace ember
