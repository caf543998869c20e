#include "ops/kernels/elementwise/RowArgmax.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "ember/runtime/cpu_features.h"
#include "ops/kernels/ParallelChunks.h"

// GCC 12 reports its own intrinsics' deliberately undefined register
// operands (inside _mm512_cmp_ps_mask) as uninitialised.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace ember::kernels {
namespace {

constexpr int32_t kUnset = std::numeric_limits<int32_t>::max();
// Elements per parallel chunk of rows: below it one thread is faster.
constexpr int64_t kGrainElements = 32768;

// Per lane, the best value seen and its index: each lane keeps the first
// index of its own maximum (it moves only to a strictly larger value, or to
// a NaN from a number), so the first index overall is the smallest among
// the lanes that hold the maximum.
struct LaneBest {
  __m512 value;
  __m512i index;
};

__attribute__((target("avx512f"))) inline LaneBest unset_lanes() {
  return {_mm512_set1_ps(-std::numeric_limits<float>::infinity()),
          _mm512_set1_epi32(kUnset)};
}

// Folds 16 values (lanes in `active`) starting at element `base` into best.
__attribute__((target("avx512f"))) inline void fold(LaneBest& best, __m512 v,
                                                    int32_t base,
                                                    __mmask16 active) {
  const __mmask16 unset =
      _mm512_cmpeq_epi32_mask(best.index, _mm512_set1_epi32(kUnset));
  const __mmask16 best_nan =
      _mm512_cmp_ps_mask(best.value, best.value, _CMP_UNORD_Q);
  const __mmask16 greater = _mm512_cmp_ps_mask(v, best.value, _CMP_GT_OQ);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  const __mmask16 take =
      active & (unset | greater | static_cast<__mmask16>(nan & ~best_nan));
  const __m512i lanes = _mm512_add_epi32(
      _mm512_set1_epi32(base),
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  best.value = _mm512_mask_mov_ps(best.value, take, v);
  best.index = _mm512_mask_mov_epi32(best.index, take, lanes);
}

// Whether (a, ia) beats (b, ib) in CPU's order: NaN above every number,
// then the larger value, then the smaller index.
inline bool beats(float a, int32_t ia, float b, int32_t ib) {
  const bool a_nan = std::isnan(a), b_nan = std::isnan(b);
  if (a_nan != b_nan) return a_nan;
  if (!a_nan && a != b) return a > b;
  return ia < ib;
}

__attribute__((target("avx512f"))) int64_t pick(const LaneBest* chains,
                                                int count) {
  alignas(64) float values[16];
  alignas(64) int32_t indices[16];
  float best = 0;
  int32_t best_index = kUnset;
  for (int c = 0; c < count; ++c) {
    _mm512_store_ps(values, chains[c].value);
    _mm512_store_si512(indices, chains[c].index);
    for (int lane = 0; lane < 16; ++lane) {
      if (indices[lane] == kUnset) continue;
      if (best_index == kUnset ||
          beats(values[lane], indices[lane], best, best_index)) {
        best = values[lane];
        best_index = indices[lane];
      }
    }
  }
  return best_index;
}

__attribute__((target("avx512f"))) inline __m512 load16(const float* p) {
  return _mm512_loadu_ps(p);
}

__attribute__((target("avx512f"))) inline __m512 load16(const uint16_t* p) {
  // bf16 bits are the high half of the fp32 value they stand for
  return _mm512_castsi512_ps(_mm512_slli_epi32(
      _mm512_cvtepu16_epi32(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))),
      16));
}

// One row: two lane sets on alternate blocks of 16 (two dependency chains),
// the tail through a zero-padded block whose padding lanes are inactive.
template <class T>
__attribute__((target("avx512f"))) int64_t argmax_row(const T* row, int64_t n) {
  LaneBest chains[2] = {unset_lanes(), unset_lanes()};
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    fold(chains[0], load16(row + i), static_cast<int32_t>(i), 0xffff);
    fold(chains[1], load16(row + i + 16), static_cast<int32_t>(i + 16), 0xffff);
  }
  for (; i + 16 <= n; i += 16) {
    fold(chains[0], load16(row + i), static_cast<int32_t>(i), 0xffff);
  }
  if (i < n) {
    T block[16] = {};
    std::memcpy(block, row + i, static_cast<size_t>(n - i) * sizeof(T));
    const auto active = static_cast<__mmask16>((1u << (n - i)) - 1);
    fold(chains[1], load16(block), static_cast<int32_t>(i), active);
  }
  return pick(chains, 2);
}

template <class T>
void for_each_row(const T* rows, int64_t row_count, int64_t n, int64_t* out) {
  const int64_t grain = std::max<int64_t>(1, kGrainElements / n);
  parallel_chunks(row_count, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) out[r] = argmax_row(rows + r * n, n);
  });
}

}  // namespace

bool row_argmax_supported() {
  static const bool supported = runtime::cpu_features().avx512f;
  return supported;
}

void row_argmax_f32(const float* rows, int64_t row_count, int64_t n,
                    int64_t* out) {
  for_each_row(rows, row_count, n, out);
}

void row_argmax_bf16(const uint16_t* rows, int64_t row_count, int64_t n,
                     int64_t* out) {
  for_each_row(rows, row_count, n, out);
}

}  // namespace ember::kernels
