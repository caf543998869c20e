// Activations with an ember kernel by default (elementwise/VectorMath.h);
// under cpu_parity, and for what the kernels do not cover (other dtypes,
// overlapping or strided layouts, no AVX-512), CPU's kernel on aliases.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/tanh_ops.h>

#include "flags/BackendFlags.h"
#include "observe/ExecutionPath.h"
#include "ops/UnboxedDelegation.h"
#include "ops/kernels/EmberKernels.h"
#include "ops/kernels/elementwise/VectorMath.h"

namespace ember::kernels {
namespace {

// A float32 tensor whose elements fill its memory exactly once, so the
// kernel can run over it as one flat array (in any dense layout).
bool flat_float(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat && t.is_non_overlapping_and_dense() &&
         !t.is_conj() && !t.is_neg();
}

bool own_kernel_applies(const at::Tensor& self) {
  return !flags::cpu_parity() && vector_math_supported() && flat_float(self);
}

}  // namespace

at::Tensor tanh(const at::Tensor& self) {
  if (!own_kernel_applies(self)) {
    return unboxed::functional<at::_ops::tanh, const at::Tensor&>(self);
  }
  at::Tensor out = unboxed::custom<at::Tensor>(
      "aten::tanh",
      [](const at::Tensor& x) {
        // empty_like keeps a dense layout's strides: same element order.
        at::Tensor result = at::empty_like(x);
        tanh_f32(x.const_data_ptr<float>(), result.mutable_data_ptr<float>(),
                 x.numel());
        return result;
      },
      self);
  observe::mark_path(observe::ExecutionPath::kNative, "ember/tanh");
  return out;
}

}  // namespace ember::kernels
