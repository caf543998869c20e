#include "ops/kernels/elementwise/VectorMathAvx2.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "ops/kernels/Avx2Lanes.h"
#include "ops/kernels/ParallelChunks.h"

namespace ember::kernels::avx2 {
namespace {

// Elements per parallel chunk, as VectorMath.cpp's.
constexpr int64_t kGrain = 16384;

#define EMBER_AVX2 __attribute__((target("avx2,fma"), always_inline)) inline

EMBER_AVX2 __m256 splat(float v) { return _mm256_set1_ps(v); }

// x = n ln2 + r with |r| <= ln2 / 2: returns r, sets n (integral floats).
EMBER_AVX2 __m256 reduce_by_ln2(__m256 x, __m256& n) {
  n = _mm256_round_ps(_mm256_mul_ps(x, splat(1.44269504088896341f)),
                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 r = _mm256_fnmadd_ps(n, splat(0.693359375f), x);
  return _mm256_fnmadd_ps(n, splat(-2.12194440e-4f), r);
}

// 2^n for integral n in [-126, 127], built in the exponent field.
EMBER_AVX2 __m256 pow2(__m256i n) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23));
}

// exp(r) for |r| <= ln2 / 2: the Taylor polynomial to r^7.
EMBER_AVX2 __m256 exp_reduced(__m256 r) {
  __m256 p = splat(1.0f / 5040);
  p = _mm256_fmadd_ps(p, r, splat(1.0f / 720));
  p = _mm256_fmadd_ps(p, r, splat(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, splat(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, splat(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, splat(0.5f));
  p = _mm256_fmadd_ps(p, r, splat(1.0f));
  return _mm256_fmadd_ps(p, r, splat(1.0f));
}

// exp(x) for x in [-87, 88] (n in [-126, 127]).
EMBER_AVX2 __m256 exp_ps(__m256 x) {
  __m256 n;
  const __m256 r = reduce_by_ln2(x, n);
  return _mm256_mul_ps(exp_reduced(r), pow2(_mm256_cvtps_epi32(n)));
}

// exp(x) for x in [-104, 100]: 2^n in two exact factors, so that the
// result overflows to inf and underflows to (rounded) denormals as one
// scaling would.
EMBER_AVX2 __m256 exp_wide_ps(__m256 x) {
  __m256 n;
  const __m256 r = reduce_by_ln2(x, n);
  const __m256i whole = _mm256_cvtps_epi32(n);
  const __m256i half = _mm256_srai_epi32(whole, 1);
  return _mm256_mul_ps(_mm256_mul_ps(exp_reduced(r), pow2(half)),
                       pow2(_mm256_sub_epi32(whole, half)));
}

// tanh(x) = sign(x) m / (m + 2), m = expm1(2|x|) with |x| clamped at 10:
// VectorMath.cpp's formula, with an exact division.
EMBER_AVX2 __m256 tanh_ps(__m256 x) {
  const __m256 sign_bit = splat(-0.0f);
  const __m256 ax = _mm256_min_ps(splat(10.0f), _mm256_andnot_ps(sign_bit, x));
  __m256 n;
  const __m256 r = reduce_by_ln2(_mm256_add_ps(ax, ax), n);
  __m256 q = splat(1.0f / 40320);
  q = _mm256_fmadd_ps(q, r, splat(1.0f / 5040));
  q = _mm256_fmadd_ps(q, r, splat(1.0f / 720));
  q = _mm256_fmadd_ps(q, r, splat(1.0f / 120));
  q = _mm256_fmadd_ps(q, r, splat(1.0f / 24));
  q = _mm256_fmadd_ps(q, r, splat(1.0f / 6));
  q = _mm256_fmadd_ps(q, r, splat(0.5f));
  const __m256 expm1_r = _mm256_fmadd_ps(_mm256_mul_ps(q, r), r, r);
  const __m256 two_n = pow2(_mm256_cvtps_epi32(n));
  const __m256 m =
      _mm256_fmadd_ps(expm1_r, two_n, _mm256_sub_ps(two_n, splat(1.0f)));
  const __m256 y = _mm256_div_ps(m, _mm256_add_ps(m, splat(2.0f)));
  return _mm256_or_ps(y, _mm256_and_ps(x, sign_bit));
}

// GELU, tanh form, as x / (1 + exp(-2u)) (VectorMath.cpp's): x / inf is
// +-0, and -inf / inf NaN, as CPU's kernel gives them.
EMBER_AVX2 __m256 gelu_tanh_ps(__m256 x) {
  const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
  const __m256 u = _mm256_mul_ps(_mm256_fmadd_ps(x3, splat(0.044715f), x),
                                 splat(0.79788456080286536f));
  const __m256 arg = _mm256_min_ps(
      _mm256_max_ps(_mm256_mul_ps(u, splat(-2.0f)), splat(-104.0f)),
      splat(100.0f));
  return _mm256_div_ps(x, _mm256_add_ps(splat(1.0f), exp_wide_ps(arg)));
}

// exp(d) for d <= 0, flushed to 0 below `lowest` (and for -inf and NaN).
EMBER_AVX2 __m256 exp_or_zero(__m256 d, __m256 lowest) {
  const __m256 keep = _mm256_cmp_ps(d, lowest, _CMP_GE_OQ);
  return _mm256_and_ps(keep, exp_ps(_mm256_max_ps(d, lowest)));
}

// 8 bf16 values (raw bits) as fp32: exact.
EMBER_AVX2 __m256 widen_bf16(__m128i bits) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

// 8 fp32 values to bf16 bits, nearest even; NaN -> 0x7fc0 (c10::BFloat16).
EMBER_AVX2 __m128i narrow_bf16(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i odd =
      _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), odd),
      16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  rounded = _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7fc0), nan);
  return _mm_packus_epi32(_mm256_castsi256_si128(rounded),
                          _mm256_extracti128_si256(rounded, 1));
}

