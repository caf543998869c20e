// add, sub, mul, div (Tensor overloads) and relu over flat fp32 tensors:
// ember's own loop, launched with nothing but the operands' storages and
// data pointers. The CPU kernel's launched form (ops/LaunchedOps.h) builds
// CPU aliases and runs the op's meta function on the host, then a
// TensorIterator on the worker: ~1.5 us per call, on every residual add
// and every step of GPT-2's GELU, where an 8x8 add costs CPU 1.2 us in all.
//
// Covered: both operands fp32 tensors on one ember device, contiguous with
// the default strides and the same sizes, or the second a Python number
// (a wrapped scalar); add/sub with alpha 1. Each element is one correctly
// rounded IEEE operation, as in CPU's kernels (its alpha-1 fmadd, b * 1 +
// a, rounds once too; relu is the same max instruction), so the results
// are CPU's bits at any split. The result is contiguous, as CPU's
// TensorIterator lays out such operands. Tiny work (kTinyWorkNumel) on an
// idle stream runs the loop at the call in either engine (DeviceScope.h).
// Anything else, cpu_parity and larger work on the synchronous engine run
// CPU's kernel as before.
// GCC 12 reports its own intrinsics' deliberately undefined register
// operands (_mm512_undefined_*) as uninitialised.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <ATen/core/Tensor.h>
#include <ATen/ops/add_ops.h>
#include <ATen/ops/clamp_min_ops.h>
#include <ATen/ops/div_ops.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mul_ops.h>
#include <ATen/ops/relu_ops.h>
#include <ATen/ops/sub_ops.h>
#include <c10/core/DispatchKeySet.h>

#include <optional>
#include <string>

#include "observe/ExecutionPath.h"
#include "ops/LaunchedOps.h"
#include "ops/kernels/ConvEpilogue.h"
#include "ops/kernels/EmberKernels.h"
#include "ops/kernels/OpLayouts.h"
#include "ops/kernels/ParallelChunks.h"
#include "ops/kernels/elementwise/ArithF32.h"
#include "ops/kernels/elementwise/ElementwiseChain.h"
#include "ops/kernels/elementwise/VectorMath.h"

namespace ember::kernels {
namespace {

using T = const at::Tensor&;
using S = const at::Scalar&;
namespace ops = at::_ops;

// Elements per parallel chunk: below it one thread is faster.
constexpr int64_t kGrain = 32768;

// What the worker needs: the storages (kept alive until the work has run)
// and where the elements are.
struct ArithWork {
  c10::Storage a_storage, b_storage, out_storage;
  const float* a;
  const float* b;  // nullptr: `scalar` is the second operand
  float scalar;
  float* out;
  int64_t n;
};

template <Arith Op>
void run_arith(const ArithWork& w) {
  parallel_chunks(w.n, kGrain, [&](int64_t begin, int64_t end) {
    arith_f32<Op>(w.a, w.b, w.scalar, w.out, begin, end);
  });
}

// fp32, contiguous with the strides at::empty gives (what CPU's
// TensorIterator gives the result of such operands), not empty.
bool flat_f32(T t) {
  if (t.scalar_type() != at::kFloat || t.numel() == 0 || t.is_neg() ||
      t.is_conj() || t.layout() != c10::kStrided) {
    return false;
  }
  int64_t expected = 1;
  for (int64_t d = t.dim() - 1; d >= 0; --d) {
    if (t.stride(d) != expected) return false;
    expected *= std::max<int64_t>(t.size(d), 1);
  }
  return true;
}

// A Python number passed as the second operand, as fp32 (CPU's kernel reads
// it with a plain conversion: out-of-range doubles become inf there too).
std::optional<float> wrapped_scalar(T t) {
  if (!t.device().is_cpu() || t.dim() != 0 ||
      !t.unsafeGetTensorImpl()->is_wrapped_number()) {
    return std::nullopt;
  }
  switch (t.scalar_type()) {
    case at::kDouble:
      return static_cast<float>(*t.const_data_ptr<double>());
    case at::kLong:
      return static_cast<float>(*t.const_data_ptr<int64_t>());
    default:
      return std::nullopt;
  }
}

bool alpha_is_one(S alpha) {
  if (alpha.isIntegral(/*includeBool=*/false)) return alpha.toLong() == 1;
  return alpha.isFloatingPoint() && alpha.toDouble() == 1.0;
}

// ember's loop for `Op` over `a` and `b`, launched or at the call (nullopt:
// not covered: CPU's kernel).
template <Arith Op>
std::optional<at::Tensor> own_arith(T a, const at::Tensor* b,
                                    const std::string& name,
                                    const char* route) {
  // Synchronous execution takes ember's loop for tiny work only (below);
  // larger work runs CPU's kernel there, as cpu_parity's always does.
  const bool async = launch_async();
  const bool tiny = a.numel() <= kTinyWorkNumel && !flags::cpu_parity();
  if ((!async && !tiny) || !vector_math_supported() || !flat_f32(a)) {
    return std::nullopt;
  }
  ArithWork w{a.storage(), {},   {},      a.const_data_ptr<float>(),
              nullptr,     0.0f, nullptr, a.numel()};
  if (b != nullptr) {
    if (b->is_privateuseone()) {
      if (b->device() != a.device() || !flat_f32(*b) ||
          b->sizes() != a.sizes()) {
        return std::nullopt;
      }
      w.b_storage = b->storage();
      w.b = b->const_data_ptr<float>();
    } else if (const std::optional<float> s = wrapped_scalar(*b)) {
      w.scalar = *s;
    } else {
      return std::nullopt;
    }
  }
  if (runtime::Stream* stream =
          tiny ? idle_stream_for_tiny_work(a.device().index(), w.n) : nullptr) {
    observe::mark_path(observe::ExecutionPath::kNative, route);
    at::Tensor out = at::empty(a.sizes(), a.options());
    w.out = out.mutable_data_ptr<float>();
    stream->run([&w] { arith_f32<Op>(w.a, w.b, w.scalar, w.out, 0, w.n); });
    return out;
  }
  if (!async) return std::nullopt;
  observe::mark_path(observe::ExecutionPath::kNative, route);
  // The step after a held convolution (ConvEpilogue.h)?
  if constexpr (Op == Arith::kRelu) {
    if (std::optional<at::Tensor> out = epilogue_relu(a)) return out;
  }
  if constexpr (Op == Arith::kAdd) {
    if (w.b != nullptr) {
      if (std::optional<at::Tensor> out = epilogue_add(a, *b)) return out;
    }
  }
  if (chains(a)) {
    return chain_step(static_cast<ChainOp>(Op), a, w.b != nullptr ? b : nullptr,
                      w.scalar);
  }
  at::Tensor out = at::empty(a.sizes(), a.options());
  w.out_storage = out.storage();
  w.out = out.mutable_data_ptr<float>();
  const int64_t n = w.n;
  const bool queued = launch_on_device(
      a.device().index(), name.c_str(),
      [w = std::move(w)] { run_arith<Op>(w); }, n);
  if (queued) count_launch(name);
  return out;
}

// relu's CPU kernel is clamp_min(self, 0).
struct ReluKernel {
  static constexpr bool kSplitFree = true;
  static void run(at::Tensor& out, const at::Tensor& self) {
    ops::clamp_min_out::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU),
                                   self, 0, out);
  }
};

}  // namespace

