#include "ops/kernels/matmul/FastGemm.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/relu.h>

#include "ember/runtime/cpu_features.h"
#include "flags/BackendFlags.h"
#include "graphs/GraphCapture.h"
#include "observe/ExecutionPath.h"
#include "ops/CpuAlias.h"
#include "ops/DeviceScope.h"
#include "ops/LaunchedOps.h"
#include "ops/UnboxedDelegation.h"
#include "ops/kernels/OneDnnSupport.h"
#include "ops/kernels/elementwise/VectorMath.h"
#include "ops/kernels/matmul/MklPackedGemm.h"
#include "ops/kernels/matmul/PackedWeights.h"
#include "ops/kernels/matmul/SkinnyGemm.h"

namespace ember::matmul {
namespace {

using flags::Fp32Precision;

bool is_ember(const at::Tensor& t, c10::Device device, at::ScalarType dtype) {
  return t.device() == device && t.scalar_type() == dtype;
}

// bf16 operands run oneDNN's bf16 matmul where the CPU has AVX512_BF16 (as
// CPU's own bf16 GEMMs do on such CPUs); elsewhere CPU's kernel.
bool native_bf16_supported() {
  static const bool supported =
      runtime::cpu_features().avx512_bf16 && skinny_bf16_supported();
  return supported;
}

// A bias the kernels add per column: N contiguous elements of the operands'
// dtype ([N] or [1, N]).
std::optional<at::Tensor> row_bias(const at::Tensor& self, int64_t n,
                                   c10::Device device, at::ScalarType dtype) {
  if (!is_ember(self, device, dtype) || self.dim() == 0 || self.size(-1) != n ||
      self.stride(-1) != 1 || self.numel() != n || self.dim() > 2) {
    return std::nullopt;
  }
  return self.dim() == 1 ? self : self.view({n});
}

// oneDNN's post-op for an epilogue: (attr, algorithm) of _linear_pointwise.
std::pair<const char*, const char*> onednn_post_op(Epilogue epilogue) {
  switch (epilogue) {
    case Epilogue::kRelu:
      return {"relu", ""};
    case Epilogue::kGeluErf:
      return {"gelu", "none"};
    case Epilogue::kGeluTanh:
      return {"gelu", "tanh"};
    case Epilogue::kNone:
      break;
  }
  return {"none", ""};
}

at::Tensor onednn_linear(const at::Tensor& a, const PackedWeight& weight,
                         const std::optional<at::Tensor>& bias,
                         Epilogue epilogue = Epilogue::kNone) {
  const auto [attr, algorithm] = onednn_post_op(epilogue);
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow(
          "mkldnn::_linear_pointwise", "");
  torch::jit::Stack stack;
  stack.reserve(6);
  stack.emplace_back(a);
  stack.emplace_back(weight.onednn);
  stack.emplace_back(bias);
  stack.emplace_back(attr);
  stack.emplace_back(c10::List<std::optional<at::Scalar>>());
  stack.emplace_back(*algorithm != '\0' ? c10::IValue(algorithm)
                                        : c10::IValue());
  op.callBoxed(stack);
  return stack.back().toTensor();
}

// The route a call takes, decided before anything runs.
struct Plan {
  std::optional<at::Tensor> bias;
  int64_t rows = 0;  // of the result (a's rows)
  int64_t cols = 0;  // of the result (b's columns)
  std::shared_ptr<const PackedWeight> packed;
  bool bf16 = false;  // fp32 operands computed in bf16 ("medium")
  // Set when a graph captures the call: a replay that finds the weight
  // written since (an optimizer step between replays) computes from the
  // weight's memory instead of the pack taken at capture.
  capture::WatchedWeight watched;
};

// bias + a @ weight (+ activation) by ATen's CPU kernels on CPU tensors: the
// route of a replayed call whose pack went stale.
at::Tensor unpacked_linear(const at::Tensor& a, const at::Tensor& weight_cpu,
                           const std::optional<at::Tensor>& bias,
                           Epilogue epilogue) {
  at::Tensor out =
      bias ? at::addmm(*bias, a, weight_cpu) : at::mm(a, weight_cpu);
  switch (epilogue) {
    case Epilogue::kRelu:
      return out.relu_();
    case Epilogue::kGeluErf:
      return at::gelu(out);
    case Epilogue::kGeluTanh:
      return at::gelu(out, "tanh");
    case Epilogue::kNone:
      break;
  }
  return out;
}

// MKL's packed route (Intel CPUs) for an fp32 A and B it can address: B
// with a unit stride, A rows at least K apart.
bool mkl_takes(const at::Tensor& a, const at::Tensor& b) {
  return mkl_packed_preferred() && a.stride(0) >= a.size(1) &&
         mkl_can_pack(b.size(0), b.size(1), b.stride(0), b.stride(1));
}

// The activation of an epilogue, in place on C (m x n, row stride ldc) on
// the calling thread's CPU kernels.
void apply_epilogue(float* c, int64_t m, int64_t n, int64_t ldc,
                    Epilogue epilogue) {
  if (epilogue == Epilogue::kNone) return;
  at::Tensor out =
      at::from_blob(c, {m, n}, {ldc, 1}, at::TensorOptions().dtype(at::kFloat));
  switch (epilogue) {
    case Epilogue::kRelu:
      out.relu_();
      break;
    case Epilogue::kGeluErf:
      at::gelu_(out);  // in place: no temporary, no second pass to copy back
      break;
    case Epilogue::kGeluTanh:
      if (kernels::vector_math_supported()) {
        // One call over a contiguous product: the kernel splits it between
        // the threads (a row alone, n floats, stays on one).
        if (ldc == n) {
          kernels::gelu_tanh_f32(c, c, m * n);
        } else {
          for (int64_t row = 0; row < m; ++row) {
            kernels::gelu_tanh_f32(c + row * ldc, c + row * ldc, n);
          }
        }
      } else {
        at::gelu_(out, "tanh");
      }
      break;
    case Epilogue::kNone:
      break;
  }
}

std::optional<Plan> plan(const at::Tensor& self, const at::Tensor& a,
                         const at::Tensor& b, const at::Scalar& beta,
                         const at::Scalar& alpha) {
  // benchmark=True leaves the route on: a packed weight beats both libraries
  // the autotuner times (they run on the unpacked operand).
  if (flags::cpu_parity() || flags::deterministic() ||
      flags::blas_library() != flags::BlasLibrary::kDefault) {
    return std::nullopt;
  }
  // A graph capturing a training step (the weight requires grad) reads
  // the weight from its memory: a graphed optimizer step writes it, and a
  // pack is a copy taken at capture time. Inference graphs keep the packed
  // kernels (weights written between replays are checked at each replay).
  if (capture::underway() && at::GradMode::is_enabled() && b.requires_grad()) {
    return std::nullopt;
  }
  const c10::Device device = a.device();
  const at::ScalarType dtype = a.scalar_type();
  if (device.type() != c10::DeviceType::PrivateUse1 ||
      (dtype != at::kFloat && dtype != at::kBFloat16) ||
      !is_ember(a, device, dtype) || !is_ember(b, device, dtype) ||
      a.dim() != 2 || b.dim() != 2 || a.size(1) != b.size(0) ||
      a.stride(1) != 1 || a.size(0) == 0 || b.numel() == 0 ||
      alpha.toDouble() != 1.0) {
    return std::nullopt;
  }
  Plan plan;
  plan.rows = a.size(0);
  plan.cols = b.size(1);
  if (self.defined() && beta.toDouble() != 0.0) {
    plan.bias = row_bias(self, b.size(1), device, dtype);
    if (!plan.bias || beta.toDouble() != 1.0) return std::nullopt;
  }
  if (dtype == at::kBFloat16) {
    // bf16 operands: the skinny kernel on bf16 panels (CPU's bf16 GEMV
    // streams ~3x slower), or oneDNN's bf16 matmul on a bf16 pack (CPU's
    // bf16 GEMM re-lays B on every call).
    if (!native_bf16_supported()) return std::nullopt;
    plan.packed =
        packed_weight(b, a.size(0) <= kSkinnyMaxRows ? PackKind::kPanelsBf16
                                                     : PackKind::kOneDnnBf16);
  } else if (a.size(0) <= kSkinnyMaxRows) {
    const Fp32Precision precision = flags::matmul_fp32_precision();
    // "medium" resolves to ieee without bf16 arithmetic, but a skinny GEMM
    // still takes bf16 panels there (flags::matmul_medium_from_torch).
    plan.bf16 =
        precision == Fp32Precision::kBf16 || flags::matmul_medium_from_torch();
    const bool supported =
        plan.bf16 ? skinny_bf16_supported()
                  : precision == Fp32Precision::kIeee && skinny_f32_supported();
    if (!supported) return std::nullopt;
    plan.packed = packed_weight(
        b, plan.bf16 ? PackKind::kPanelsBf16 : PackKind::kPanelsF32);
  } else if (flags::matmul_fp32_precision() == Fp32Precision::kIeee) {
    // Taller A: MKL's packed GEMM on Intel CPUs, elsewhere ember's panel
    // kernel (faster than oneDNN's packed matmul on every BERT/GPT-2 linear
    // measured on a Zen 4 host: SkinnyGemm.h), oneDNN without AVX-512.
    plan.packed =
        packed_weight(b, mkl_takes(a, b)          ? PackKind::kMklF32
                         : skinny_f32_supported() ? PackKind::kPanelsF32
                                                  : PackKind::kOneDnn);
  } else if (flags::matmul_fp32_precision() == Fp32Precision::kBf16 &&
             kernels::onednn_bf16_supported()) {
    plan.packed = packed_weight(b, PackKind::kOneDnnBf16);
  }
  if (!plan.packed) return std::nullopt;
  plan.watched = capture::WatchedWeight::of(b);
  return plan;
}

// The route name verbose output and the execution-path record show.
const char* direct_route(const Plan& plan, Epilogue epilogue) {
  if (plan.packed->kind == PackKind::kMklF32) {
    return epilogue != Epilogue::kNone ? "mkl/packed+epilogue" : "mkl/packed";
  }
  if (plan.bf16 || plan.packed->kind == PackKind::kPanelsBf16) {
    return "skinny/bf16-packed";
  }
  if (plan.rows <= kSkinnyMaxRows) return "skinny/f32-packed";
  return epilogue != Epilogue::kNone ? "panels/packed+epilogue"
                                     : "panels/packed";
}

// What the direct kernels (the skinny kernel, MKL's packed GEMM) read and
// write: raw rows of unit stride. A and out are `rows` x K and `rows` x N
// (N, K: the pack's), row strides lda and ldc; `bias` N elements or null.
struct DirectOperands {
  const void* a = nullptr;
  int64_t lda = 0;
  int64_t rows = 0;
  at::ScalarType dtype = at::kFloat;
  const void* bias = nullptr;
  void* out = nullptr;
  int64_t ldc = 0;

