// Attention on ember. scaled_dot_product_attention asks fused_sdp_choice
// which kernel to use: ember makes CPU's choice (CPU flash
// attention when its constraints hold, else the math path; in inference,
// multi-query attention written as a broadcast takes the flash entry too,
// see broadcast_heads_on_ember_kernel). The flash entry
// point then runs ember's own kernel by default (attention/AttentionKernel.h)
// and CPU's under cpu_parity, determinism, dropout, or for what ember's
// kernel does not take (other dtypes, strided last dims).
#include <ATen/Context.h>
#include <ATen/ExpandUtils.h>
#include <ATen/SDPBackend.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/_fused_sdp_choice_native.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_ops.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>

#include <cmath>
#include <string>
#include <vector>

#include "flags/BackendFlags.h"
#include "graphs/GraphCapture.h"
#include "observe/ExecutionPath.h"
#include "ops/CpuAlias.h"
#include "ops/LaunchedOps.h"
#include "ops/UnboxedDelegation.h"
#include "ops/kernels/EmberKernels.h"
#include "ops/kernels/attention/AttentionKernel.h"

namespace ember::kernels {
namespace {

namespace attn = ember::kernels::attention;

bool unit_last_dim(const at::Tensor& t, at::ScalarType dtype) {
  return t.scalar_type() == dtype && t.dim() == 4 &&
         (t.stride(3) == 1 || t.size(3) == 1) && !t.is_conj() && !t.is_neg();
}

// An operand's memory: fp32, or bf16 (the kernel widens its rows as it
// reads them).
attn::Operand operand(const at::Tensor& t) {
  const bool fp32 = t.scalar_type() == at::kFloat;
  return {fp32 ? t.const_data_ptr<float>() : nullptr,
          fp32 ? nullptr : static_cast<const uint16_t*>(t.const_data_ptr()),
          t.stride(0), t.stride(1), t.stride(2)};
}

// The problem for ember's kernel, or nullopt when CPU's kernel must run.
std::optional<attn::Problem> plan(const at::Tensor& q, const at::Tensor& k,
                                  const at::Tensor& v, double dropout_p,
                                  bool is_causal,
                                  const std::optional<at::Tensor>& attn_mask,
                                  std::optional<double> scale) {
  // fp32, or bf16 computed in fp32 from the operands' exact fp32 values
  // (CPU's bf16 kernel also accumulates and normalises in fp32).
  const at::ScalarType dtype = q.scalar_type();
  if (flags::cpu_parity() || flags::deterministic() || dropout_p != 0.0 ||
      !attn::supported() || (dtype != at::kFloat && dtype != at::kBFloat16) ||
      !unit_last_dim(q, dtype) || !unit_last_dim(k, dtype) ||
      !unit_last_dim(v, dtype)) {
    return std::nullopt;
  }
  const int64_t batch = q.size(0), heads = q.size(1), kv_heads = k.size(1);
  // CPU's kernel raises for anything else (different head sizes included).
  // Fewer key/value heads than query heads, a divisor of them, is
  // grouped-query attention (sdpa's enable_gqa=True).
  if (k.size(0) != batch || v.size(0) != batch || kv_heads <= 0 ||
      heads % kv_heads != 0 || v.size(1) != kv_heads ||
      k.size(3) != q.size(3) || v.size(3) != q.size(3) ||
      v.size(2) != k.size(2)) {
    return std::nullopt;
  }
  attn::Problem p;
  p.batch = batch;
  p.heads = heads;
  p.kv_group = heads / kv_heads;
  p.q_len = q.size(2);
  p.kv_len = k.size(2);
  p.head_dim = q.size(3);
  p.v_dim = v.size(3);
  p.q = operand(q);
  p.k = operand(k);
  p.v = operand(v);
  if (attn_mask.has_value() && attn_mask->defined()) {
    const at::Tensor& mask = *attn_mask;
    if (mask.dim() > 4 || mask.device() != q.device()) return std::nullopt;
    const at::Tensor full = mask.expand({batch, heads, p.q_len, p.kv_len});
    if (!unit_last_dim(full, dtype) || p.kv_len == 1) return std::nullopt;
    p.mask = operand(full);
  }
  p.causal = is_causal;
  p.scale = static_cast<float>(
      scale.has_value() ? *scale
                        : 1.0 / std::sqrt(static_cast<double>(p.head_dim)));
  if (!attn::fits(p) || batch == 0 || heads == 0) return std::nullopt;
  return p;
}

// Runs ember's kernel writing `out` (rows of unit stride) and `lse`.
void forward_into(attn::Problem& p, const at::Tensor& out,
                  const at::Tensor& lse) {
  p.out = out.mutable_data_ptr<float>();
  p.out_batch_stride = out.stride(0);
  p.out_head_stride = out.stride(1);
  p.out_row_stride = out.stride(2);
  p.logsumexp = lse.mutable_data_ptr<float>();
  p.lse_batch_stride = lse.stride(0);
  p.lse_head_stride = lse.stride(1);
  p.lse_row_stride = lse.stride(2);
  attn::forward(p);
}

// ember's kernel launched on the stream: results allocated here in CPU's
// layouts (see flash_attention), the kernel run by the worker on the
// operands' CPU aliases. nullopt for an output layout the kernel cannot
// write directly. bf16 operands (no mask): the kernel writes an fp32
// result, rounded to bf16 into the output by ATen's copy, as CPU's bf16
// flash kernel rounds its output once.
std::optional<std::tuple<at::Tensor, at::Tensor>> launch_flash(
    const attn::Problem& problem, const at::Tensor& q, const at::Tensor& k,
    const at::Tensor& v, const std::optional<at::Tensor>& attn_mask) {
  const bool bf16 = q.scalar_type() == at::kBFloat16;
  at::Tensor out = at::empty_like(q);
  if (!bf16 && out.stride(3) != 1 && problem.v_dim != 1) return std::nullopt;
  const auto fp32 = q.options().dtype(at::kFloat);
  at::Tensor lse =
      at::empty({problem.batch, problem.q_len, problem.heads}, fp32)
          .transpose(1, 2);
  at::Tensor out32 = bf16 ? at::empty({problem.batch, problem.heads,
                                       problem.q_len, problem.v_dim},
                                      fp32)
                          : out;
  std::vector<at::Tensor> operands = {cpu_alias(q), cpu_alias(k), cpu_alias(v)};
  if (attn_mask.has_value() && attn_mask->defined()) {
    operands.push_back(cpu_alias(*attn_mask));
  }
  static const std::string name =
      "aten::_scaled_dot_product_flash_attention_for_cpu";
  observe::mark_path(observe::ExecutionPath::kNative,
                     bf16 ? "ember/attention-bf16" : "ember/attention");
  attn::Problem p = problem;
  p.bf16_probabilities = bf16;
  const bool queued = launch_on_device(
      q.device().index(), name.c_str(),
      [p, bf16, operands = std::move(operands), out_cpu = cpu_alias(out),
       out32_cpu = cpu_alias(out32), lse_cpu = cpu_alias(lse)]() mutable {
        forward_into(p, out32_cpu, lse_cpu);
        if (bf16) run_split_free([&] { out_cpu.copy_(out32_cpu); });
      },
      out.numel());
  if (queued) count_launch(name);
  return std::make_tuple(std::move(out), std::move(lse));
}

// bf16 operands at the call: ember's fp32 kernel reading Q, K and V as
// they are (widened row by row) and an fp32 copy of the mask, the
// unnormalised probabilities rounded to bf16 before P V and the output
// rounded to bf16 once, as CPU's bf16 flash kernel rounds them; the
// logsumexp stays fp32, as CPU's. A decode step's attention ran ~4x slower
// in CPU's kernel.
std::tuple<at::Tensor, at::Tensor> bf16_attention(
    const attn::Problem& problem, const at::Tensor& query,
    const at::Tensor& key, const at::Tensor& value,
    const std::optional<at::Tensor>& attn_mask) {
  std::optional<at::Tensor> mask;
  if (attn_mask.has_value() && attn_mask->defined()) {
    mask = attn_mask->expand(
        {problem.batch, problem.heads, problem.q_len, problem.kv_len});
  }
  auto result = unboxed::custom<std::tuple<at::Tensor, at::Tensor>>(
      "aten::_scaled_dot_product_flash_attention_for_cpu",
      unboxed::replayable([problem](const at::Tensor& q, const at::Tensor& k,
                                    const at::Tensor& v,
                                    const std::optional<at::Tensor>& m) {
        attn::Problem p = problem;
        p.bf16_probabilities = true;
        p.q = operand(q);
        p.k = operand(k);
        p.v = operand(v);
        at::Tensor m32;
        if (m.has_value()) {
          m32 = m->to(at::kFloat);
          p.mask = operand(m32);
        }
        const at::Tensor out32 = at::empty({p.batch, p.heads, p.q_len, p.v_dim},
                                           q.options().dtype(at::kFloat));
        const at::Tensor lse =
            at::empty({p.batch, p.q_len, p.heads}, out32.options())
                .transpose(1, 2);
        forward_into(p, out32, lse);
        // CPU's layout of the output: like the query.
        at::Tensor out = at::empty_like(q);
        out.copy_(out32);
        return std::make_tuple(out, lse);
      }),
      query, key, value, mask);
  observe::mark_path(observe::ExecutionPath::kNative, "ember/attention-bf16");
  return result;
}

// Multi-query attention written as a broadcast (Falcon: one key/value head
// beside the query's, no enable_gqa): CPU's flash kernel refuses the
// differing head counts, so CPU takes the math path, a dozen small ops
// that each drained the stream's queue in a decode step. ember's kernel
// computes the same attention (its grouped-query mapping sends every query
// head to key/value head 0, which is what the broadcast means), so in
// inference, outside cpu_parity and where the user allows the flash
// backend, the flash entry point takes it. Training keeps the math path
// (CPU's flash backward takes no broadcast heads).
bool broadcast_heads_on_ember_kernel(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const std::optional<at::Tensor>& attn_mask, double dropout_p,
    bool is_causal, std::optional<double> scale, bool enable_gqa) {
  if (enable_gqa || query.dim() != 4 || key.dim() != 4 || value.dim() != 4 ||
      query.size(1) <= 1 || key.size(1) != 1 || value.size(1) != 1 ||
      !at::globalContext().userEnabledFlashSDP() || !query.is_privateuseone()) {
    return false;
  }
  const auto needs_grad = [](const at::Tensor& t) { return t.requires_grad(); };
  if (at::GradMode::is_enabled() &&
      (needs_grad(query) || needs_grad(key) || needs_grad(value) ||
       (attn_mask.has_value() && attn_mask->defined() &&
        needs_grad(*attn_mask)))) {
    return false;
  }
  const bool bool_mask = attn_mask.has_value() && attn_mask->defined() &&
                         attn_mask->scalar_type() == at::kBool;
  if (!bool_mask) {
    return plan(query, key, value, dropout_p, is_causal, attn_mask, scale)
        .has_value();
  }
  // The choice sees the caller's boolean mask; the flash entry gets it
  // converted to a contiguous mask of the query's dtype (0 / -inf), which
  // plan() takes where it expands with unit stride along the keys.
  const at::Tensor& mask = *attn_mask;
  const int64_t kv_len = key.size(2);
  return mask.dim() >= 1 && mask.dim() <= 4 &&
         mask.device() == query.device() && kv_len > 1 &&
         mask.size(-1) == kv_len &&
         at::is_expandable_to(mask.sizes(), {query.size(0), query.size(1),
                                             query.size(2), kv_len}) &&
         plan(query, key, value, dropout_p, is_causal, std::nullopt, scale)
             .has_value();
}

}  // namespace

int64_t fused_sdp_choice(const at::Tensor& query, const at::Tensor& key,
                         const at::Tensor& value,
                         const std::optional<at::Tensor>& attn_mask,
                         double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa) {
  // CPU's selection reads only metadata (shapes, strides, dtypes) and the
  // global sdp flags, so it applies to ember tensors as they are.
  const int64_t choice = at::native::_fused_sdp_choice_cpp(
      query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa);
  constexpr auto kMath = static_cast<int64_t>(at::SDPBackend::math);
  constexpr auto kFlash = static_cast<int64_t>(at::SDPBackend::flash_attention);
  if (choice == kMath &&
      broadcast_heads_on_ember_kernel(query, key, value, attn_mask, dropout_p,
                                      is_causal, scale, enable_gqa)) {
    return kFlash;
  }
  return choice;
}

std::tuple<at::Tensor, at::Tensor> flash_attention(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    double dropout_p, bool is_causal,
    const std::optional<at::Tensor>& attn_mask, std::optional<double> scale) {
  using Op = at::_ops::_scaled_dot_product_flash_attention_for_cpu;
  std::optional<attn::Problem> problem =
      plan(query, key, value, dropout_p, is_causal, attn_mask, scale);
  if (!problem) {
    return unboxed::functional<
        Op, const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
        bool, const std::optional<at::Tensor>&, std::optional<double>>(
        query, key, value, dropout_p, is_causal, attn_mask, scale);
  }
  const bool launchable = launch_async() && query.device() == key.device() &&
                          query.device() == value.device();
  const bool has_mask = attn_mask.has_value() && attn_mask->defined();
  if (query.scalar_type() == at::kBFloat16 && (has_mask || !launchable)) {
    return bf16_attention(*problem, query, key, value, attn_mask);
  }
  if (launchable) {
    if (auto launched = launch_flash(*problem, query, key, value, attn_mask)) {
      return *std::move(launched);
    }
  }
  // A graph replays the kernel: it keeps the key, value and mask memory
  // the problem points into (the query comes as the kernel's argument).
  std::vector<at::Tensor> held;
  if (capture::underway()) [[unlikely]] {
    held = {cpu_alias(key), cpu_alias(value)};
    if (attn_mask.has_value() && attn_mask->defined()) {
      held.push_back(cpu_alias(*attn_mask));
    }
  }
  auto result = unboxed::custom<std::tuple<at::Tensor, at::Tensor>>(
      "aten::_scaled_dot_product_flash_attention_for_cpu",
      unboxed::replayable([problem = *problem,
                           held = std::move(held)](const at::Tensor& q) {
        attn::Problem p = problem;  // the kernel fills in its output
        // CPU's layouts: the output is laid out like the query (empty_like),
        // the logsumexp is a [batch, row, head] buffer seen as [batch, head,
        // row].
        const at::Tensor out = at::empty_like(q);
        const at::Tensor lse =
            at::empty({p.batch, p.q_len, p.heads}, q.options()).transpose(1, 2);
        // The kernel writes rows of unit stride; a layout empty_like picks
        // otherwise (channels-last-like strides of a non-dense query) gets
        // the result copied in.
        const bool direct = out.stride(3) == 1 || p.v_dim == 1;
        const at::Tensor target =
            direct ? out : at::empty(out.sizes(), q.options());
        forward_into(p, target, lse);
        if (!direct) out.copy_(target);
        return std::make_tuple(out, lse);
      }),
      query);
  observe::mark_path(observe::ExecutionPath::kNative, "ember/attention");
  return result;
}

}  // namespace ember::kernels
