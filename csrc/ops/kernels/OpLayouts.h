// Result layouts of the launched hot ops (ops/LaunchedOps.h), from ATen's
// C++ meta functions: the structured kernels' own shape, dtype and stride
// logic and argument checks, run on the CPU aliases without touching data.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/_log_softmax_meta_dispatch.h>
#include <ATen/ops/_softmax_meta_dispatch.h>
#include <ATen/ops/add_meta_dispatch.h>
#include <ATen/ops/all_meta_dispatch.h>
#include <ATen/ops/any_meta_dispatch.h>
#include <ATen/ops/argmax_meta_dispatch.h>
#include <ATen/ops/clamp_min_meta_dispatch.h>
#include <ATen/ops/cos_meta_dispatch.h>
#include <ATen/ops/cumsum_meta_dispatch.h>
#include <ATen/ops/div_meta_dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/eq_meta_dispatch.h>
#include <ATen/ops/erf_meta_dispatch.h>
#include <ATen/ops/exp_meta_dispatch.h>
#include <ATen/ops/expm1_meta_dispatch.h>
#include <ATen/ops/fill.h>
#include <ATen/ops/ge_meta_dispatch.h>
#include <ATen/ops/gelu_meta_dispatch.h>
#include <ATen/ops/gt_meta_dispatch.h>
#include <ATen/ops/index_copy_meta_dispatch.h>
#include <ATen/ops/isneginf_meta_dispatch.h>
#include <ATen/ops/isposinf_meta_dispatch.h>
#include <ATen/ops/le_meta_dispatch.h>
#include <ATen/ops/log1p_meta_dispatch.h>
#include <ATen/ops/log_meta_dispatch.h>
#include <ATen/ops/lt_meta_dispatch.h>
#include <ATen/ops/mean_meta_dispatch.h>
#include <ATen/ops/mul_meta_dispatch.h>
#include <ATen/ops/ne_meta_dispatch.h>
#include <ATen/ops/neg_meta_dispatch.h>
#include <ATen/ops/pow_meta_dispatch.h>
#include <ATen/ops/reciprocal_meta_dispatch.h>
#include <ATen/ops/rsqrt_meta_dispatch.h>
#include <ATen/ops/sigmoid_meta_dispatch.h>
#include <ATen/ops/silu_meta_dispatch.h>
#include <ATen/ops/sin_meta_dispatch.h>
#include <ATen/ops/sqrt_meta_dispatch.h>
#include <ATen/ops/sub_meta_dispatch.h>
#include <ATen/ops/sum_meta_dispatch.h>
#include <ATen/ops/tanh_meta_dispatch.h>

