#include "ops/kernels/matmul/FastGemm.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>

#include "flags/BackendFlags.h"
#include "observe/ExecutionPath.h"
#include "ops/DeviceScope.h"
#include "ops/UnboxedDelegation.h"
#include "ops/kernels/matmul/PackedWeights.h"
#include "ops/kernels/matmul/SkinnyGemm.h"

namespace ember::matmul {
namespace {

using flags::Fp32Precision;

bool is_ember_float(const at::Tensor& t, c10::Device device) {
  return t.device() == device && t.scalar_type() == at::kFloat;
}

// A bias the kernels add per column: N contiguous floats ([N] or [1, N]).
std::optional<at::Tensor> row_bias(const at::Tensor& self, int64_t n,
                                   c10::Device device) {
  if (!is_ember_float(self, device) || self.size(-1) != n ||
      self.stride(-1) != 1 || self.numel() != n || self.dim() > 2) {
    return std::nullopt;
  }
  return self.dim() == 1 ? self : self.view({n});
}

at::Tensor onednn_linear(const at::Tensor& a, const PackedWeight& weight,
                         const std::optional<at::Tensor>& bias) {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow(
          "mkldnn::_linear_pointwise", "");
  torch::jit::Stack stack;
  stack.reserve(6);
  stack.emplace_back(a);
  stack.emplace_back(weight.onednn);
  stack.emplace_back(bias);
  stack.emplace_back("none");
  stack.emplace_back(c10::List<std::optional<at::Scalar>>());
  stack.emplace_back(c10::IValue());
  op.callBoxed(stack);
  return stack.back().toTensor();
}

}  // namespace

std::optional<at::Tensor> fast_linear(const at::Tensor& self,
                                      const at::Tensor& a, const at::Tensor& b,
                                      const at::Scalar& beta,
                                      const at::Scalar& alpha) {
  if (flags::cpu_parity() || flags::deterministic() || flags::benchmark() ||
      flags::blas_library() != flags::BlasLibrary::kDefault) {
    return std::nullopt;
  }
  const c10::Device device = a.device();
  if (device.type() != c10::DeviceType::PrivateUse1 ||
      !is_ember_float(a, device) || !is_ember_float(b, device) ||
      a.dim() != 2 || b.dim() != 2 || a.size(1) != b.size(0) ||
      a.stride(1) != 1 || a.size(0) == 0 || b.numel() == 0 ||
      alpha.toDouble() != 1.0) {
    return std::nullopt;
  }
  const int64_t m = a.size(0);
  const int64_t n = b.size(1);
  std::optional<at::Tensor> bias;
  if (self.defined() && beta.toDouble() != 0.0) {
    bias = row_bias(self, n, device);
    if (!bias || beta.toDouble() != 1.0) return std::nullopt;
  }
  const Fp32Precision precision = flags::matmul_fp32_precision();
  const bool skinny = m <= kSkinnyMaxRows;

  if (skinny && (precision == Fp32Precision::kIeee
                     ? skinny_f32_supported()
                     : precision == Fp32Precision::kBf16 &&
                           skinny_bf16_supported())) {
    const bool bf16 = precision == Fp32Precision::kBf16;
    auto packed = packed_weight(
        b, bf16 ? PackKind::kPanelsBf16 : PackKind::kPanelsF32);
    if (!packed) return std::nullopt;
    at::Tensor out;
    run_on_device(device.index(), [&] {
      out = at::empty({m, n}, a.options());
      const float* bias_data = bias ? bias->const_data_ptr<float>() : nullptr;
      if (bf16) {
        skinny_gemm_bf16(a.const_data_ptr<float>(), a.stride(0), m,
                         packed->bf16(), bias_data, out.mutable_data_ptr<float>(),
                         n);
      } else {
        skinny_gemm_f32(a.const_data_ptr<float>(), a.stride(0), m,
                        packed->f32(), bias_data, out.mutable_data_ptr<float>(),
                        n);
      }
    });
    observe::mark_path(observe::ExecutionPath::kNative,
                       bf16 ? "skinny/bf16-packed" : "skinny/f32-packed");
    return out;
  }

  if (skinny || precision != Fp32Precision::kIeee) return std::nullopt;
  auto packed = packed_weight(b, PackKind::kOneDnn);
  if (!packed) return std::nullopt;
  at::Tensor out = unboxed::custom<at::Tensor>(
      "aten::addmm",
      [&](const at::Tensor& ca, const std::optional<at::Tensor>& cbias) {
        return onednn_linear(ca, *packed, cbias);
      },
      a, bias);
  observe::mark_path(observe::ExecutionPath::kNative, "onednn/packed");
  return out;
}

}  // namespace ember::matmul
