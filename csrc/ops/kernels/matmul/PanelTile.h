// The register tile both panel GEMMs share (SkinnyGemm.cpp, ChannelGemm.cpp):
// acc[i][j] = sum over k of a[i][k] * panel j's row k, for kRows rows of A
// (broadcast one element at a time) and kPanels 16-column panels (one zmm
// per row k). Sums run over k in order. Callers are AVX-512F functions.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace ember::matmul {

// The lanes of a 16-column panel that hold real columns (`columns` of them,
// all 16 from 16 on): the mask of a tail panel's loads and stores.
inline __mmask16 column_mask(int64_t columns) {
  return columns >= 16 ? static_cast<__mmask16>(0xffff)
                       : static_cast<__mmask16>((1u << columns) - 1u);
}

// Lines of memory a tile's k loop pulls toward the core's L2 as it goes,
// one per k step: the panels a thread reads next, so that its first pass
// over them does not wait on DRAM (a tall GEMM's weight is mostly read from
// memory once per call: it rarely fits the last-level cache).
struct PrefetchRun {
  const char* first = nullptr;  // the first line (64-byte aligned)
  int64_t lines = 0;            // at most k are taken
};

template <int kRows, int kPanels>
__attribute__((target("avx512f"), always_inline)) inline void
accumulate_panel_tile(const float* a, int64_t lda, int64_t k,
                      const float* panel0, int64_t panel_stride,
                      __m512 (&acc)[kRows][kPanels],
                      PrefetchRun prefetch = {}) {
#pragma GCC unroll 8
  for (int i = 0; i < kRows; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < kPanels; ++j) acc[i][j] = _mm512_setzero_ps();
  }
  for (int64_t kk = 0; kk < k; ++kk) {
    if (kk < prefetch.lines) {
      _mm_prefetch(prefetch.first + kk * 64, _MM_HINT_T1);
    }
    __m512 b[kPanels];
#pragma GCC unroll 4
    for (int j = 0; j < kPanels; ++j) {
      b[j] = _mm512_load_ps(panel0 + j * panel_stride + kk * 16);
    }
#pragma GCC unroll 8
    for (int i = 0; i < kRows; ++i) {
      const __m512 x = _mm512_set1_ps(a[i * lda + kk]);
#pragma GCC unroll 4
      for (int j = 0; j < kPanels; ++j) {
        acc[i][j] = _mm512_fmadd_ps(x, b[j], acc[i][j]);
      }
    }
  }
}

}  // namespace ember::matmul