#undef EMBER_AVX2

template <__m256 (*f)(__m256)>
__attribute__((target("avx2,fma"))) void map_f32_chunk(const float* in,
                                                       float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, f(_mm256_loadu_ps(in + i)));
  }
  if (i < n) {
    const __m256i tail = lane_mask(n - i);
    _mm256_maskstore_ps(out + i, tail, f(_mm256_maskload_ps(in + i, tail)));
  }
}

template <__m256 (*f)(__m256)>
__attribute__((target("avx2,fma"))) void map_bf16_chunk(const uint16_t* in,
                                                        uint16_t* out,
                                                        int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     narrow_bf16(f(widen_bf16(x))));
  }
  if (i < n) {  // the tail through a zeroed block of 8
    alignas(16) uint16_t block[8] = {};
    std::copy(in + i, in + n, block);
    const __m128i x = _mm_load_si128(reinterpret_cast<const __m128i*>(block));
    _mm_store_si128(reinterpret_cast<__m128i*>(block),
                    narrow_bf16(f(widen_bf16(x))));
    std::copy(block, block + (n - i), out + i);
  }
}

template <__m256 (*f)(__m256)>
void map_f32(const float* in, float* out, int64_t n) {
  parallel_chunks(n, kGrain, [&](int64_t begin, int64_t end) {
    map_f32_chunk<f>(in + begin, out + begin, end - begin);
  });
}

template <__m256 (*f)(__m256)>
void map_bf16(const uint16_t* in, uint16_t* out, int64_t n) {
  parallel_chunks(n, kGrain, [&](int64_t begin, int64_t end) {
    map_bf16_chunk<f>(in + begin, out + begin, end - begin);
  });
}

}  // namespace

void tanh_f32(const float* in, float* out, int64_t n) {
  map_f32<tanh_ps>(in, out, n);
}

void tanh_bf16(const uint16_t* in, uint16_t* out, int64_t n) {
  map_bf16<tanh_ps>(in, out, n);
}

void gelu_tanh_f32(const float* in, float* out, int64_t n) {
  map_f32<gelu_tanh_ps>(in, out, n);
}

void gelu_tanh_bf16(const uint16_t* in, uint16_t* out, int64_t n) {
  map_bf16<gelu_tanh_ps>(in, out, n);
}

__attribute__((target("avx2,fma"))) float max_f32(const float* row, int64_t n) {
  const __m256 lowest = _mm256_set1_ps(-INFINITY);
  __m256 best = lowest;
  __m256 nan = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(row + i);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    best = _mm256_max_ps(best, v);
  }
  if (i < n) {
    const __m256i tail = lane_mask(n - i);
    const __m256 v = _mm256_blendv_ps(lowest, _mm256_maskload_ps(row + i, tail),
                                      _mm256_castsi256_ps(tail));
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    best = _mm256_max_ps(best, v);
  }
  return _mm256_movemask_ps(nan) != 0 ? NAN : reduce_max_8(best);
}

__attribute__((target("avx2,fma"))) float add_max_f32(float* row,
                                                      const float* addend,
                                                      int64_t n) {
  const __m256 lowest = _mm256_set1_ps(-INFINITY);
  __m256 best = lowest;
  __m256 nan = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i m = lane_mask(n - i);
    const __m256 live = _mm256_castsi256_ps(m);
    const __m256 v = _mm256_add_ps(_mm256_maskload_ps(row + i, m),
                                   _mm256_maskload_ps(addend + i, m));
    store_lanes(row + i, n - i, m, v);
    nan = _mm256_or_ps(nan,
                       _mm256_and_ps(live, _mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
    best = _mm256_max_ps(best, _mm256_blendv_ps(lowest, v, live));
  }
  return _mm256_movemask_ps(nan) != 0 ? NAN : reduce_max_8(best);
}

__attribute__((target("avx2,fma"))) void scale_f32(const float* in,
                                                   float factor, float* out,
                                                   int64_t n) {
  const __m256 f = _mm256_set1_ps(factor);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(in + i), f));
  }
  if (i < n) {
    const __m256i m = lane_mask(n - i);
    _mm256_maskstore_ps(out + i, m,
                        _mm256_mul_ps(_mm256_maskload_ps(in + i, m), f));
  }
}

