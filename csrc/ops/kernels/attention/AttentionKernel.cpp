#include "ops/kernels/attention/AttentionKernel.h"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "ember/runtime/cpu_features.h"
#include "ops/kernels/AlignedFloats.h"
#include "ops/kernels/LayoutTranspose.h"
#include "ops/kernels/ParallelChunks.h"
#include "ops/kernels/elementwise/VectorMath.h"
#include "ops/kernels/matmul/SkinnyGemm.h"

// GCC 12 reports its own intrinsics' deliberately undefined register
// operands (_mm512_undefined_*) as uninitialised.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace ember::kernels::attention {
namespace {

// Each value to the nearest bf16 (ties to even), kept as fp32; finite
// non-negative inputs only (exponentials).
uint32_t rounded_bf16_bits(uint32_t bits) {
  return (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
}

__attribute__((target("avx512f"))) void round_to_bf16_avx512(float* values,
                                                             int64_t n) {
  const __m512i bias = _mm512_set1_epi32(0x7fff);
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i bits = _mm512_castps_si512(_mm512_loadu_ps(values + i));
    const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), one);
    const __m512i rounded = _mm512_and_si512(
        _mm512_add_epi32(_mm512_add_epi32(bits, bias), odd), high);
    _mm512_storeu_ps(values + i, _mm512_castsi512_ps(rounded));
  }
  for (; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &values[i], sizeof bits);
    bits = rounded_bf16_bits(bits);
    std::memcpy(&values[i], &bits, sizeof bits);
  }
}

// out[i] = the fp32 value of the bf16 bits in[i] (exact: bf16 is fp32's top
// half).
__attribute__((target("avx512f"))) void widen_bf16_avx512(const uint16_t* in,
                                                          float* out,
                                                          int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i wide = _mm512_cvtepu16_epi32(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i)));
    _mm512_storeu_ps(out + i, _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16)));
  }
  for (; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(in[i]) << 16;
    std::memcpy(&out[i], &bits, sizeof bits);
  }
}

// The two conversions above; without AVX-512 element by element (bf16
// attention is rare where the CPU has no bf16 arithmetic).
bool avx512_kernels() {
  static const bool supported = runtime::cpu_features().avx512f;
  return supported;
}

void round_to_bf16(float* values, int64_t n) {
  if (avx512_kernels()) return round_to_bf16_avx512(values, n);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &values[i], sizeof bits);
    bits = rounded_bf16_bits(bits);
    std::memcpy(&values[i], &bits, sizeof bits);
  }
}

void widen_bf16(const uint16_t* in, float* out, int64_t n) {
  if (avx512_kernels()) return widen_bf16_avx512(in, out, n);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(in[i]) << 16;
    std::memcpy(&out[i], &bits, sizeof bits);
  }
}

// Rows [row0, row0 + rows) of `op` at (b, h), `width` values each, as fp32:
// the operand's own memory, or a bf16 operand's rows widened into
// `scratch`. `row_stride` receives the stride of the returned rows.
const float* head_rows(const Operand& op, int64_t b, int64_t h, int64_t row0,
                       int64_t rows, int64_t width, std::vector<float>& scratch,
                       int64_t& row_stride) {
  const int64_t offset =
      b * op.batch_stride + h * op.head_stride + row0 * op.row_stride;
  if (op.data != nullptr) {
    row_stride = op.row_stride;
    return op.data + offset;
  }
  scratch.resize(static_cast<size_t>(rows * width));
  for (int64_t r = 0; r < rows; ++r) {
    widen_bf16(op.bf16 + offset + r * op.row_stride, scratch.data() + r * width,
               width);
  }
  row_stride = width;
  return scratch.data();
}

// The fp32 rows one thread reads for a (batch, head) of bf16 operands.
struct WidenedRows {
  std::vector<float> q, k, v;
};

// Scale-and-mask is done; row r of `s` (cols wide) holds query row row0 + r.
// Turns each row into unnormalised probabilities, stores its logsumexp and
// returns 1 / (row sum) per row in `inverse_sums`.
void softmax_rows(const Problem& p, int64_t b, int64_t h, int64_t row0,
                  int64_t rows, int64_t cols, float* s, float* inverse_sums) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = s + r * cols;
    const int64_t i = row0 + r;
    const int64_t visible = p.causal ? std::min(cols, i + 1) : cols;
    std::fill(row + visible, row + cols,
              -std::numeric_limits<float>::infinity());
    // The mask is added to the visible keys (the others are -inf either
    // way) in the pass that finds the row's largest value.
    const float max =
        p.mask.data == nullptr
            ? max_f32(row, visible)
            : add_max_f32(row,
                          p.mask.data + b * p.mask.batch_stride +
                              h * p.mask.head_stride + i * p.mask.row_stride,
                          visible);
    float* lse = p.logsumexp + b * p.lse_batch_stride + h * p.lse_head_stride +
                 i * p.lse_row_stride;
    if (std::isnan(max)) {
      std::fill(row, row + cols, std::numeric_limits<float>::quiet_NaN());
      inverse_sums[r] = 1.0f;
      *lse = max;
    } else if (max == -std::numeric_limits<float>::infinity()) {
      // Every key masked: a zero row and a logsumexp of 0, as CPU's flash
      // kernel gives them.
      std::fill(row, row + cols, 0.0f);
      inverse_sums[r] = 0.0f;
      *lse = 0.0f;
    } else {
      const float sum = exp_shifted_sum_f32(row, cols, max);
      inverse_sums[r] = 1.0f / sum;
      *lse = max + std::log(sum);
      if (p.bf16_probabilities) round_to_bf16(row, visible);
    }
  }
}

