// Unboxed registrations for the ops that dominate small-tensor workloads
// (elementwise arithmetic, softmax, activations; layer norm is in
// LayerNorm.cpp, the matmul family in Matmul.cpp). Each runs CPU's kernel,
// launched on the stream (ops/LaunchedOps.h) or, where that does not apply,
// through the synchronous delegation, without boxing its arguments.
#include <ATen/core/Tensor.h>
#include <ATen/ops/_log_softmax_ops.h>
#include <ATen/ops/_softmax_ops.h>
#include <ATen/ops/add_ops.h>
#include <ATen/ops/argmax_ops.h>
#include <ATen/ops/cos_ops.h>
#include <ATen/ops/erf_ops.h>
#include <ATen/ops/exp_ops.h>
#include <ATen/ops/expm1_ops.h>
#include <ATen/ops/fill_ops.h>
#include <ATen/ops/gelu_ops.h>
#include <ATen/ops/index_copy_ops.h>
#include <ATen/ops/log1p_ops.h>
#include <ATen/ops/log_ops.h>
#include <ATen/ops/mul_ops.h>
#include <ATen/ops/neg_ops.h>
#include <ATen/ops/pow_ops.h>
#include <ATen/ops/reciprocal_ops.h>
#include <ATen/ops/rsqrt_ops.h>
#include <ATen/ops/sigmoid_ops.h>
#include <ATen/ops/silu_ops.h>
#include <ATen/ops/sin_ops.h>
#include <ATen/ops/sqrt_ops.h>
#include <ATen/ops/where_ops.h>
#include <ATen/ops/zero_ops.h>
#include <c10/core/DispatchKeySet.h>
#include <torch/library.h>

#include <optional>

#include "flags/BackendFlags.h"
#include "observe/ExecutionPath.h"
#include "ops/LaunchedOps.h"
#include "ops/UnboxedDelegation.h"
#include "ops/kernels/DeterministicOps.h"
#include "ops/kernels/EmberKernels.h"
#include "ops/kernels/OpLayouts.h"
#include "ops/kernels/elementwise/ElementwiseChain.h"

namespace ember {
namespace {

// Exact C++ parameter types of the schemas (the dispatcher checks them).
using T = const at::Tensor&;
using S = const at::Scalar&;

namespace ops = at::_ops;

// The power a chain computes as CPU's kernel does (a * a, a * a * a) for
// `exponent` over `self`, if any: fp32 elements in order, 2 or 3.
std::optional<kernels::ChainOp> chained_power(T self, S exponent) {
  if (self.scalar_type() != at::kFloat || self.layout() != c10::kStrided ||
      self.is_neg() || self.is_conj() || !self.is_contiguous() ||
      !kernels::chains(self)) {
    return std::nullopt;
  }
  double value = 0.0;
  if (exponent.isFloatingPoint()) {
    value = exponent.toDouble();
  } else if (exponent.isIntegral(/*includeBool=*/false)) {
    value = static_cast<double>(exponent.toLong());
  } else {
    return std::nullopt;
  }
  if (value == 2.0) return kernels::ChainOp::kSquare;
  if (value == 3.0) return kernels::ChainOp::kCube;
  return std::nullopt;
}

// pow(tensor, scalar): a chain's step, launched, or under determinism the
// chunked elementwise path (ops/RegisterDeterministicOps.cpp).
at::Tensor pow_tensor_scalar(T self, S exponent) {
  if (const std::optional<kernels::ChainOp> power =
          chained_power(self, exponent)) {
    observe::mark_path(observe::ExecutionPath::kNative, "ember/pow");
    return kernels::chain_step(*power, self, nullptr);
  }
  if (flags::deterministic()) {
    static const c10::OperatorHandle op =
        c10::Dispatcher::singleton().findSchemaOrThrow("aten::pow",
                                                       "Tensor_Scalar");
    torch::jit::Stack stack{self, exponent};
    kernels::deterministic::elementwise_when_deterministic(
        op, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), &stack);
    return stack.back().toTensor();
  }
  return unboxed::launched<ops::pow_Tensor_Scalar,
                           unboxed::OutForm<ops::pow_Tensor_Scalar_out>,
                           kernels::layouts::PowScalar, T, S>(self, exponent);
}

// index_copy_ (a static KV cache's update, twice per layer and token):
// launched, so a decode step does not wait for the queue at each cache
// write; under determinism ATen's kernel serially (repeated indices). Its
// work is the source's rows, not the cache: sized by the cache, it ran at
// the call on an idle stream like a prefill GEMM, and a static-cache GPT-2
// decode step took 48-50 ms asynchronously against 32-33 synchronously.
at::Tensor& index_copy_inplace(at::Tensor& self, int64_t dim, T index,
                               T source) {
  if (flags::deterministic()) {
    static const c10::OperatorHandle op =
        c10::Dispatcher::singleton().findSchemaOrThrow("aten::index_copy_", "");
    torch::jit::Stack stack{self, dim, index, source};
    kernels::deterministic::serial_when_deterministic(
        op, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), &stack);
    return self;
  }
  return unboxed::launched_inplace_writing<
      ops::index_copy_, kernels::layouts::IndexCopyInplace, int64_t, T, T>(
      source.numel(), self, dim, index, source);
}

