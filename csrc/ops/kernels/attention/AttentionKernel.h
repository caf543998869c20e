// ember's scaled-dot-product attention forward over fp32 (the default for
// aten::_scaled_dot_product_flash_attention_for_cpu on ember).
//
// Work is split over (batch, head, block of query rows); each block does
// S = scale * Q K^T + mask over the key columns it can see (causal blocks
// stop at their last row), a row softmax with ember's vector exp, and
// O = P V, both products by the BLAS PyTorch itself links (MKL's sgemm,
// single-threaded inside each block). CPU's flash kernel tiles the keys too
// and rescales as it goes (online softmax), with small GEMMs per tile; at
// the sequence lengths of the suite's models a whole row of keys fits in
// cache, so the rows are done in one pass with larger GEMMs.
#pragma once

#include <cstdint>

namespace ember::kernels::attention {

// Strides are in elements: [batch, head, row]; the last dimension has
// unit stride. A broadcast dimension has stride 0.
struct Operand {
  const float* data = nullptr;
  int64_t batch_stride = 0, head_stride = 0, row_stride = 0;
};

struct Problem {
  int64_t batch = 0, heads = 0, q_len = 0, kv_len = 0, head_dim = 0, v_dim = 0;
  Operand q, k, v;
  Operand mask;         // additive, [q_len, kv_len] per (batch, head); optional
  bool causal = false;  // row i sees keys j <= i (top-left aligned)
  float scale = 1.0f;
  float* out = nullptr;  // [batch, head, row] strides below, unit last
  int64_t out_batch_stride = 0, out_head_stride = 0, out_row_stride = 0;
  float* logsumexp = nullptr;  // one per row
  int64_t lse_batch_stride = 0, lse_head_stride = 0, lse_row_stride = 0;
};

// Whether the kernel can run here (AVX-512F and the BLAS entry point).
bool supported();

// Sizes the kernel takes (all dimensions fit the BLAS's 32-bit integers).
bool fits(const Problem& p);

void forward(const Problem& p);

}  // namespace ember::kernels::attention
