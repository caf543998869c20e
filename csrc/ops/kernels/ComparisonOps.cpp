// Unboxed, launched registrations of the comparisons (eq, ne, lt, le, gt, ge
// against a tensor or a number), the infinity tests (isneginf, isposinf),
// all / any along a dimension and cumsum: the ops transformers' mask and
// position code runs each decode step. Through the boxed delegation they ran at
// the call, draining the stream's queue: a Falcon decode step waited on `le`
// and on the math attention's `isneginf`, an OPT step on `cumsum` (its
// positions). Each runs CPU's out= kernel on the worker (ops/LaunchedOps.h), so
// the bits are CPU's. Their results do not depend on how the work is split
// (exact comparisons; a cumulative sum runs each line in order on one thread),
// so a stream worker runs them on one thread and opens no OpenMP pool of its
// own.
#include <ATen/core/Tensor.h>
#include <ATen/ops/all_ops.h>
#include <ATen/ops/any_ops.h>
#include <ATen/ops/cumsum_ops.h>
#include <ATen/ops/eq_ops.h>
#include <ATen/ops/ge_ops.h>
#include <ATen/ops/gt_ops.h>
#include <ATen/ops/isneginf_ops.h>
#include <ATen/ops/isposinf_ops.h>
#include <ATen/ops/le_ops.h>
#include <ATen/ops/lt_ops.h>
#include <ATen/ops/ne_ops.h>
#include <torch/library.h>

#include "ops/LaunchedOps.h"
#include "ops/kernels/OpLayouts.h"

namespace ember {
namespace {

using T = const at::Tensor&;
using S = const at::Scalar&;
namespace ops = at::_ops;
namespace lay = kernels::layouts;
using unboxed::launched;
using unboxed::SplitFreeOutForm;

constexpr auto meta_tensor(at::Tensor (*fn)(T, T)) { return fn; }
constexpr auto meta_scalar(at::Tensor (*fn)(T, S)) { return fn; }
constexpr auto meta_one_dim(at::Tensor (*fn)(T, int64_t, bool)) { return fn; }

// `name.Tensor` and `name.Scalar` of one comparison, launched.
#define EMBER_LAUNCHED_COMPARISON(m, name, ordered)                           \
  m.impl(                                                                     \
      #name ".Tensor",                                                        \
      TORCH_FN(                                                               \
          (launched<ops::name##_Tensor,                                       \
                    SplitFreeOutForm<ops::name##_Tensor_out>,                 \
                    lay::CompareTensor<meta_tensor(at::meta::name), ordered>, \
                    T, T>)));                                                 \
  m.impl(                                                                     \
      #name ".Scalar",                                                        \
      TORCH_FN(                                                               \
          (launched<ops::name##_Scalar,                                       \
                    SplitFreeOutForm<ops::name##_Scalar_out>,                 \
                    lay::CompareScalar<meta_scalar(at::meta::name), ordered>, \
                    T, S>)))

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  EMBER_LAUNCHED_COMPARISON(m, eq, false);
  EMBER_LAUNCHED_COMPARISON(m, ne, false);
  EMBER_LAUNCHED_COMPARISON(m, lt, true);
  EMBER_LAUNCHED_COMPARISON(m, le, true);
  EMBER_LAUNCHED_COMPARISON(m, gt, true);
  EMBER_LAUNCHED_COMPARISON(m, ge, true);
  // Complex operands are refused by their meta functions, at the call.
  m.impl("isneginf",
         TORCH_FN((launched<ops::isneginf, SplitFreeOutForm<ops::isneginf_out>,
                            lay::Unary<at::meta::isneginf>, T>)));
  m.impl("isposinf",
         TORCH_FN((launched<ops::isposinf, SplitFreeOutForm<ops::isposinf_out>,
                            lay::Unary<at::meta::isposinf>, T>)));
  // all / any along a dimension: the math attention's test for rows masked
  // whole (CPU's _safe_softmax), once per layer and step.
  m.impl("all.dim",
         TORCH_FN((launched<ops::all_dim, SplitFreeOutForm<ops::all_out>,
                            lay::OneDimReduction<meta_one_dim(at::meta::all)>,
                            T, int64_t, bool>)));
  m.impl("any.dim",
         TORCH_FN((launched<ops::any_dim, SplitFreeOutForm<ops::any_out>,
                            lay::OneDimReduction<meta_one_dim(at::meta::any)>,
                            T, int64_t, bool>)));
  m.impl(
      "cumsum",
      TORCH_FN(
          (launched<ops::cumsum, SplitFreeOutForm<ops::cumsum_out>, lay::Cumsum,
                    T, int64_t, std::optional<at::ScalarType>>)));
}

#undef EMBER_LAUNCHED_COMPARISON

}  // namespace
}  // namespace ember