void normalise_rows(float* out, int64_t row_stride, int64_t rows, int64_t width,
                    const float* inverse_sums) {
  for (int64_t r = 0; r < rows; ++r) {
    float* o = out + r * row_stride;
    scale_f32(o, inverse_sums[r], o, width);
  }
}

int64_t visible_cols(const Problem& p, int64_t row0, int64_t rows) {
  return p.causal ? std::min(p.kv_len, row0 + rows) : p.kv_len;
}

// A few query rows (decode): one dot product per key and one scaled row
// of V added per key, straight from the operands (each key and value row
// is read once; a GEMM call per head costs more than the work).
void vector_rows(const Problem& p, int64_t b, int64_t h, int64_t row0,
                 int64_t rows, std::vector<float>& scores,
                 WidenedRows& widened) {
  const int64_t cols = visible_cols(p, row0, rows);
  scores.resize(static_cast<size_t>(rows * cols + rows));
  float* s = scores.data();
  float* inverse_sums = s + rows * cols;
  int64_t q_stride = 0, k_stride = 0, v_stride = 0;
  const float* q =
      head_rows(p.q, b, h, row0, rows, p.head_dim, widened.q, q_stride);
  const float* k = head_rows(p.k, b, h / p.kv_group, 0, cols, p.head_dim,
                             widened.k, k_stride);
  const float* v =
      head_rows(p.v, b, h / p.kv_group, 0, cols, p.v_dim, widened.v, v_stride);
  float* out = p.out + b * p.out_batch_stride + h * p.out_head_stride;
  for (int64_t r = 0; r < rows; ++r) {
    const float* q_row = q + r * q_stride;
    float* s_row = s + r * cols;
    for (int64_t j = 0; j < cols; ++j) {
      s_row[j] = p.scale * dot_f32(q_row, k + j * k_stride, p.head_dim);
    }
  }
  softmax_rows(p, b, h, row0, rows, cols, s, inverse_sums);
  for (int64_t r = 0; r < rows; ++r) {
    weighted_row_sum_f32(s + r * cols, cols, v, v_stride,
                         out + (row0 + r) * p.out_row_stride, p.v_dim);
  }
  normalise_rows(out + row0 * p.out_row_stride, p.out_row_stride, rows, p.v_dim,
                 inverse_sums);
}

// A float buffer aligned to 64 bytes (the panel kernel's aligned loads).
using kernels::AlignedFloats;

// K^T (dim x keys) as panels of 16 keys: panel p is [dim][16], zero past
// the last key. Full 16 x 16 tiles are transposed in registers.
void pack_key_panels(const float* k, int64_t row_stride, int64_t keys,
                     int64_t dim, float* panels) {
  constexpr int64_t kW = matmul::kPanelWidth;
  for (int64_t key0 = 0; key0 < keys; key0 += kW) {
    float* panel = panels + key0 * dim;  // (key0 / 16) * dim * 16
    const int64_t n = std::min(kW, keys - key0);
    int64_t d0 = 0;
    if (n == kW) {
      for (; d0 + kW <= dim; d0 += kW) {
        transpose_16x16(k + key0 * row_stride + d0, row_stride, panel + d0 * kW,
                        kW);
      }
    }
    for (int64_t d = d0; d < dim; ++d) {
      for (int64_t j = 0; j < kW; ++j) {
        panel[d * kW + j] = j < n ? k[(key0 + j) * row_stride + d] : 0.0f;
      }
    }
  }
}

// V (keys x v_dim) as panels of 16 columns: panel p is [keys][16].
void pack_value_panels(const float* v, int64_t row_stride, int64_t keys,
                       int64_t v_dim, float* panels) {
  constexpr int64_t kW = matmul::kPanelWidth;
  for (int64_t c0 = 0; c0 < v_dim; c0 += kW) {
    float* panel = panels + c0 * keys;  // (c0 / 16) * keys * 16
    const int64_t n = std::min(kW, v_dim - c0);
    for (int64_t j = 0; j < keys; ++j) {
      const float* src = v + j * row_stride + c0;
      float* dst = panel + j * kW;
      std::copy(src, src + n, dst);
      std::fill(dst + n, dst + kW, 0.0f);
    }
  }
}