namespace ember::kernels::layouts {

using T = const at::Tensor&;
using S = const at::Scalar&;

struct Add {
  static at::Tensor infer(T a, T b, S alpha) {
    return at::meta::add(a, b, alpha);
  }
};
struct Sub {
  static at::Tensor infer(T a, T b, S alpha) {
    return at::meta::sub(a, b, alpha);
  }
};
struct Mul {
  static at::Tensor infer(T a, T b) { return at::meta::mul(a, b); }
};
struct Div {
  static at::Tensor infer(T a, T b) { return at::meta::div(a, b); }
};
struct AddInplace {
  static void infer(at::Tensor& self, T other, S alpha) {
    at::meta::add_(self, other, alpha);
  }
};
struct MulInplace {
  static void infer(at::Tensor& self, T other) { at::meta::mul_(self, other); }
};
// fill_'s one host-side failure, a value its dtype cannot hold (CPU's
// kernel converts it checked): raised at the call, on one CPU element.
struct FillInplace {
  static void infer(at::Tensor& self, S value) {
    at::empty({}, at::TensorOptions().dtype(self.scalar_type())).fill_(value);
  }
};
// zero_ cannot fail.
struct ZeroInplace {
  static void infer(at::Tensor&) {}
};
// Shapes, dtypes and the index's rank only: the index values are read when
// the kernel runs (an index out of range is an asynchronous error).
struct IndexCopyInplace {
  static void infer(at::Tensor& self, int64_t dim, T index, T source) {
    at::meta::index_copy_(self, dim, index, source);
  }
};
// relu is clamp_min(self, 0) on CPU, after refusing bool.
struct Relu {
  static at::Tensor infer(T self) {
    TORCH_CHECK(self.scalar_type() != at::kBool,
                "Boolean inputs not supported for relu");
    return at::meta::clamp_min(self, 0);
  }
};
// Kernels whose dtype dispatch takes floating-point (and complex) operands
// only, where the meta function takes any: the launched form declines an
// integer operand, so the synchronous form raises the kernel's "not
// implemented for 'Long'" at the call instead of the worker raising it later.
inline void floating_only(T self) {
  TORCH_CHECK(at::isFloatingType(self.scalar_type()) ||
                  at::isComplexType(self.scalar_type()),
              "launched kernels take floating-point operands");
}
struct Gelu {
  static at::Tensor infer(T self, c10::string_view approximate) {
    floating_only(self);
    return at::meta::gelu(self, approximate);
  }
};
struct Softmax {
  static at::Tensor infer(T self, int64_t dim, bool half_to_float) {
    floating_only(self);
    return at::meta::_softmax(self, dim, half_to_float);
  }
};
struct LogSoftmax {
  static at::Tensor infer(T self, int64_t dim, bool half_to_float) {
    floating_only(self);
    return at::meta::_log_softmax(self, dim, half_to_float);
  }
};

struct Tanh {
  static at::Tensor infer(T self) { return at::meta::tanh(self); }
};
// A structured unary op (exp, rsqrt, sigmoid, ...): its meta function.
template <at::Tensor (*MetaFn)(T)>
struct Unary {
  static at::Tensor infer(T self) { return MetaFn(self); }
};
// erf: CPU's kernel refuses complex operands (its meta function does not).
template <at::Tensor (*MetaFn)(T)>
struct RealUnary {
  static at::Tensor infer(T self) {
    TORCH_CHECK(!at::isComplexType(self.scalar_type()),
                "launched kernels take real operands");
    return MetaFn(self);
  }
};
template <at::Tensor (*MetaFn)(T)>
struct FloatingUnary {
  static at::Tensor infer(T self) {
    floating_only(self);
    return MetaFn(self);
  }
};
struct PowScalar {
  static at::Tensor infer(T self, S exponent) {
    return at::meta::pow(self, exponent);
  }
};
struct Argmax {
  static at::Tensor infer(T self, std::optional<int64_t> dim, bool keepdim) {
    return at::meta::argmax(self, dim, keepdim);
  }
};

// where(condition, self, other) as CPU's where_self_out lays it out: the
// operands cast to their result type, then a TensorIterator over the three
// (broadcast, strides following the inputs), run here on meta copies of
// them. A uint8 condition (deprecated, with a warning) stays synchronous.
// OpLayouts.cpp.
struct Where {
  static at::Tensor infer(T condition, T self, T other);
};

struct MeanDim {
  static at::Tensor infer(T self, at::OptionalIntArrayRef dim, bool keepdim,
                          std::optional<at::ScalarType> dtype) {
    return at::meta::mean(self, dim, keepdim, dtype);
  }
};
struct SumDim {
  static at::Tensor infer(T self, at::OptionalIntArrayRef dim, bool keepdim,
                          std::optional<at::ScalarType> dtype) {
    return at::meta::sum(self, dim, keepdim, dtype);
  }
};

// Comparisons (masks: transformers' padding and causal masks, Falcon's
// `le` of positions). CPU's lt/le/gt/ge kernels order real numbers only and
// refuse complex operands their meta functions take: the launched form
// declines those, so the synchronous form raises CPU's error at the call.
template <bool kOrdered>
void comparable(T self) {
  if constexpr (kOrdered) {
    TORCH_CHECK(!at::isComplexType(self.scalar_type()),
                "launched comparisons order real operands");
  }
}
template <at::Tensor (*MetaFn)(T, T), bool kOrdered>
struct CompareTensor {
  static at::Tensor infer(T self, T other) {
    comparable<kOrdered>(self);
    comparable<kOrdered>(other);
    return MetaFn(self, other);
  }
};
template <at::Tensor (*MetaFn)(T, S), bool kOrdered>
struct CompareScalar {
  static at::Tensor infer(T self, S other) {
    comparable<kOrdered>(self);
    TORCH_CHECK(!kOrdered || !other.isComplex(),
                "launched comparisons order real operands");
    return MetaFn(self, other);
  }
};
// all / any over one dimension (the math attention's masked-row test).
template <at::Tensor (*MetaFn)(T, int64_t, bool)>
struct OneDimReduction {
  static at::Tensor infer(T self, int64_t dim, bool keepdim) {
    return MetaFn(self, dim, keepdim);
  }
};
struct Cumsum {
  static at::Tensor infer(T self, int64_t dim,
                          std::optional<at::ScalarType> dtype) {
    return at::meta::cumsum(self, dim, dtype);
  }
};

}  // namespace ember::kernels::layouts