// The sums below keep the AVX-512 forms' 16 lanes (as two halves) and
// reduce them in the same order (upper half onto lower, then 128-bit
// halves, then pairs): the same bits as VectorMath.cpp's.
struct Lanes16 {
  __m256 low, high;
};

__attribute__((target("avx2,fma"), always_inline)) inline float reduce_add_16(
    Lanes16 v) {
  return reduce_add_8(_mm256_add_ps(v.high, v.low));
}

__attribute__((target("avx2,fma"))) float exp_shifted_sum_f32(float* row,
                                                              int64_t n,
                                                              float shift) {
  const __m256 s = _mm256_set1_ps(shift);
  const __m256 lowest = _mm256_set1_ps(-87.0f);  // exp_ps's range
  Lanes16 sum{_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t i = 0; i < n; i += 16) {
    __m256* half[2] = {&sum.low, &sum.high};
    for (int h = 0; h < 2; ++h) {
      float* at = row + i + 8 * h;
      const int64_t live = n - i - 8 * h;
      if (live >= 8) {
        const __m256 e =
            exp_or_zero(_mm256_sub_ps(_mm256_loadu_ps(at), s), lowest);
        _mm256_storeu_ps(at, e);
        *half[h] = _mm256_add_ps(*half[h], e);
      } else {
        // Lanes past the end add +0, as the AVX-512 form's masked lanes.
        const __m256i m = lane_mask(live);
        const __m256 e = _mm256_and_ps(
            _mm256_castsi256_ps(m),
            exp_or_zero(_mm256_sub_ps(_mm256_maskload_ps(at, m), s), lowest));
        _mm256_maskstore_ps(at, m, e);
        *half[h] = _mm256_add_ps(*half[h], e);
      }
    }
  }
  return reduce_add_16(sum);
}

__attribute__((target("avx2,fma"))) float dot_f32(const float* a,
                                                  const float* b, int64_t n) {
  // Two accumulators of 16 lanes, 32 elements a step, as the AVX-512 form.
  Lanes16 acc0{_mm256_setzero_ps(), _mm256_setzero_ps()};
  Lanes16 acc1 = acc0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0.low = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i),
                               acc0.low);
    acc0.high = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8),
                                _mm256_loadu_ps(b + i + 8), acc0.high);
    acc1.low = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16),
                               _mm256_loadu_ps(b + i + 16), acc1.low);
    acc1.high = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24),
                                _mm256_loadu_ps(b + i + 24), acc1.high);
  }
  for (; i < n; i += 16) {
    const __m256i lo = lane_mask(n - i), hi = lane_mask(n - i - 8);
    acc0.low = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, lo),
                               _mm256_maskload_ps(b + i, lo), acc0.low);
    acc0.high = _mm256_fmadd_ps(_mm256_maskload_ps(a + i + 8, hi),
                                _mm256_maskload_ps(b + i + 8, hi), acc0.high);
  }
  return reduce_add_16(
      {_mm256_add_ps(acc0.low, acc1.low), _mm256_add_ps(acc0.high, acc1.high)});
}

__attribute__((target("avx2,fma"))) void weighted_row_sum_f32(
    const float* weights, int64_t n, const float* rows, int64_t row_stride,
    float* out, int64_t width) {
  constexpr int kAccumulators = 8;  // 64 columns
  for (int64_t c0 = 0; c0 < width; c0 += 8 * kAccumulators) {
    __m256 acc[kAccumulators];
    for (int i = 0; i < kAccumulators; ++i) acc[i] = _mm256_setzero_ps();
    const float* column = rows + c0;
    if (width - c0 >= 8 * kAccumulators) {
      for (int64_t j = 0; j < n; ++j) {
        const __m256 w = _mm256_set1_ps(weights[j]);
        const float* row = column + j * row_stride;
#pragma GCC unroll 8
        for (int i = 0; i < kAccumulators; ++i) {
          acc[i] = _mm256_fmadd_ps(w, _mm256_loadu_ps(row + 8 * i), acc[i]);
        }
      }
#pragma GCC unroll 8
      for (int i = 0; i < kAccumulators; ++i) {
        _mm256_storeu_ps(out + c0 + 8 * i, acc[i]);
      }
      continue;
    }
    __m256i m[kAccumulators];
    for (int i = 0; i < kAccumulators; ++i)
      m[i] = lane_mask(width - c0 - 8 * i);
    for (int64_t j = 0; j < n; ++j) {
      const __m256 w = _mm256_set1_ps(weights[j]);
      const float* row = column + j * row_stride;
      for (int i = 0; i < kAccumulators; ++i) {
        acc[i] =
            _mm256_fmadd_ps(w, _mm256_maskload_ps(row + 8 * i, m[i]), acc[i]);
      }
    }
    for (int i = 0; i < kAccumulators; ++i) {
      _mm256_maskstore_ps(out + c0 + 8 * i, m[i], acc[i]);
    }
  }
}

}  // namespace ember::kernels::avx2
