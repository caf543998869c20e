#include "ops/kernels/elementwise/VectorMath.h"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "ember/runtime/cpu_features.h"
#include "ops/kernels/ParallelChunks.h"

// GCC 12 reports its own intrinsics' deliberately undefined register
// operands (_mm512_undefined_*) as uninitialised.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace ember::kernels {
namespace {

// Elements per parallel chunk: below it one thread is faster.
constexpr int64_t kGrain = 16384;

// exp(x) for x in [-87, 88]: x = n ln2 + r with |r| <= ln2 / 2 (ln2 split in
// two for an exact n ln2), exp(r) by its Taylor polynomial to r^7 (error
// below 2e-9 relative), then scaled by 2^n.
__attribute__((target("avx512f"))) inline __m512 exp_ps(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(
      _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// tanh: near zero its odd Taylor series to x^17 (for |x| < 0.55 the next
// term is below 1e-8 relative); elsewhere 1 - 2 / (exp(2|x|) + 1) with the
// sign of x (|x| clamped at 10, where tanh is 1 in fp32). NaN and +-0 come
// back as they are (the polynomial would turn -0 into +0).
__attribute__((target("avx512f"))) inline __m512 tanh_ps(__m512 x) {
  const __m512 ax = _mm512_abs_ps(x);
  const __m512 x2 = _mm512_mul_ps(x, x);
  __m512 p = _mm512_set1_ps(6404582.0f / 10854718875.0f);
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-929569.0f / 638512875.0f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(21844.0f / 6081075.0f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-1382.0f / 155925.0f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(62.0f / 2835.0f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-17.0f / 315.0f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(2.0f / 15.0f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-1.0f / 3.0f));
  const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(p, x2), x, x);

  const __m512 e = exp_ps(_mm512_mul_ps(
      _mm512_min_ps(ax, _mm512_set1_ps(10.0f)), _mm512_set1_ps(2.0f)));
  const __m512 one = _mm512_set1_ps(1.0f);
  __m512 large = _mm512_sub_ps(
      one, _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, one)));
  const __mmask16 negative =
      _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
  large = _mm512_mask_sub_ps(large, negative, _mm512_setzero_ps(), large);

  const __mmask16 use_small =
      _mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.55f), _CMP_LT_OQ);
  const __mmask16 as_is =
      _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q) |
      _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_EQ_OQ);
  return _mm512_mask_blend_ps(use_small | as_is, large,
                              _mm512_mask_blend_ps(as_is, small, x));
}

// exp(d) for d <= 0, flushed to 0 below `lowest` (and for -inf).
__attribute__((target("avx512f"))) inline __m512 exp_or_zero(__m512 d,
                                                             __m512 lowest) {
  const __mmask16 keep = _mm512_cmp_ps_mask(d, lowest, _CMP_GE_OQ);
  return _mm512_maskz_mov_ps(keep, exp_ps(_mm512_max_ps(d, lowest)));
}

__attribute__((target("avx512f"))) void tanh_chunk(const float* in, float* out,
                                                   int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(out + i, tanh_ps(_mm512_loadu_ps(in + i)));
  }
  if (i < n) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(out + i, tail,
                          tanh_ps(_mm512_maskz_loadu_ps(tail, in + i)));
  }
}

// 16 bf16 values (raw bits) as fp32: exact.
__attribute__((target("avx512f"))) inline __m512 widen_bf16(__m256i bits) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

// 16 fp32 values to bf16 bits, rounded to nearest even; NaN -> 0x7fc0 (as
// c10::BFloat16).
__attribute__((target("avx512f"))) inline __m256i narrow_bf16(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i odd =
      _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), odd),
      16);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  rounded = _mm512_mask_mov_epi32(rounded, nan, _mm512_set1_epi32(0x7fc0));
  return _mm512_cvtepi32_epi16(rounded);
}

__attribute__((target("avx512f"))) void tanh_bf16_chunk(const uint16_t* in,
                                                        uint16_t* out,
                                                        int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i x =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        narrow_bf16(tanh_ps(widen_bf16(x))));
  }
  if (i < n) {  // the tail through a zeroed block of 16
    alignas(32) uint16_t block[16] = {};
    std::copy(in + i, in + n, block);
    const __m256i x =
        _mm256_load_si256(reinterpret_cast<const __m256i*>(block));
    _mm256_store_si256(reinterpret_cast<__m256i*>(block),
                       narrow_bf16(tanh_ps(widen_bf16(x))));
    std::copy(block, block + (n - i), out + i);
  }
}

}  // namespace

