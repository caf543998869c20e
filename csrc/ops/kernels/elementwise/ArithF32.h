// ember's elementwise fp32 loops over flat arrays (AVX-512F, or AVX2 + FMA
// on CPUs without it: the same IEEE operation per element, so the same
// bits): the kernels
// of add/sub/mul/div/relu (Arithmetic.cpp) and the steps of an elementwise
// chain (ElementwiseChain.cpp). Every element is one correctly rounded IEEE
// operation (or the same sequence of them), computed the same in every lane,
// masked tail included: the bits do not depend on where a loop starts or
// ends, so chunks and tiles may split the elements anywhere.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "ember/runtime/cpu_features.h"
#include "ops/kernels/Avx2Lanes.h"

namespace ember::kernels {

enum class Arith { kAdd, kSub, kMul, kDiv, kRelu };

template <Arith Op>
__attribute__((target("avx512f"))) inline __m512 apply_arith(__m512 a,
                                                             __m512 b) {
  if constexpr (Op == Arith::kAdd) return _mm512_add_ps(a, b);
  if constexpr (Op == Arith::kSub) return _mm512_sub_ps(a, b);
  if constexpr (Op == Arith::kMul) return _mm512_mul_ps(a, b);
  if constexpr (Op == Arith::kDiv) return _mm512_div_ps(a, b);
  // relu: CPU's clamp_min(x, 0) vector form, max(0, x): NaN and -0 pass.
  return _mm512_max_ps(b, a);
}

inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xffff)
                    : static_cast<__mmask16>((1u << left) - 1u);
}

// out[i] = a[i] op (b ? b[i] : scalar) for i in [begin, end).
template <Arith Op>
__attribute__((target("avx512f"))) void arith_f32_avx512(
    const float* a, const float* b, float scalar, float* out, int64_t begin,
    int64_t end) {
  const __m512 s = _mm512_set1_ps(scalar);
  for (int64_t i = begin; i < end; i += 16) {
    const __mmask16 m = tail_mask(end - i);
    const __m512 x = _mm512_maskz_loadu_ps(m, a + i);
    const __m512 y = b != nullptr ? _mm512_maskz_loadu_ps(m, b + i) : s;
    _mm512_mask_storeu_ps(out + i, m, apply_arith<Op>(x, y));
  }
}

// out[i] = a[i]^Exponent for i < n, Exponent 2 or 3, as CPU's pow kernel
// computes those powers: a * a, (a * a) * a.
template <int Exponent>
__attribute__((target("avx512f"))) void power_f32_avx512(const float* a,
                                                         float* out,
                                                         int64_t n) {
  static_assert(Exponent == 2 || Exponent == 3);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 x = _mm512_maskz_loadu_ps(m, a + i);
    __m512 y = _mm512_mul_ps(x, x);
    if constexpr (Exponent == 3) y = _mm512_mul_ps(y, x);
    _mm512_mask_storeu_ps(out + i, m, y);
  }
}

template <Arith Op>
__attribute__((target("avx2"))) inline __m256 apply_arith_avx2(__m256 a,
                                                               __m256 b) {
  if constexpr (Op == Arith::kAdd) return _mm256_add_ps(a, b);
  if constexpr (Op == Arith::kSub) return _mm256_sub_ps(a, b);
  if constexpr (Op == Arith::kMul) return _mm256_mul_ps(a, b);
  if constexpr (Op == Arith::kDiv) return _mm256_div_ps(a, b);
  return _mm256_max_ps(b, a);  // relu, as above
}

template <Arith Op>
__attribute__((target("avx2"))) void arith_f32_avx2(const float* a,
                                                    const float* b,
                                                    float scalar, float* out,
                                                    int64_t begin,
                                                    int64_t end) {
  const __m256 s = _mm256_set1_ps(scalar);
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m256 y = b != nullptr ? _mm256_loadu_ps(b + i) : s;
    _mm256_storeu_ps(out + i, apply_arith_avx2<Op>(_mm256_loadu_ps(a + i), y));
  }
  if (i < end) {
    const __m256i m = lane_mask(end - i);
    const __m256 y = b != nullptr ? _mm256_maskload_ps(b + i, m) : s;
    _mm256_maskstore_ps(out + i, m,
                        apply_arith_avx2<Op>(_mm256_maskload_ps(a + i, m), y));
  }
}

template <int Exponent>
__attribute__((target("avx2"))) void power_f32_avx2(const float* a, float* out,
                                                    int64_t n) {
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i m = lane_mask(n - i);
    const __m256 x = _mm256_maskload_ps(a + i, m);
    __m256 y = _mm256_mul_ps(x, x);
    if constexpr (Exponent == 3) y = _mm256_mul_ps(y, x);
    store_lanes(out + i, n - i, m, y);
  }
}

// The loops above for this CPU: AVX-512F's where it has it.
inline bool arith_avx512() {
  static const bool supported = runtime::cpu_features().avx512f;
  return supported;
}

template <Arith Op>
void arith_f32(const float* a, const float* b, float scalar, float* out,
               int64_t begin, int64_t end) {
  if (arith_avx512()) {
    arith_f32_avx512<Op>(a, b, scalar, out, begin, end);
  } else {
    arith_f32_avx2<Op>(a, b, scalar, out, begin, end);
  }
}

template <int Exponent>
void power_f32(const float* a, float* out, int64_t n) {
  if (arith_avx512()) {
    power_f32_avx512<Exponent>(a, out, n);
  } else {
    power_f32_avx2<Exponent>(a, out, n);
  }
}

}  // namespace ember::kernels