at::Tensor add(T self, T other, S alpha) {
  using Op = ops::add_Tensor;
  if (alpha_is_one(alpha)) {
    if (auto out = own_arith<Arith::kAdd>(self, &other, unboxed::op_name<Op>(),
                                          "ember/add")) {
      return *out;
    }
  }
  return unboxed::launched<Op, unboxed::OutForm<ops::add_out>, layouts::Add, T,
                           T, S>(self, other, alpha);
}

at::Tensor& add_(at::Tensor& self, T other, S alpha) {
  using Op = ops::add__Tensor;
  if (alpha_is_one(alpha) && launch_async() && epilogue_add_(self, other)) {
    return self;
  }
  return unboxed::launched_inplace<Op, layouts::AddInplace, T, S>(self, other,
                                                                  alpha);
}

at::Tensor sub(T self, T other, S alpha) {
  using Op = ops::sub_Tensor;
  if (alpha_is_one(alpha)) {
    if (auto out = own_arith<Arith::kSub>(self, &other, unboxed::op_name<Op>(),
                                          "ember/sub")) {
      return *out;
    }
  }
  return unboxed::launched<Op, unboxed::OutForm<ops::sub_out>, layouts::Sub, T,
                           T, S>(self, other, alpha);
}

at::Tensor mul(T self, T other) {
  using Op = ops::mul_Tensor;
  if (auto out = own_arith<Arith::kMul>(self, &other, unboxed::op_name<Op>(),
                                        "ember/mul")) {
    return *out;
  }
  return unboxed::launched<Op, unboxed::SplitFreeOutForm<ops::mul_out>,
                           layouts::Mul, T, T>(self, other);
}

at::Tensor div(T self, T other) {
  using Op = ops::div_Tensor;
  if (auto out = own_arith<Arith::kDiv>(self, &other, unboxed::op_name<Op>(),
                                        "ember/div")) {
    return *out;
  }
  return unboxed::launched<Op, unboxed::SplitFreeOutForm<ops::div_out>,
                           layouts::Div, T, T>(self, other);
}

at::Tensor relu(T self) {
  using Op = ops::relu;
  if (auto out = own_arith<Arith::kRelu>(self, nullptr, unboxed::op_name<Op>(),
                                         "ember/relu")) {
    return *out;
  }
  return unboxed::launched<Op, ReluKernel, layouts::Relu, T>(self);
}

}  // namespace ember::kernels
