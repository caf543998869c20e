// ember's own operator namespace, `torch.ops.ember`: ops that exist for
// ember's compile passes. Registration only.
#include <ATen/core/Tensor.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/mm.h>
#include <torch/library.h>

namespace ember {
namespace {

// bias + a @ b as a value-returning op. Inductor calls ATen GEMMs through
// their out= forms, and oneDNN's packed matmul cannot write into a given
// buffer, so every such GEMM paid a copy of its result; a call of this op
// is an Inductor fallback kernel, whose result is used as returned. One
// kernel for every backend: on ember, mm/addmm take the packed-weight route;
// on Meta they give the shape.
at::Tensor gemm(const std::optional<at::Tensor>& bias, const at::Tensor& a,
                const at::Tensor& b) {
  if (bias.has_value() && bias->defined()) return at::addmm(*bias, a, b);
  return at::mm(a, b);
}

}  // namespace

TORCH_LIBRARY(ember, m) {
  m.def("gemm(Tensor? bias, Tensor a, Tensor b) -> Tensor");
}

TORCH_LIBRARY_IMPL(ember, CompositeExplicitAutograd, m) {
  m.impl("gemm", TORCH_FN(gemm));
}

}  // namespace ember
