// ember's elementwise fp32 loops over flat arrays (AVX-512F): the kernels
// of add/sub/mul/div/relu (Arithmetic.cpp) and the steps of an elementwise
// chain (ElementwiseChain.cpp). Every element is one correctly rounded IEEE
// operation (or the same sequence of them), computed the same in every lane,
// masked tail included: the bits do not depend on where a loop starts or
// ends, so chunks and tiles may split the elements anywhere.
#pragma once

#include <immintrin.h>

#include <cstdint>

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
__attribute__((target("avx512f"))) void arith_f32(const float* a,
                                                  const float* b, float scalar,
                                                  float* out, int64_t begin,
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
__attribute__((target("avx512f"))) void power_f32(const float* a, float* out,
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

}  // namespace ember::kernels
