#include "ops/kernels/elementwise/VectorMath.h"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "ember/runtime/cpu_features.h"
#include "ops/kernels/ParallelChunks.h"
#include "ops/kernels/elementwise/VectorMathAvx2.h"

// GCC 12 reports its own intrinsics' deliberately undefined register
// operands (_mm512_undefined_*) as uninitialised.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace ember::kernels {
namespace {

// Elements per parallel chunk: below it one thread is faster.
constexpr int64_t kGrain = 16384;

// x = n ln2 + r with |r| <= ln2 / 2 (ln2 split in two for an exact n ln2):
// returns r, sets n.
__attribute__((target("avx512f"))) inline __m512 reduce_by_ln2(__m512 x,
                                                               __m512& n) {
  n = _mm512_roundscale_ps(
      _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  return _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
}

// exp(x) for x in [-87, 88]: exp(r) by its Taylor polynomial to r^7 (error
// below 2e-9 relative), then scaled by 2^n.
__attribute__((target("avx512f"))) inline __m512 exp_ps(__m512 x) {
  __m512 n;
  const __m512 r = reduce_by_ln2(x, n);
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

// 1 / d to ~2^-28 relative (rcp14 and one Newton step) for finite d != 0.
__attribute__((target("avx512f"))) inline __m512 reciprocal_ps(__m512 d) {
  const __m512 r = _mm512_rcp14_ps(d);
  return _mm512_mul_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(2.0f)));
}

// tanh(x) = sign(x) m / (m + 2) with m = expm1(2|x|) (|x| clamped at 10,
// where tanh is 1 in fp32): one formula for every x, accurate relative to
// the result near 0 as elsewhere, no blend of two. expm1(a) = 2^n expm1(r)
// + (2^n - 1) for a = n ln2 + r, |r| <= ln2 / 2, with expm1(r) by its
// Taylor polynomial to r^8 and the sum rounded once (fmadd). NaN stays NaN
// (min keeps its second operand's NaN), -0 stays -0 (the sign is or-ed
// back). Half the instructions of the two-formula version it replaced:
// 23.5-27 against 31-34 cycles per 16 floats in L2 on an Intel Xeon
// (SLEEF's, CPU's: 21.5-22).
__attribute__((target("avx512f"))) inline __m512 tanh_ps(__m512 x) {
  const __m512 ax = _mm512_min_ps(_mm512_set1_ps(10.0f), _mm512_abs_ps(x));
  __m512 n;
  const __m512 r = reduce_by_ln2(_mm512_add_ps(ax, ax), n);
  __m512 q = _mm512_set1_ps(1.0f / 40320);
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.0f / 5040));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.0f / 720));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.0f / 120));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.0f / 24));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(1.0f / 6));
  q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(0.5f));
  const __m512 expm1_r = _mm512_fmadd_ps(_mm512_mul_ps(q, r), r, r);
  const __m512 two_n = _mm512_scalef_ps(_mm512_set1_ps(1.0f), n);
  const __m512 m = _mm512_fmadd_ps(expm1_r, two_n,
                                   _mm512_sub_ps(two_n, _mm512_set1_ps(1.0f)));
  const __m512 y =
      _mm512_mul_ps(m, reciprocal_ps(_mm512_add_ps(m, _mm512_set1_ps(2.0f))));
  const __m512i sign =
      _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN));
  return _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(y), sign));
}

// exp(d) for d <= 0, flushed to 0 below `lowest` (and for -inf).
__attribute__((target("avx512f"))) inline __m512 exp_or_zero(__m512 d,
                                                             __m512 lowest) {
  const __mmask16 keep = _mm512_cmp_ps_mask(d, lowest, _CMP_GE_OQ);
  return _mm512_maskz_mov_ps(keep, exp_ps(_mm512_max_ps(d, lowest)));
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

// GELU, tanh form: x (1 + tanh(u)) / 2 with u = sqrt(2/pi) (x + 0.044715
// x^3), computed as x / (1 + exp(-2u)) (the same function, with no 1 + tanh
// cancellation for negative x). exp's argument is clamped to [-104, 100]:
// past 100 it is inf, so x * 0 is -0 for large negative x and NaN for -inf,
// as CPU's 0.5 x (1 + tanh(u)) gives them.
__attribute__((target("avx512f"))) inline __m512 gelu_tanh_ps(__m512 x) {
  const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
  const __m512 u =
      _mm512_mul_ps(_mm512_fmadd_ps(x3, _mm512_set1_ps(0.044715f), x),
                    _mm512_set1_ps(0.79788456080286536f));
  const __m512 arg =
      _mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(u, _mm512_set1_ps(-2.0f)),
                                  _mm512_set1_ps(-104.0f)),
                    _mm512_set1_ps(100.0f));
  const __m512 denominator = _mm512_add_ps(_mm512_set1_ps(1.0f), exp_ps(arg));
  // 1 / inf is 0 (rcp14), not NaN as the Newton step would make it.
  const __mmask16 finite =
      _mm512_cmp_ps_mask(denominator, _mm512_set1_ps(INFINITY), _CMP_LT_OQ);
  return _mm512_mul_ps(x,
                       _mm512_maskz_mov_ps(finite, reciprocal_ps(denominator)));
}

