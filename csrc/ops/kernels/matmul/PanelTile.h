// The register tile both panel GEMMs share (SkinnyGemm.cpp, ChannelGemm.cpp):
// acc[i][j] = sum over k of a[i][k] * panel j's row k, for kRows rows of A
// (broadcast one element at a time) and kPanels 16-column panels (one zmm
// per row k). Sums run over k in order. Callers are AVX-512F functions.
// The AVX2 form holds a panel's row in two ymm halves and computes every
// element with the same fused multiply-adds in the same order: both ISAs
// give the same bits.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "ember/runtime/cpu_features.h"
#include "ops/kernels/Avx2Lanes.h"

namespace ember::matmul {

// Which tile the panel GEMMs run, decided once from CPUID (as capped by
// EMBER_MAX_ISA): AVX-512F's, or AVX2 + FMA's (the same bits); neither
// leaves the panel GEMMs out.
inline bool avx512_panel_tiles() {
  static const bool supported = runtime::cpu_features().avx512f;
  return supported;
}
inline bool panel_tiles_supported() {
  static const bool supported =
      avx512_panel_tiles() ||
      (runtime::cpu_features().avx2 && runtime::cpu_features().fma);
  return supported;
}

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

template <int kRows, int kHalves>
__attribute__((target("avx2"), always_inline)) inline void zero_tile_avx2(
    __m256 (&acc)[kRows][kHalves]) {
#pragma GCC unroll 8
  for (int i = 0; i < kRows; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < kHalves; ++j) acc[i][j] = _mm256_setzero_ps();
  }
}

// The AVX2 + FMA tile: acc[i][2j] and acc[i][2j + 1] are columns 0-7 and
// 8-15 of panel j. Callers keep kRows * kPanels * 2 at or under 12 of the
// 16 ymm registers (for_avx2_subtiles below splits larger blocks).
template <int kRows, int kPanels>
__attribute__((target("avx2,fma"), always_inline)) inline void
accumulate_panel_tile_avx2(const float* a, int64_t lda, int64_t k,
                           const float* panel0, int64_t panel_stride,
                           __m256 (&acc)[kRows][2 * kPanels],
                           PrefetchRun prefetch) {
  zero_tile_avx2(acc);
  for (int64_t kk = 0; kk < k; ++kk) {
    if (kk < prefetch.lines) {
      _mm_prefetch(prefetch.first + kk * 64, _MM_HINT_T1);
    }
    __m256 b[2 * kPanels];
#pragma GCC unroll 8
    for (int j = 0; j < 2 * kPanels; ++j) {
      b[j] = _mm256_load_ps(panel0 + (j / 2) * panel_stride + kk * 16 +
                            (j % 2) * 8);
    }
#pragma GCC unroll 8
    for (int i = 0; i < kRows; ++i) {
      const __m256 x = _mm256_broadcast_ss(a + i * lda + kk);
#pragma GCC unroll 8
      for (int j = 0; j < 2 * kPanels; ++j) {
        acc[i][j] = _mm256_fmadd_ps(x, b[j], acc[i][j]);
      }
    }
  }
}

using kernels::lane_mask;
using kernels::load_lanes;
using kernels::store_lanes;

// The fp32 panels' AVX2 tiles for for_avx2_subtiles: rows of A (row stride
// lda, k elements each) against 16-column panels panel_stride apart.
struct F32PanelTiles {
  const float* a;
  int64_t lda;
  int64_t k;
  const float* panel0;
  int64_t panel_stride;

  template <int kRows, int kPanels>
  __attribute__((target("avx2,fma"), always_inline)) void accumulate(
      int row0, int panel, PrefetchRun prefetch,
      __m256 (&acc)[kRows][2 * kPanels]) const {
    accumulate_panel_tile_avx2<kRows, kPanels>(a + row0 * lda, lda, k,
                                               panel0 + panel * panel_stride,
                                               panel_stride, acc, prefetch);
  }
};

// A kRows x kPanels block (the AVX-512 kernels' shape) as AVX2 tiles of at
// most 6 rows and 12 accumulators, each over the whole K (tiles.accumulate,
// F32PanelTiles above: every element is the same chain of fused
// multiply-adds as under AVX-512, so both ISAs give the same bits).
// store(acc, row0, panel0) writes each tile (acc's extents give its rows and
// 8-column halves); only the first tile prefetches.
template <int kRows, int kPanels, int kRow0 = 0, int kPanel0 = 0, class Tiles,
          class Store>
__attribute__((target("avx2,fma"), always_inline)) inline void
for_avx2_subtiles(const Tiles& tiles, PrefetchRun prefetch, Store& store) {
  constexpr int kTileRows = kRows - kRow0 < 6 ? kRows - kRow0 : 6;
  constexpr int kFit = 6 / kTileRows;
  constexpr int kTilePanels =
      kPanels - kPanel0 < kFit ? kPanels - kPanel0 : kFit;
  __m256 acc[kTileRows][2 * kTilePanels];
  tiles.template accumulate<kTileRows, kTilePanels>(
      kRow0, kPanel0, kRow0 == 0 && kPanel0 == 0 ? prefetch : PrefetchRun{},
      acc);
  store(acc, kRow0, kPanel0);
  if constexpr (kPanel0 + kTilePanels < kPanels) {
    for_avx2_subtiles<kRows, kPanels, kRow0, kPanel0 + kTilePanels>(
        tiles, prefetch, store);
  } else if constexpr (kRow0 + kTileRows < kRows) {
    for_avx2_subtiles<kRows, kPanels, kRow0 + kTileRows, 0>(tiles, prefetch,
                                                            store);
  }
}

}  // namespace ember::matmul
