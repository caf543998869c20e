// ember's scaled-dot-product attention forward over fp32 (the default for
// aten::_scaled_dot_product_flash_attention_for_cpu on ember).
//
// Work is split over (batch, head). With 16 or more query rows, K^T and V
// are packed once per head into the panel layout of ember's skinny GEMM, and
// each block of 16 query rows does S = scale * Q K^T + mask over the keys it
// can see (causal blocks stop at their last row), a row softmax with ember's
// vector exp, and O = P V. With fewer rows (decode), one dot product per key
// and one scaled row of V per key, straight from the operands. CPU's flash
// kernel tiles the keys too and rescales as it goes (online softmax) with small
// MKL GEMMs per tile; at the sequence lengths of the suite's models a whole row
// of keys fits in cache, so rows are done in one pass.
#pragma once

#include <cstdint>

namespace ember::kernels::attention {

// Strides are in elements: [batch, head, row]; the last dimension has
// unit stride. A broadcast dimension has stride 0. The values are fp32
// (`data`) or bf16 (`bf16`, raw bits; `data` null): a bf16 operand's rows
// of one (batch, head) are widened to fp32 in the thread's scratch as the
// kernel reaches them (exactly: every bf16 is an fp32), so the arithmetic
// is the fp32 kernel's and no fp32 copy of a whole KV cache is made.
struct Operand {
  const float* data = nullptr;
  const uint16_t* bf16 = nullptr;
  int64_t batch_stride = 0, head_stride = 0, row_stride = 0;
};

struct Problem {
  int64_t batch = 0, heads = 0, q_len = 0, kv_len = 0, head_dim = 0, v_dim = 0;
  // Query heads per key/value head (grouped-query attention): query head h
  // reads key and value head h / kv_group, as CPU's kernel does.
  int64_t kv_group = 1;
  Operand q, k, v;  // fp32 or bf16
  Operand mask;  // additive, fp32, [q_len, kv_len] per (batch, head); optional
  bool causal = false;  // row i sees keys j <= i (top-left aligned)
  // Round the unnormalised probabilities to bf16 before P V, as CPU's bf16
  // flash kernel does (its P V is a bf16 GEMM); the row sums stay fp32.
  bool bf16_probabilities = false;
  float scale = 1.0f;
  float* out = nullptr;  // [batch, head, row] strides below, unit last
  int64_t out_batch_stride = 0, out_head_stride = 0, out_row_stride = 0;
  float* logsumexp = nullptr;  // one per row
  int64_t lse_batch_stride = 0, lse_head_stride = 0, lse_row_stride = 0;
};

// Whether the kernel can run here (AVX-512F, or AVX2 + FMA).
bool supported();

// Sizes the kernel takes.
bool fits(const Problem& p);

void forward(const Problem& p);

}  // namespace ember::kernels::attention