// A structured unary op, launched: CPU's out= kernel on the worker, the
// result's layout from `Layout` (the op's meta function).
template <class Op, class OutOp, class Layout>
at::Tensor unary(T self) {
  return unboxed::launched<Op, unboxed::OutForm<OutOp>, Layout, T>(self);
}

// sigmoid and silu: launched, or under determinism on fixed chunks (their
// vector and scalar loops round differently, and ATen's thread split picks
// which elements take the scalar tail: RegisterDeterministicOps.cpp).
template <class Op, class OutOp, class Layout>
at::Tensor launched_unless_deterministic(T self) {
  if (flags::deterministic()) {
    static const c10::OperatorHandle op =
        c10::Dispatcher::singleton().findSchemaOrThrow(Op::name,
                                                       Op::overload_name);
    torch::jit::Stack stack{self};
    kernels::deterministic::elementwise_when_deterministic(
        op, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), &stack);
    return stack.back().toTensor();
  }
  return unary<Op, OutOp, Layout>(self);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  using namespace unboxed;
  namespace lay = kernels::layouts;
  namespace meta = at::meta;
  // ember's loop where it applies (elementwise/Arithmetic.cpp).
  m.impl("add.Tensor", TORCH_FN(kernels::add));
  m.impl("sub.Tensor", TORCH_FN(kernels::sub));
  m.impl("mul.Tensor", TORCH_FN(kernels::mul));
  m.impl("div.Tensor", TORCH_FN(kernels::div));
  m.impl("pow.Tensor_Scalar", TORCH_FN(pow_tensor_scalar));
  // Attention masks (transformers' decode step: a synchronous where drained
  // the queue 12 times per token).
  m.impl("where.self",
         TORCH_FN((launched<ops::where_self, OutForm<ops::where_self_out>,
                            lay::Where, T, T, T>)));
  // ember's row kernel where it applies (elementwise/Argmax.cpp).
  m.impl("argmax", TORCH_FN(kernels::argmax));
  m.impl("add_.Tensor", TORCH_FN(kernels::add_));
  m.impl("mul_.Tensor",
         TORCH_FN((launched_inplace<ops::mul__Tensor, lay::MulInplace, T>)));
  m.impl("index_copy_", TORCH_FN(index_copy_inplace));
  // torch.full / masked fills: a synchronous fill waited for the queue.
  m.impl("fill_.Scalar",
         TORCH_FN((launched_inplace<ops::fill__Scalar, lay::FillInplace, S>)));
  m.impl("zero_", TORCH_FN((launched_inplace<ops::zero_, lay::ZeroInplace>)));
  // Under determinism these two take a fixed-order path (DeterministicOps).
  m.impl("_softmax", TORCH_FN(kernels::deterministic::softmax));
  m.impl("_log_softmax",
         TORCH_FN(
             (launched<ops::_log_softmax, RowwiseOutForm<ops::_log_softmax_out>,
                       lay::LogSoftmax, T, int64_t, bool>)));
  m.impl("gelu", TORCH_FN(kernels::gelu));
  m.impl("relu", TORCH_FN(kernels::relu));
  m.impl("tanh", TORCH_FN(kernels::tanh));
  // Structured unary math (RMSNorm's rsqrt, rotary embeddings' sin, cos and
  // neg, SwiGLU's silu): launched like the ops above, and unboxed, where the
  // boxed delegation ran each at the call, draining the stream's queue
  // first (a Llama decode step waited on 13 of them per layer).
  using lay::Unary;
  m.impl("exp", TORCH_FN((unary<ops::exp, ops::exp_out, Unary<meta::exp>>)));
  m.impl("expm1",
         TORCH_FN((unary<ops::expm1, ops::expm1_out, Unary<meta::expm1>>)));
  m.impl("log", TORCH_FN((unary<ops::log, ops::log_out, Unary<meta::log>>)));
  m.impl("log1p",
         TORCH_FN((unary<ops::log1p, ops::log1p_out, Unary<meta::log1p>>)));
  m.impl("sqrt",
         TORCH_FN((unary<ops::sqrt, ops::sqrt_out, Unary<meta::sqrt>>)));
  m.impl("rsqrt",
         TORCH_FN((unary<ops::rsqrt, ops::rsqrt_out, Unary<meta::rsqrt>>)));
  m.impl("reciprocal", TORCH_FN((unary<ops::reciprocal, ops::reciprocal_out,
                                       Unary<meta::reciprocal>>)));
  m.impl("neg", TORCH_FN((unary<ops::neg, ops::neg_out, Unary<meta::neg>>)));
  m.impl("sin", TORCH_FN((unary<ops::sin, ops::sin_out, Unary<meta::sin>>)));
  m.impl("cos", TORCH_FN((unary<ops::cos, ops::cos_out, Unary<meta::cos>>)));
  m.impl("erf",
         TORCH_FN((unary<ops::erf, ops::erf_out, lay::RealUnary<meta::erf>>)));
  m.impl("sigmoid",
         TORCH_FN((launched_unless_deterministic<ops::sigmoid, ops::sigmoid_out,
                                                 Unary<meta::sigmoid>>)));
  m.impl("silu",
         TORCH_FN(
             (launched_unless_deterministic<ops::silu, ops::silu_out,
                                            lay::FloatingUnary<meta::silu>>)));
}

}  // namespace
}  // namespace ember