__attribute__((target("avx512f"))) float max_f32(const float* row, int64_t n) {
  __m512 best = _mm512_set1_ps(-INFINITY);
  __mmask16 nan = 0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(row + i);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    best = _mm512_max_ps(best, v);
  }
  if (i < n) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 v =
        _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), tail, row + i);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    best = _mm512_max_ps(best, v);
  }
  return nan ? NAN : _mm512_reduce_max_ps(best);
}

__attribute__((target("avx512f"))) float add_max_f32(float* row,
                                                     const float* addend,
                                                     int64_t n) {
  __m512 best = _mm512_set1_ps(-INFINITY);
  __mmask16 nan = 0;
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16
                            ? static_cast<__mmask16>(0xffff)
                            : static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m512 v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, row + i),
                                   _mm512_maskz_loadu_ps(m, addend + i));
    _mm512_mask_storeu_ps(row + i, m, v);
    nan |= _mm512_mask_cmp_ps_mask(m, v, v, _CMP_UNORD_Q);
    best = _mm512_mask_max_ps(best, m, best, v);
  }
  return nan ? NAN : _mm512_reduce_max_ps(best);
}

__attribute__((target("avx512f"))) void scale_f32(const float* in, float factor,
                                                  float* out, int64_t n) {
  const __m512 f = _mm512_set1_ps(factor);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16
                            ? static_cast<__mmask16>(0xffff)
                            : static_cast<__mmask16>((1u << (n - i)) - 1u);
    _mm512_mask_storeu_ps(out + i, m,
                          _mm512_mul_ps(_mm512_maskz_loadu_ps(m, in + i), f));
  }
}

__attribute__((target("avx512f"))) float exp_shifted_sum_f32(float* row,
                                                             int64_t n,
                                                             float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  // exp of x - shift <= 0; below -87 the result is 0 (or denormal), so
  // clamp there (exp_ps's range) and flush.
  const __m512 lowest = _mm512_set1_ps(-87.0f);
  __m512 sum = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 e =
        exp_or_zero(_mm512_sub_ps(_mm512_loadu_ps(row + i), s), lowest);
    _mm512_storeu_ps(row + i, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (i < n) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 e = _mm512_maskz_mov_ps(
        tail,
        exp_or_zero(_mm512_sub_ps(_mm512_mask_loadu_ps(s, tail, row + i), s),
                    lowest));
    _mm512_mask_storeu_ps(row + i, tail, e);
    sum = _mm512_add_ps(sum, e);
  }
  return _mm512_reduce_add_ps(sum);
}

__attribute__((target("avx512f"))) float dot_f32(const float* a, const float* b,
                                                 int64_t n) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 =
        _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16),
                           _mm512_loadu_ps(b + i + 16), acc1);
  }
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16
                            ? static_cast<__mmask16>(0xffff)
                            : static_cast<__mmask16>((1u << (n - i)) - 1u);
    acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i),
                           _mm512_maskz_loadu_ps(m, b + i), acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

__attribute__((target("avx512f"))) void weighted_row_sum_f32(
    const float* weights, int64_t n, const float* rows, int64_t row_stride,
    float* out, int64_t width) {
  for (int64_t c0 = 0; c0 < width; c0 += 64) {
    __mmask16 m[4];
    for (int i = 0; i < 4; ++i) {
      const int64_t left = width - c0 - 16 * i;
      m[i] = left >= 16  ? static_cast<__mmask16>(0xffff)
             : left <= 0 ? static_cast<__mmask16>(0)
                         : static_cast<__mmask16>((1u << left) - 1u);
    }
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(),
                     _mm512_setzero_ps(), _mm512_setzero_ps()};
    const float* column = rows + c0;
    for (int64_t j = 0; j < n; ++j) {
      const __m512 w = _mm512_set1_ps(weights[j]);
      const float* row = column + j * row_stride;
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        acc[i] = _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(m[i], row + 16 * i),
                                 acc[i]);
      }
    }
    for (int i = 0; i < 4; ++i) {
      _mm512_mask_storeu_ps(out + c0 + 16 * i, m[i], acc[i]);
    }
  }
}

bool vector_math_supported() {
  static const bool supported = runtime::cpu_features().avx512f;
  return supported;
}

void tanh_f32(const float* in, float* out, int64_t n) {
  parallel_chunks(n, kGrain, [&](int64_t begin, int64_t end) {
    tanh_chunk(in + begin, out + begin, end - begin);
  });
}

void tanh_bf16(const uint16_t* in, uint16_t* out, int64_t n) {
  parallel_chunks(n, kGrain, [&](int64_t begin, int64_t end) {
    tanh_bf16_chunk(in + begin, out + begin, end - begin);
  });
}

}  // namespace ember::kernels