// f over n floats (`in` and `out` may be the same array).
template <__m512 (*f)(__m512)>
__attribute__((target("avx512f"))) void map_f32_chunk(const float* in,
                                                      float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(out + i, f(_mm512_loadu_ps(in + i)));
  }
  if (i < n) {
    const __mmask16 tail = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(out + i, tail,
                          f(_mm512_maskz_loadu_ps(tail, in + i)));
  }
}

// f over n bf16 values (raw bits): computed in fp32, rounded once.
template <__m512 (*f)(__m512)>
__attribute__((target("avx512f"))) void map_bf16_chunk(const uint16_t* in,
                                                       uint16_t* out,
                                                       int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i x =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        narrow_bf16(f(widen_bf16(x))));
  }
  if (i < n) {  // the tail through a zeroed block of 16
    alignas(32) uint16_t block[16] = {};
    std::copy(in + i, in + n, block);
    const __m256i x =
        _mm256_load_si256(reinterpret_cast<const __m256i*>(block));
    _mm256_store_si256(reinterpret_cast<__m256i*>(block),
                       narrow_bf16(f(widen_bf16(x))));
    std::copy(block, block + (n - i), out + i);
  }
}

template <__m512 (*f)(__m512)>
void map_f32(const float* in, float* out, int64_t n) {
  parallel_chunks(n, kGrain, [&](int64_t begin, int64_t end) {
    map_f32_chunk<f>(in + begin, out + begin, end - begin);
  });
}

template <__m512 (*f)(__m512)>
void map_bf16(const uint16_t* in, uint16_t* out, int64_t n) {
  parallel_chunks(n, kGrain, [&](int64_t begin, int64_t end) {
    map_bf16_chunk<f>(in + begin, out + begin, end - begin);
  });
}

__attribute__((target("avx512f"))) float max_f32_avx512(const float* row,
                                                        int64_t n) {
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

__attribute__((target("avx512f"))) float add_max_f32_avx512(float* row,
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

__attribute__((target("avx512f"))) void scale_f32_avx512(const float* in,
                                                         float factor,
                                                         float* out,
                                                         int64_t n) {
  const __m512 f = _mm512_set1_ps(factor);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16
                            ? static_cast<__mmask16>(0xffff)
                            : static_cast<__mmask16>((1u << (n - i)) - 1u);
    _mm512_mask_storeu_ps(out + i, m,
                          _mm512_mul_ps(_mm512_maskz_loadu_ps(m, in + i), f));
  }
}

__attribute__((target("avx512f"))) float exp_shifted_sum_f32_avx512(
    float* row, int64_t n, float shift) {
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

__attribute__((target("avx512f"))) float dot_f32_avx512(const float* a,
                                                        const float* b,
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

__attribute__((target("avx512f"))) void weighted_row_sum_f32_avx512(
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

bool avx512_kernels() {
  static const bool supported = runtime::cpu_features().avx512f;
  return supported;
}

}  // namespace

bool vector_math_supported() {
  static const bool supported =
      avx512_kernels() ||
      (runtime::cpu_features().avx2 && runtime::cpu_features().fma);
  return supported;
}

void tanh_f32(const float* in, float* out, int64_t n) {
  if (!avx512_kernels()) return avx2::tanh_f32(in, out, n);
  map_f32<tanh_ps>(in, out, n);
}

void tanh_bf16(const uint16_t* in, uint16_t* out, int64_t n) {
  if (!avx512_kernels()) return avx2::tanh_bf16(in, out, n);
  map_bf16<tanh_ps>(in, out, n);
}

void gelu_tanh_f32(const float* in, float* out, int64_t n) {
  if (!avx512_kernels()) return avx2::gelu_tanh_f32(in, out, n);
  map_f32<gelu_tanh_ps>(in, out, n);
}

void gelu_tanh_bf16(const uint16_t* in, uint16_t* out, int64_t n) {
  if (!avx512_kernels()) return avx2::gelu_tanh_bf16(in, out, n);
  map_bf16<gelu_tanh_ps>(in, out, n);
}

float max_f32(const float* row, int64_t n) {
  return avx512_kernels() ? max_f32_avx512(row, n) : avx2::max_f32(row, n);
}

float add_max_f32(float* row, const float* addend, int64_t n) {
  return avx512_kernels() ? add_max_f32_avx512(row, addend, n)
                          : avx2::add_max_f32(row, addend, n);
}

float exp_shifted_sum_f32(float* row, int64_t n, float shift) {
  return avx512_kernels() ? exp_shifted_sum_f32_avx512(row, n, shift)
                          : avx2::exp_shifted_sum_f32(row, n, shift);
}

void scale_f32(const float* in, float factor, float* out, int64_t n) {
  if (!avx512_kernels()) return avx2::scale_f32(in, factor, out, n);
  scale_f32_avx512(in, factor, out, n);
}

float dot_f32(const float* a, const float* b, int64_t n) {
  return avx512_kernels() ? dot_f32_avx512(a, b, n) : avx2::dot_f32(a, b, n);
}

void weighted_row_sum_f32(const float* weights, int64_t n, const float* rows,
                          int64_t row_stride, float* out, int64_t width) {
  if (!avx512_kernels()) {
    return avx2::weighted_row_sum_f32(weights, n, rows, row_stride, out, width);
  }
  weighted_row_sum_f32_avx512(weights, n, rows, row_stride, out, width);
}

}  // namespace ember::kernels