// Scratch of one thread for a (batch, head): K^T and V as panels of 16
// columns (the skinny GEMM's layout), one block of scores.
struct HeadScratch {
  AlignedFloats keys, values;
  std::vector<float> scores, inverse_sums;
  WidenedRows widened;
};

// Many query rows (prefill, encoders): K^T and V are packed once per head,
// then every block of 16 query rows runs ember's AVX-512 panel kernel
// (6 x 64 register tiles) for both products.
void panel_head(const Problem& p, int64_t b, int64_t h, HeadScratch& scratch) {
  using matmul::kPanelWidth;
  using matmul::kSkinnyMaxRows;
  const int64_t key_panels = (p.kv_len + kPanelWidth - 1) / kPanelWidth;
  const int64_t value_panels = (p.v_dim + kPanelWidth - 1) / kPanelWidth;
  float* keys = scratch.keys.resize(key_panels * p.head_dim * kPanelWidth);
  float* values = scratch.values.resize(value_panels * p.kv_len * kPanelWidth);
  scratch.scores.resize(static_cast<size_t>(kSkinnyMaxRows * p.kv_len));
  scratch.inverse_sums.resize(kSkinnyMaxRows);
  WidenedRows& widened = scratch.widened;
  int64_t q_stride = 0, k_stride = 0, v_stride = 0;
  const float* q =
      head_rows(p.q, b, h, 0, p.q_len, p.head_dim, widened.q, q_stride);
  const float* k = head_rows(p.k, b, h / p.kv_group, 0, p.kv_len, p.head_dim,
                             widened.k, k_stride);
  const float* v = head_rows(p.v, b, h / p.kv_group, 0, p.kv_len, p.v_dim,
                             widened.v, v_stride);
  float* out = p.out + b * p.out_batch_stride + h * p.out_head_stride;
  // K^T (head_dim x kv_len) and V (kv_len x v_dim) into panels.
  pack_key_panels(k, k_stride, p.kv_len, p.head_dim, keys);
  pack_value_panels(v, v_stride, p.kv_len, p.v_dim, values);
  std::vector<float> scaled_q(static_cast<size_t>(kSkinnyMaxRows * p.head_dim));
  for (int64_t row0 = 0; row0 < p.q_len; row0 += kSkinnyMaxRows) {
    const int64_t rows = std::min(kSkinnyMaxRows, p.q_len - row0);
    const int64_t cols = visible_cols(p, row0, rows);
    // The scale goes on Q (rows x head_dim) rather than on the scores.
    for (int64_t r = 0; r < rows; ++r) {
      scale_f32(q + (row0 + r) * q_stride, p.scale,
                scaled_q.data() + r * p.head_dim, p.head_dim);
    }
    float* s = scratch.scores.data();
    matmul::skinny_gemm_f32(scaled_q.data(), p.head_dim, rows,
                            matmul::PanelPackedF32{keys, p.head_dim, cols},
                            nullptr, s, cols);
    softmax_rows(p, b, h, row0, rows, cols, s, scratch.inverse_sums.data());
    float* o = out + row0 * p.out_row_stride;
    matmul::skinny_gemm_f32(
        s, cols, rows,
        matmul::PanelPackedF32{values, cols, p.v_dim, p.kv_len * kPanelWidth},
        nullptr, o, p.out_row_stride);
    normalise_rows(o, p.out_row_stride, rows, p.v_dim,
                   scratch.inverse_sums.data());
  }
}

}  // namespace

bool supported() { return vector_math_supported(); }

bool fits(const Problem& p) {
  return p.q_len > 0 && p.kv_len > 0 && p.head_dim > 0 && p.v_dim > 0 &&
         p.kv_group > 0 && p.heads % p.kv_group == 0;
}

void forward(const Problem& p) {
  if (p.q_len >= matmul::kSkinnyMaxRows) {
    parallel_chunks(p.batch * p.heads, 1, [&](int64_t begin, int64_t end) {
      HeadScratch scratch;
      for (int64_t t = begin; t < end; ++t) {
        panel_head(p, t / p.heads, t % p.heads, scratch);
      }
    });
    return;
  }
  parallel_chunks(p.batch * p.heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    WidenedRows widened;
    for (int64_t t = begin; t < end; ++t) {
      vector_rows(p, t / p.heads, t % p.heads, 0, p.q_len, scores, widened);
    }
  });
}

}  // namespace ember::kernels::attention
