// ember's own operator namespace, `torch.ops.ember`: ops that exist for
// ember's compile passes. Registration only.
#include <ATen/core/Tensor.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/relu.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "ops/kernels/matmul/FastGemm.h"

namespace ember {
namespace {

// activation(bias + a @ b) as a value-returning op. Inductor calls ATen
// GEMMs through their out= forms, and oneDNN's packed matmul cannot write
// into a given buffer, so every such GEMM paid a copy of its result; a call
// of this op is an Inductor fallback kernel, whose result is used as
// returned, and an activation rides in the GEMM as oneDNN's post-op. One
// kernel for every backend: on ember, mm/addmm take the packed-weight route;
// on Meta they give the shape.
matmul::Epilogue parse_activation(c10::string_view activation) {
  if (activation == "none") return matmul::Epilogue::kNone;
  if (activation == "relu") return matmul::Epilogue::kRelu;
  if (activation == "gelu") return matmul::Epilogue::kGeluErf;
  if (activation == "gelu_tanh") return matmul::Epilogue::kGeluTanh;
  TORCH_CHECK_VALUE(false, "ember::gemm: unknown activation '", activation,
                    "' (expected none, relu, gelu or gelu_tanh)");
}

at::Tensor gemm(const std::optional<at::Tensor>& bias, const at::Tensor& a,
                const at::Tensor& b, c10::string_view activation) {
  const matmul::Epilogue epilogue = parse_activation(activation);
  const at::Tensor self =
      bias.has_value() && bias->defined() ? *bias : at::Tensor();
  if (epilogue != matmul::Epilogue::kNone) {
    if (auto fused = matmul::fast_linear_epilogue(self, a, b, epilogue)) {
      return *std::move(fused);
    }
  }
  at::Tensor out = self.defined() ? at::addmm(self, a, b) : at::mm(a, b);
  switch (epilogue) {
    case matmul::Epilogue::kRelu:
      return at::relu(out);
    case matmul::Epilogue::kGeluErf:
      return at::gelu(out);
    case matmul::Epilogue::kGeluTanh:
      return at::gelu(out, "tanh");
    case matmul::Epilogue::kNone:
      break;
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(ember, m) {
  m.def(
      "gemm(Tensor? bias, Tensor a, Tensor b, str activation=\"none\") -> "
      "Tensor");
}

TORCH_LIBRARY_IMPL(ember, CompositeExplicitAutograd, m) {
  m.impl("gemm", TORCH_FN(gemm));
}

}  // namespace ember
