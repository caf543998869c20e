#include "ops/kernels/OpLayouts.h"

#include <ATen/TensorIterator.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/result_type.h>

namespace ember::kernels::layouts {
namespace {

// A meta tensor with t's sizes, strides and dtype (or `dtype`, laid out as
// a copy to it would be: Tensor.to keeps a dense layout, else CPU's
// suggested one).
at::Tensor meta_like(const at::Tensor& t, at::ScalarType dtype) {
  at::Tensor meta =
      at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta));
  if (dtype == t.scalar_type()) return meta;
  return at::empty_like(meta, meta.options().dtype(dtype));
}

}  // namespace

at::Tensor Where::infer(T condition, T self, T other) {
  TORCH_CHECK(condition.scalar_type() == at::kBool,
              "where expected condition to be a boolean tensor.");
  const at::ScalarType result_type = at::result_type(self, other);
  at::Tensor out =
      at::empty({0}, self.options().dtype(result_type).device(at::kMeta));
  const at::Tensor condition_meta = meta_like(condition, at::kBool);
  const at::Tensor self_meta = meta_like(self, result_type);
  const at::Tensor other_meta = meta_like(other, result_type);
  at::TensorIteratorConfig()
      .check_all_same_dtype(false)
      .add_output(out)
      .add_const_input(condition_meta)
      .add_const_input(self_meta)
      .add_const_input(other_meta)
      .build();
  return out;
}

}  // namespace ember::kernels::layouts
