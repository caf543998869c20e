// mm, addmm, bmm, baddbmm on ember (and matmul/linear, which decompose into
// them). By default a Linear-shaped fp32 GEMM takes ember's packed-weight
// route (matmul/FastGemm.h) and other GEMMs the GemmEngine (oneDNN); under
// torch.backends.ember.cpu_parity exactly CPU's kernel (unboxed delegation)
// unless another switch (fp32 precision, BLAS library, benchmark,
// determinism) asks for the GemmEngine.
#include <ATen/ExpandUtils.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/addmm_ops.h>
#include <ATen/ops/baddbmm_ops.h>
#include <ATen/ops/bmm_ops.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm_ops.h>

#include "flags/BackendFlags.h"
#include "graphs/GraphCapture.h"
#include "observe/ExecutionPath.h"
#include "ops/LaunchedOps.h"
#include "ops/StorageWrites.h"
#include "ops/UnboxedDelegation.h"
#include "ops/kernels/EmberKernels.h"
#include "ops/kernels/matmul/FastGemm.h"
#include "ops/kernels/matmul/GemmEngine.h"

namespace ember::kernels {
namespace {

using T = const at::Tensor&;
using S = const at::Scalar&;
namespace ops = at::_ops;

// ATen's argument checks, with its messages (RuntimeError, as on CPU/CUDA).
std::vector<int64_t> checked_shape(const at::Tensor& a, const at::Tensor& b,
                                   bool batched) {
  const int64_t dims = batched ? 3 : 2;
  TORCH_CHECK(a.dim() == dims, batched ? "batch1" : "self", " must be a ", dims,
              "D tensor");
  TORCH_CHECK(b.dim() == dims, batched ? "batch2" : "mat2", " must be a ", dims,
              "D tensor");
  TORCH_CHECK(a.scalar_type() == b.scalar_type(),
              "expected m1 and m2 to have the same dtype, but got: ",
              a.scalar_type(), " != ", b.scalar_type());
  if (batched) {
    TORCH_CHECK(a.size(0) == b.size(0), "batch1 and batch2 must have same ",
                "number of batches, got ", a.size(0), " and ", b.size(0));
  }
  TORCH_CHECK(a.size(-1) == b.size(-2), "mat1 and mat2 shapes cannot be ",
              "multiplied (", a.size(-2), "x", a.size(-1), " and ", b.size(-2),
              "x", b.size(-1), ")");
  if (batched) return {a.size(0), a.size(1), b.size(2)};
  return {a.size(0), b.size(1)};
}

at::Tensor product(const char* op, const at::Tensor& self, const at::Tensor& a,
                   const at::Tensor& b, const at::Scalar& beta,
                   const at::Scalar& alpha, bool batched) {
  at::Tensor out = at::empty(checked_shape(a, b, batched), a.options());
  matmul::gemm(op, out, a, b, self, beta, alpha);
  return out;
}

void product_out(const char* op, at::Tensor& out, const at::Tensor& self,
                 const at::Tensor& a, const at::Tensor& b,
                 const at::Scalar& beta, const at::Scalar& alpha,
                 bool batched) {
  TORCH_CHECK(out.scalar_type() == a.scalar_type(), "Expected out tensor to ",
              "have dtype ", a.scalar_type(), ", but got ", out.scalar_type(),
              " instead");
  at::native::resize_output(out, checked_shape(a, b, batched));
  matmul::gemm(op, out, a, b, self, beta, alpha);
}

// The engine's product launched on the stream (asynchronous execution on),
// or recorded by a capturing graph into its result (unboxed::launch_into):
// the result (or the out= argument, resized here) exists before the kernel
// runs. Autotuning (which times candidates on the operands), determinism's
// tiling and verbose's per-call route stay at the call.
template <class MakeOut>
std::optional<at::Tensor> launched_product(
    const std::string& name, const char* op, MakeOut&& make_out,
    const at::Tensor& self, const at::Tensor& a, const at::Tensor& b,
    const at::Scalar& beta, const at::Scalar& alpha) {
  if ((!launch_async() && !capture::underway()) || flags::benchmark() ||
      flags::deterministic() || flags::verbose_level() > 0) {
    return std::nullopt;
  }
  std::optional<at::Tensor> out = unboxed::launch_into(
      name, std::forward<MakeOut>(make_out),
      [op, beta, alpha](const at::Tensor& o, T cself, T ca, T cb) {
        matmul::gemm(op, o, ca, cb, cself, beta, alpha);
      },
      self, a, b);
  if (out) observe::mark_path(observe::ExecutionPath::kNative);
  return out;
}

// addmm/baddbmm's `self`: launched only where it cannot fail on the worker
// (a's dtype, a's device, broadcastable to the result); any other runs at
// the call, which raises CPU's error.
bool self_fits(T self, T a, const std::vector<int64_t>& shape) {
  return !self.defined() || (self.scalar_type() == a.scalar_type() &&
                             self.device() == a.device() &&
                             at::is_expandable_to(self.sizes(), shape));
}

std::optional<at::Tensor> launched_product(const std::string& name,
                                           const char* op, T self, T a, T b,
                                           S beta, S alpha, bool batched) {
  const std::vector<int64_t> shape = checked_shape(a, b, batched);
  if (!self_fits(self, a, shape)) return std::nullopt;
  return launched_product(
      name, op, [&] { return at::empty(shape, a.options()); }, self, a, b, beta,
      alpha);
}

std::optional<at::Tensor> launched_product_out(const std::string& name,
                                               const char* op, at::Tensor& out,
                                               T self, T a, T b, S beta,
                                               S alpha, bool batched) {
  // The out= argument must be an ember tensor of a's dtype that overlaps no
  // operand; anything else keeps ATen's rules at the call.
  if (out.device() != a.device() || out.scalar_type() != a.scalar_type() ||
      out.storage().is_alias_of(a.storage()) ||
      out.storage().is_alias_of(b.storage()) ||
      (self.defined() && out.storage().is_alias_of(self.storage()))) {
    return std::nullopt;
  }
  const std::vector<int64_t> shape = checked_shape(a, b, batched);
  if (!self_fits(self, a, shape)) return std::nullopt;
  return launched_product(
      name, op,
      [&] {
        at::native::resize_output(out, shape);
        return out;
      },
      self, a, b, beta, alpha);
}

#define EMBER_LAUNCH_NAME(text)           \
  []() -> const std::string& {            \
    static const std::string name = text; \
    return name;                          \
  }()

// The out= default: the boxed CPU delegation every out= op takes.
template <class... Args>
at::Tensor& delegate_out(const c10::OperatorHandle& op, at::Tensor& out,
                         const Args&... args) {
  unboxed::boxed(op, args..., out);
  return out;
}

#define EMBER_OUT_OP(name)                                           \
  [] {                                                               \
    static const c10::OperatorHandle op =                            \
        c10::Dispatcher::singleton().findSchemaOrThrow(name, "out"); \
    return op;                                                       \
  }()

}  // namespace

at::Tensor mm(T a, T b) {
  if (auto fast = matmul::fast_linear({}, a, b, 0, 1)) return *std::move(fast);
  if (!matmul::engine_applies(a)) {
    return unboxed::functional<ops::mm, T, T>(a, b);
  }
  if (auto out = launched_product(EMBER_LAUNCH_NAME("aten::mm"), "mm", {}, a, b,
                                  0, 1, false)) {
    return *std::move(out);
  }
  return unboxed::custom<at::Tensor>(
      "aten::mm", unboxed::replayable([](T ca, T cb) {
        return product("mm", {}, ca, cb, 0, 1, false);
      }),
      a, b);
}

at::Tensor addmm(T self, T a, T b, S beta, S alpha) {
  if (auto fast = matmul::fast_linear(self, a, b, beta, alpha)) {
    return *std::move(fast);
  }
  if (!matmul::engine_applies(a)) {
    return unboxed::functional<ops::addmm, T, T, T, S, S>(self, a, b, beta,
                                                          alpha);
  }
  if (auto out = launched_product(EMBER_LAUNCH_NAME("aten::addmm"), "addmm",
                                  self, a, b, beta, alpha, false)) {
    return *std::move(out);
  }
  return unboxed::custom<at::Tensor>(
      "aten::addmm",
      unboxed::replayable([beta = beta, alpha = alpha](T cself, T ca, T cb) {
        return product("addmm", cself, ca, cb, beta, alpha, false);
      }),
      self, a, b);
}

at::Tensor bmm(T a, T b) {
  if (!matmul::engine_applies(a)) {
    return unboxed::functional<ops::bmm, T, T>(a, b);
  }
  if (auto out = launched_product(EMBER_LAUNCH_NAME("aten::bmm"), "bmm", {}, a,
                                  b, 0, 1, true)) {
    return *std::move(out);
  }
  return unboxed::custom<at::Tensor>(
      "aten::bmm", unboxed::replayable([](T ca, T cb) {
        return product("bmm", {}, ca, cb, 0, 1, true);
      }),
      a, b);
}

at::Tensor baddbmm(T self, T a, T b, S beta, S alpha) {
  if (!matmul::engine_applies(a)) {
    return unboxed::functional<ops::baddbmm, T, T, T, S, S>(self, a, b, beta,
                                                            alpha);
  }
  if (auto out = launched_product(EMBER_LAUNCH_NAME("aten::baddbmm"), "baddbmm",
                                  self, a, b, beta, alpha, true)) {
    return *std::move(out);
  }
  return unboxed::custom<at::Tensor>(
      "aten::baddbmm",
      unboxed::replayable([beta = beta, alpha = alpha](T cself, T ca, T cb) {
        return product("baddbmm", cself, ca, cb, beta, alpha, true);
      }),
      self, a, b);
}

at::Tensor& mm_out(T a, T b, at::Tensor& out) {
  note_storage_write(out);
  if (matmul::fast_linear_out(out, {}, a, b, 0, 1)) return out;
  if (!matmul::engine_applies(a)) {
    return delegate_out(EMBER_OUT_OP("aten::mm"), out, a, b);
  }
  if (launched_product_out(EMBER_LAUNCH_NAME("aten::mm.out"), "mm", out, {}, a,
                           b, 0, 1, false)) {
    return out;
  }
  return unboxed::custom_out("aten::mm.out",
                             unboxed::replayable([](at::Tensor& o, T ca, T cb) {
                               product_out("mm", o, {}, ca, cb, 0, 1, false);
                             }),
                             out, a, b);
}

at::Tensor& addmm_out(T self, T a, T b, S beta, S alpha, at::Tensor& out) {
  note_storage_write(out);
  if (matmul::fast_linear_out(out, self, a, b, beta, alpha)) return out;
  if (!matmul::engine_applies(a)) {
    return delegate_out(EMBER_OUT_OP("aten::addmm"), out, self, a, b, beta,
                        alpha);
  }
  if (launched_product_out(EMBER_LAUNCH_NAME("aten::addmm.out"), "addmm", out,
                           self, a, b, beta, alpha, false)) {
    return out;
  }
  return unboxed::custom_out(
      "aten::addmm.out",
      unboxed::replayable(
          [beta = beta, alpha = alpha](at::Tensor& o, T cself, T ca, T cb) {
            product_out("addmm", o, cself, ca, cb, beta, alpha, false);
          }),
      out, self, a, b);
}

at::Tensor& bmm_out(T a, T b, at::Tensor& out) {
  note_storage_write(out);
  if (!matmul::engine_applies(a)) {
    return delegate_out(EMBER_OUT_OP("aten::bmm"), out, a, b);
  }
  if (launched_product_out(EMBER_LAUNCH_NAME("aten::bmm.out"), "bmm", out, {},
                           a, b, 0, 1, true)) {
    return out;
  }
  return unboxed::custom_out("aten::bmm.out",
                             unboxed::replayable([](at::Tensor& o, T ca, T cb) {
                               product_out("bmm", o, {}, ca, cb, 0, 1, true);
                             }),
                             out, a, b);
}

at::Tensor& baddbmm_out(T self, T a, T b, S beta, S alpha, at::Tensor& out) {
  note_storage_write(out);
  if (!matmul::engine_applies(a)) {
    return delegate_out(EMBER_OUT_OP("aten::baddbmm"), out, self, a, b, beta,
                        alpha);
  }
  if (launched_product_out(EMBER_LAUNCH_NAME("aten::baddbmm.out"), "baddbmm",
                           out, self, a, b, beta, alpha, true)) {
    return out;
  }
  return unboxed::custom_out(
      "aten::baddbmm.out",
      unboxed::replayable(
          [beta = beta, alpha = alpha](at::Tensor& o, T cself, T ca, T cb) {
            product_out("baddbmm", o, cself, ca, cb, beta, alpha, true);
          }),
      out, self, a, b);
}

}  // namespace ember::kernels