  static DirectOperands of(const at::Tensor& a,
                           const std::optional<at::Tensor>& bias,
                           const at::Tensor& out) {
    return {a.const_data_ptr(),
            a.stride(0),
            a.size(0),
            a.scalar_type(),
            bias ? bias->const_data_ptr() : nullptr,
            out.mutable_data_ptr(),
            out.stride(0)};
  }
};

// A CPU tensor over `rows` x `cols` elements of `dtype` at `data`.
at::Tensor host_rows(const void* data, int64_t rows, int64_t cols, int64_t ld,
                     at::ScalarType dtype) {
  return at::from_blob(const_cast<void*>(data), {rows, cols}, {ld, 1},
                       at::TensorOptions().dtype(dtype));
}

// The skinny kernel or MKL's packed GEMM, writing straight into the result.
void run_direct(const Plan& plan, const DirectOperands& op,
                Epilogue epilogue = Epilogue::kNone) {
  const int64_t n = plan.packed->n;
  if (plan.watched.written_since()) [[unlikely]] {
    const auto bias = op.bias == nullptr
                          ? std::nullopt
                          : std::optional<at::Tensor>(
                                host_rows(op.bias, 1, n, n, op.dtype).view(n));
    host_rows(op.out, op.rows, n, op.ldc, op.dtype)
        .copy_(unpacked_linear(
            host_rows(op.a, op.rows, plan.packed->k, op.lda, op.dtype),
            plan.watched.weight_cpu, bias, epilogue));
    return;
  }
  if (plan.packed->kind == PackKind::kMklF32) {
    float* c = static_cast<float*>(op.out);
    mkl_packed_gemm_f32(static_cast<const float*>(op.a), op.lda, op.rows,
                        plan.packed->k, n, plan.packed->panels.get(),
                        static_cast<const float*>(op.bias), c, op.ldc);
    apply_epilogue(c, op.rows, n, op.ldc, epilogue);
  } else if (op.dtype == at::kBFloat16) {
    skinny_gemm_bf16(static_cast<const uint16_t*>(op.a), op.lda, op.rows,
                     plan.packed->bf16(), static_cast<const uint16_t*>(op.bias),
                     static_cast<uint16_t*>(op.out), op.ldc);
  } else if (plan.bf16) {
    skinny_gemm_bf16(static_cast<const float*>(op.a), op.lda, op.rows,
                     plan.packed->bf16(), static_cast<const float*>(op.bias),
                     static_cast<float*>(op.out), op.ldc);
  } else {
    float* c = static_cast<float*>(op.out);
    skinny_gemm_f32(static_cast<const float*>(op.a), op.lda, op.rows,
                    plan.packed->f32(), static_cast<const float*>(op.bias), c,
                    op.ldc);
    apply_epilogue(c, op.rows, n, op.ldc, epilogue);
  }
  observe::mark_path(observe::ExecutionPath::kNative,
                     direct_route(plan, epilogue));
}

// bias + a @ the packed weight (+ epilogue) by oneDNN on CPU tensors, as a
// fresh tensor (oneDNN's packed matmul allocates its result).
at::Tensor onednn_product(const Plan& plan, Epilogue epilogue,
                          const at::Tensor& a,
                          const std::optional<at::Tensor>& bias) {
  if (plan.watched.written_since()) [[unlikely]] {
    return unpacked_linear(a, plan.watched.weight_cpu, bias, epilogue);
  }
  // fp32 operands on a bf16 pack: "medium" precision.
  const bool medium = plan.packed->kind == PackKind::kOneDnnBf16 &&
                      a.scalar_type() == at::kFloat;
  // (fp32 reaches oneDNN only without AVX-512, where ember has no tanh-GELU
  // kernel: oneDNN's post-op is the one rounding there.)
  if (!medium) return onednn_linear(a, *plan.packed, bias, epilogue);
  // "medium": bf16 operands, fp32 accumulation; the result comes back in
  // bf16 (as ATen's bf16 GEMM gives it) and the bias is added in fp32.
  at::Tensor result =
      onednn_linear(a.to(at::kBFloat16), *plan.packed, std::nullopt)
          .to(at::kFloat);
  if (bias) result.add_(*bias);
  return result;
}

const std::string& onednn_launch_name() {
  static const std::string name = "aten::addmm (onednn)";
  return name;
}
const std::string& direct_launch_name(const Plan& plan) {
  static const std::string skinny = "aten::addmm (skinny)";
  static const std::string panels = "aten::addmm (panels)";
  static const std::string mkl = "aten::addmm (mkl)";
  if (plan.packed->kind == PackKind::kMklF32) return mkl;
  return plan.rows <= kSkinnyMaxRows ? skinny : panels;
}

// Launched, the product is copied into the result allocated at the call.
void onednn_product_into(const Plan& plan, Epilogue epilogue,
                         const at::Tensor& out, const at::Tensor& a,
                         const std::optional<at::Tensor>& bias) {
  const_cast<at::Tensor&>(out).copy_(onednn_product(plan, epilogue, a, bias));
}

void mark_onednn_path(const Plan& plan, Epilogue epilogue) {
  observe::mark_path(observe::ExecutionPath::kNative,
                     plan.packed->kind == PackKind::kOneDnnBf16
                         ? "onednn/bf16-packed"
                     : epilogue != Epilogue::kNone ? "onednn/packed+epilogue"
                                                   : "onednn/packed");
}

at::Tensor run_onednn(const Plan& plan, const at::Tensor& a,
                      Epilogue epilogue = Epilogue::kNone) {
  // At the call, the synchronous form below returns oneDNN's own result
  // (the launched one copies it into a preallocated result).
  std::optional<at::Tensor> out;
  if (!runs_at_call(a.device().index(), a.size(0) * plan.cols)) {
    out = unboxed::launch_into(
        onednn_launch_name(),
        [&] {
          return at::empty({a.size(0), plan.cols}, a.options());
        },
        [plan, epilogue](const at::Tensor& o, const at::Tensor& ca,
                         const std::optional<at::Tensor>& cbias) {
          onednn_product_into(plan, epilogue, o, ca, cbias);
        },
        a, plan.bias);
  }
  if (!out) {
    out = unboxed::custom<at::Tensor>(
        "aten::addmm",
        unboxed::replayable(
            [plan, epilogue](const at::Tensor& ca,
                             const std::optional<at::Tensor>& cbias) {
              return onednn_product(plan, epilogue, ca, cbias);
            }),
        a, plan.bias);
  }
  mark_onednn_path(plan, epilogue);
  return *std::move(out);
}

// A skinny GEMM whose pack takes longer to stream than a sleeping worker
// takes to wake (1 MiB: ~30 us at this kind of machine's bandwidth):
// queued whether or not the worker sleeps (runs_at_call).
bool streams_long(const Plan& plan) {
  constexpr size_t kLongStreamBytes = size_t{1} << 20;
  return plan.rows <= kSkinnyMaxRows && plan.packed->bytes >= kLongStreamBytes;
}

// The skinny kernel or MKL's, launched where asynchronous execution is on
// (or recorded into its result by a capturing graph).
template <class MakeOut>
std::optional<at::Tensor> launch_direct(const Plan& plan, const at::Tensor& a,
                                        MakeOut&& make_out,
                                        Epilogue epilogue = Epilogue::kNone) {
  const std::string& name = direct_launch_name(plan);
  if (!launch_async() || flags::verbose_level() > 0) {
    // A graph capturing with asynchronous execution off records the kernel
    // (launch_into's synchronous form); otherwise nothing (nullopt).
    return unboxed::launch_into(
        name, std::forward<MakeOut>(make_out),
        [plan, epilogue](const at::Tensor& o, const at::Tensor& ca,
                         const std::optional<at::Tensor>& cbias) {
          run_direct(plan, DirectOperands::of(ca, cbias, o), epilogue);
        },
        a, plan.bias);
  }
  // The kernels read raw rows: the queued work keeps the operands' storages
  // and where their rows are (no CPU aliases; a later change of a tensor's
  // metadata on the host does not reach it).
  at::Tensor out = make_out();
  unboxed::note_result_writes(out);
  struct Queued {
    Plan plan;
    Epilogue epilogue;
    DirectOperands operands;
    c10::Storage a, bias, out;
  } queued{plan,
           epilogue,
           DirectOperands::of(a, plan.bias, out),
           a.storage(),
           plan.bias ? plan.bias->storage() : c10::Storage(),
           out.storage()};
  if (launch_on_device(
          a.device().index(), name.c_str(),
          [q = std::move(queued)] {
            run_direct(q.plan, q.operands, q.epilogue);
          },
          out.numel(), streams_long(plan))) {
    count_launch(name);
  }
  return out;
}

// A direct kernel's result: launched, or run at the call.
at::Tensor run_direct_result(const Plan& plan, const at::Tensor& a,
                             Epilogue epilogue = Epilogue::kNone) {
  const auto make_out = [&] {
    return at::empty({a.size(0), plan.cols}, a.options());
  };
  observe::mark_path(observe::ExecutionPath::kNative,
                     direct_route(plan, epilogue));
  if (auto launched = launch_direct(plan, a, make_out, epilogue)) {
    return *std::move(launched);
  }
  // Synchronous, and no graph capturing (launch_direct records a capture).
  const observe::CurrentOpScope current_op(direct_launch_name(plan).c_str());
  at::Tensor out;
  run_on_device(a.device().index(), [&] {
    out = make_out();
    run_direct(plan, DirectOperands::of(a, plan.bias, out), epilogue);
  });
  return out;
}

}  // namespace

const char* tall_gemm_library() {
  return mkl_packed_preferred()   ? "mkl"
         : skinny_f32_supported() ? "panels"
                                  : "onednn";
}

std::optional<at::Tensor> fast_linear_epilogue(const at::Tensor& bias,
                                               const at::Tensor& a,
                                               const at::Tensor& b,
                                               Epilogue epilogue) {
  const std::optional<Plan> route = plan(bias, a, b, 1, 1);
  // MKL's route and fp32 panels apply the activation to the product in
  // place, with the kernels the unfused ops use.
  if (route &&
      (route->packed->kind == PackKind::kMklF32 ||
       (route->packed->kind == PackKind::kPanelsF32 && !route->bf16))) {
    return run_direct_result(*route, a, epilogue);
  }
  // Epilogues fuse where the operands' dtype is the pack's (not "medium").
  const bool same_dtype = route && route->packed->onednn.defined() &&
                          (route->packed->kind == PackKind::kOneDnn) ==
                              (a.scalar_type() == at::kFloat) &&
                          (route->packed->kind == PackKind::kOneDnnBf16) ==
                              (a.scalar_type() == at::kBFloat16);
  if (!same_dtype) return std::nullopt;
  return run_onednn(*route, a, epilogue);
}

std::optional<at::Tensor> fast_linear(const at::Tensor& self,
                                      const at::Tensor& a, const at::Tensor& b,
                                      const at::Scalar& beta,
                                      const at::Scalar& alpha) {
  const std::optional<Plan> route = plan(self, a, b, beta, alpha);
  if (!route) return std::nullopt;
  if (route->packed->onednn.defined()) return run_onednn(*route, a);
  return run_direct_result(*route, a);
}

bool fast_linear_out(const at::Tensor& out, const at::Tensor& self,
                     const at::Tensor& a, const at::Tensor& b,
                     const at::Scalar& beta, const at::Scalar& alpha) {
  // Only an out= of the final shape, rows of unit stride, that overlaps no
  // input (ATen's resize and aliasing rules stay with the general route).
  if (!out.defined() || out.dim() != 2 || a.dim() != 2 || b.dim() != 2 ||
      out.size(0) != a.size(0) || out.size(1) != b.size(1) ||
      out.stride(1) != 1 || (out.size(0) > 1 && out.stride(0) < out.size(1)) ||
      out.device() != a.device() || out.scalar_type() != a.scalar_type() ||
      out.storage().is_alias_of(a.storage()) ||
      out.storage().is_alias_of(b.storage()) ||
      (self.defined() && out.storage().is_alias_of(self.storage()))) {
    return false;
  }
  // While a graph captures, launch_into records the packed kernel into `out`
  // (its arguments, `a` and the plan's bias, are ember tensors), so the
  // fallbacks below run only outside a capture.
  const std::optional<Plan> route = plan(self, a, b, beta, alpha);
  if (!route) return false;
  const c10::DeviceIndex device = a.device().index();
  if (route->packed->onednn.defined()) {
    const Plan& plan = *route;
    const bool launched =
        unboxed::launch_into(
            onednn_launch_name(), [&] { return out; },
            [plan](const at::Tensor& o, const at::Tensor& ca,
                   const std::optional<at::Tensor>& cbias) {
              onednn_product_into(plan, Epilogue::kNone, o, ca, cbias);
            },
            a, plan.bias)
            .has_value();
    if (launched) {
      mark_onednn_path(plan, Epilogue::kNone);
    } else {
      const observe::CurrentOpScope current_op(onednn_launch_name().c_str());
      const at::Tensor result = run_onednn(plan, a);
      run_on_device(device,
                    [&] { const_cast<at::Tensor&>(out).copy_(result); });
    }
  } else if (!launch_direct(*route, a, [&] { return out; })) {
    const observe::CurrentOpScope current_op(
        direct_launch_name(*route).c_str());
    run_on_device(device, [&] {
      run_direct(*route, DirectOperands::of(a, route->bias, out));
    });
  }
  return true;
}

}  // namespace ember::matmul
