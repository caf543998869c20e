// Small AVX2 helpers the AVX2 forms of ember's kernels share: partial
// vectors (masks for maskload/maskstore) and horizontal reductions.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace ember::kernels {

// The sign-bit mask of maskload/maskstore for the first `live` of 8 lanes
// (all 8 from 8 on, none from 0 down).
__attribute__((target("avx2"), always_inline)) inline __m256i lane_mask(
    int64_t live) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const int clamped = live > 8 ? 8 : live < 0 ? 0 : static_cast<int>(live);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(clamped), lanes);
}

// The first `live` lanes of v stored at p (all 8 from 8 on), and loaded
// (lanes past `live` zero). A full vector takes a plain store or load:
// VMASKMOVPS to memory is microcoded on Zen 3, about 10x a plain store
// (4.3 ns against 0.4 ns a ymm store in a loop).
__attribute__((target("avx2"), always_inline)) inline void store_lanes(
    float* p, int64_t live, __m256i mask, __m256 v) {
  if (live >= 8) {
    _mm256_storeu_ps(p, v);
  } else {
    _mm256_maskstore_ps(p, mask, v);
  }
}
__attribute__((target("avx2"), always_inline)) inline __m256 load_lanes(
    const float* p, int64_t live, __m256i mask) {
  return live >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, mask);
}

// The sum of the 8 lanes: halves added, then their halves, then the pair.
__attribute__((target("avx2"), always_inline)) inline float reduce_add_8(
    __m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The largest of the 8 lanes (no NaN: callers track NaN themselves).
__attribute__((target("avx2"), always_inline)) inline float reduce_max_8(
    __m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace ember::kernels
