// Panel GEMM: C = A @ B (+ bias) with B panel-packed. Skinny A (M <= 16
// rows, the decode case): the kernel streams B once, sequentially, at memory
// bandwidth. Taller A (fp32; prefill, encoders): the same 6 x 64 register
// tiles over every row, each panel group read from cache for all the rows.
// On a Zen 4 host BERT's linears (M = 128..1024, K, N = 768..3072) run at
// 80-98% of the FMA peak this way; oneDNN's packed matmul ran them 3-13%
// slower (35% at M = 32): docs/backends.md.
// Plain C++ with AVX-512 intrinsics; no torch types.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ember::matmul {

// Columns per panel: one AVX-512 register of fp32.
constexpr int64_t kPanelWidth = 16;
// Rows up to which A is skinny (one pass over B, split by panel groups).
constexpr int64_t kSkinnyMaxRows = 16;

// B (K x N) as ceil(N/16) panels of 16 columns. Panel p holds rows
// 0..K-1 of columns 16p..16p+15 contiguously: data[p][k][16], zero past N.
struct PanelPackedF32 {
  const float* data = nullptr;
  int64_t k = 0;
  int64_t n = 0;
  // Elements from one panel to the next; 0 means k * 16. Larger when only
  // the first k rows of taller panels take part.
  int64_t panel_stride = 0;
  static size_t bytes(int64_t k, int64_t n);
};

// The same in bf16 for VDPBF16PS: pairs of rows interleaved per column,
// data[p][k/2][16][2], K padded to even with zeros. Half the bytes.
struct PanelPackedBf16 {
  const uint16_t* data = nullptr;
  int64_t k = 0;
  int64_t n = 0;
  static size_t bytes(int64_t k, int64_t n);
};

// Packs B given by element strides (row-major B: stride_k = N, stride_n = 1;
// a transposed Linear weight: stride_k = 1, stride_n = K) into `dst`, which
// has PanelPacked*::bytes(k, n) bytes.
void pack_panels_f32(const float* b, int64_t k, int64_t n, int64_t stride_k,
                     int64_t stride_n, float* dst);
void pack_panels_bf16(const float* b, int64_t k, int64_t n, int64_t stride_k,
                      int64_t stride_n, uint16_t* dst);
// From a bf16 B (bit patterns; copied, not rounded).
void pack_panels_bf16(const uint16_t* b, int64_t k, int64_t n, int64_t stride_k,
                      int64_t stride_n, uint16_t* dst);

// Whether this CPU runs the kernels: AVX-512F or AVX2 + FMA, for both
// precisions (bf16 panels take VDPBF16PS where the CPU has AVX512_BF16, and
// are widened to fp32 in registers elsewhere). Decided once from CPUID.
bool skinny_f32_supported();
bool skinny_bf16_supported();

// C[m x n] (row stride ldc) = A[m x k] (row stride lda, unit column stride)
// @ B, plus bias[n] when not null; any m. Parallel over panel groups (and
// row slices when B is narrow); every element's sum runs in k order,
// whatever the thread count.
void skinny_gemm_f32(const float* a, int64_t lda, int64_t m,
                     const PanelPackedF32& b, const float* bias, float* c,
                     int64_t ldc);
// Same with B in bf16 and A rounded to bf16 (m <= kSkinnyMaxRows); fp32
// accumulation and result.
void skinny_gemm_bf16(const float* a, int64_t lda, int64_t m,
                      const PanelPackedBf16& b, const float* bias, float* c,
                      int64_t ldc);
// bf16 A, bias and C (bit patterns): fp32 accumulation, the bias added in
// fp32, then one round-to-nearest-even to bf16, as CPU's bf16 GEMM rounds.
void skinny_gemm_bf16(const uint16_t* a, int64_t lda, int64_t m,
                      const PanelPackedBf16& b, const uint16_t* bias,
                      uint16_t* c, int64_t ldc);

}  // namespace ember::matmul
