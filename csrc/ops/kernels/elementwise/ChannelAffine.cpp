// GCC 12 reports its own intrinsics' deliberately undefined register
// operands (_mm512_undefined_*, inside the masked sqrt) as uninitialised.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "ops/kernels/elementwise/ChannelAffine.h"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "ember/runtime/cpu_features.h"
#include "ops/kernels/Avx2Lanes.h"
#include "ops/kernels/ParallelChunks.h"

namespace ember::kernels {
namespace {

// Elements per parallel chunk: below it one thread is faster.
constexpr int64_t kGrain = 16384;

__mmask16 first(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xffff)
                    : static_cast<__mmask16>((1u << left) - 1u);
}

// A multiply and then an add, not a fused multiply-add: CPU's kernel rounds
// the product first too.
__attribute__((target("avx512f"))) void affine_run(const float* in, float* out,
                                                   int64_t n, float scale,
                                                   float shift) {
  const __m512 a = _mm512_set1_ps(scale), b = _mm512_set1_ps(shift);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 x0 = _mm512_loadu_ps(in + i);
    const __m512 x1 = _mm512_loadu_ps(in + i + 16);
    _mm512_storeu_ps(out + i, _mm512_add_ps(_mm512_mul_ps(x0, a), b));
    _mm512_storeu_ps(out + i + 16, _mm512_add_ps(_mm512_mul_ps(x1, a), b));
  }
  for (; i < n; i += 16) {
    const __mmask16 m = first(n - i);
    _mm512_mask_storeu_ps(
        out + i, m,
        _mm512_add_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, in + i), a), b));
  }
}

__attribute__((target("avx512f"))) void affine_row(const float* in, float* out,
                                                   int64_t channels,
                                                   const float* scale,
                                                   const float* shift) {
  for (int64_t c = 0; c < channels; c += 16) {
    const __mmask16 m = first(channels - c);
    const __m512 x = _mm512_maskz_loadu_ps(m, in + c);
    _mm512_mask_storeu_ps(
        out + c, m,
        _mm512_add_ps(_mm512_mul_ps(x, _mm512_maskz_loadu_ps(m, scale + c)),
                      _mm512_maskz_loadu_ps(m, shift + c)));
  }
}

// The same two loops for AVX2 + FMA CPUs, with one difference: CPU's AVX2
// kernels compute x * alpha + beta as one fused multiply-add (the compiler
// contracts ATen's vector expression there; measured against CPU's result
// on an AMD Zen 3 host), so these do too: CPU's bits on such a CPU.
// A plane's last partial vector is not masked: VMASKMOVPS to memory is
// microcoded on AMD CPUs (2048 planes of 7x7: 26.2 us a call against 29.4
// masked; of 1x1: 15.3 against 25.6; Zen 3). The plane's last 8 elements are
// read before anything is stored (`in` may be `out`) and stored last, over
// elements the loop already wrote with the same values; planes of under 8
// elements take the scalar fused multiply-add (the same rounding).
__attribute__((target("avx2,fma"))) void affine_run_avx2(const float* in,
                                                         float* out, int64_t n,
                                                         float scale,
                                                         float shift) {
  if (n < 8) {
    for (int64_t i = 0; i < n; ++i) out[i] = std::fma(in[i], scale, shift);
    return;
  }
  const __m256 a = _mm256_set1_ps(scale), b = _mm256_set1_ps(shift);
  const __m256 last = _mm256_loadu_ps(in + n - 8);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 x0 = _mm256_loadu_ps(in + i);
    const __m256 x1 = _mm256_loadu_ps(in + i + 8);
    _mm256_storeu_ps(out + i, _mm256_fmadd_ps(x0, a, b));
    _mm256_storeu_ps(out + i + 8, _mm256_fmadd_ps(x1, a, b));
  }
  if (i + 8 <= n) {
    _mm256_storeu_ps(out + i, _mm256_fmadd_ps(_mm256_loadu_ps(in + i), a, b));
    i += 8;
  }
  if (i < n) _mm256_storeu_ps(out + n - 8, _mm256_fmadd_ps(last, a, b));
}

__attribute__((target("avx2,fma"))) void affine_row_avx2(const float* in,
                                                         float* out,
                                                         int64_t channels,
                                                         const float* scale,
                                                         const float* shift) {
  for (int64_t c = 0; c < channels; c += 8) {
    const __m256i m = lane_mask(channels - c);
    const __m256 x = _mm256_maskload_ps(in + c, m);
    store_lanes(out + c, channels - c, m,
                _mm256_fmadd_ps(x, _mm256_maskload_ps(scale + c, m),
                                _mm256_maskload_ps(shift + c, m)));
  }
}

bool avx512_kernels() {
  static const bool supported = runtime::cpu_features().avx512f;
  return supported;
}

}  // namespace

// CPU's folding (batch_norm_cpu_collect_linear_and_constant_terms), in
// float as there: scale = weight / sqrt(var + eps), shift = bias - mean *
// scale, the shift with one rounding (CPU's compiled expression is
// contracted to a fused multiply-add). Sixteen channels at a time, the last
// ones masked: vsqrtps and vdivps round as the scalar sqrt and division do,
// so the bits are CPU's (at 2048 channels a scalar loop took a third of a
// 7x7 batch norm's time). AVX-512F; AVX2 + FMA below.
namespace {

__attribute__((target("avx512f"))) void fold_batch_norm_f32_avx512(
    const float* mean, const float* var, const float* weight, const float* bias,
    float eps, int64_t channels, float* scale, float* shift) {
  for (int64_t c = 0; c < channels; c += 16) {
    const __mmask16 m =
        channels - c >= 16 ? static_cast<__mmask16>(0xffff)
                           : static_cast<__mmask16>((1u << (channels - c)) - 1);
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 invstd = _mm512_div_ps(
        one, _mm512_sqrt_ps(_mm512_add_ps(_mm512_mask_loadu_ps(one, m, var + c),
                                          _mm512_set1_ps(eps))));
    const __m512 s =
        weight != nullptr
            ? _mm512_mul_ps(invstd, _mm512_maskz_loadu_ps(m, weight + c))
            : invstd;
    _mm512_mask_storeu_ps(scale + c, m, s);
    _mm512_mask_storeu_ps(
        shift + c, m,
        _mm512_fnmadd_ps(_mm512_maskz_loadu_ps(m, mean + c), s,
                         bias != nullptr ? _mm512_maskz_loadu_ps(m, bias + c)
                                         : _mm512_setzero_ps()));
  }
}

// The same folding for AVX2 + FMA CPUs: the same IEEE operations.
__attribute__((target("avx2,fma"))) void fold_batch_norm_f32_avx2(
    const float* mean, const float* var, const float* weight, const float* bias,
    float eps, int64_t channels, float* scale, float* shift) {
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int64_t c = 0; c < channels; c += 8) {
    const __m256i m = lane_mask(channels - c);
    // Lanes past the last channel read 1 (as the AVX-512 form): no 0/0.
    const __m256 v = _mm256_blendv_ps(one, _mm256_maskload_ps(var + c, m),
                                      _mm256_castsi256_ps(m));
    const __m256 invstd = _mm256_div_ps(
        one, _mm256_sqrt_ps(_mm256_add_ps(v, _mm256_set1_ps(eps))));
    const __m256 s =
        weight != nullptr
            ? _mm256_mul_ps(invstd, _mm256_maskload_ps(weight + c, m))
            : invstd;
    _mm256_maskstore_ps(scale + c, m, s);
    _mm256_maskstore_ps(
        shift + c, m,
        _mm256_fnmadd_ps(_mm256_maskload_ps(mean + c, m), s,
                         bias != nullptr ? _mm256_maskload_ps(bias + c, m)
                                         : _mm256_setzero_ps()));
  }
}

}  // namespace

bool channel_affine_supported() {
  static const bool supported =
      avx512_kernels() ||
      (runtime::cpu_features().avx2 && runtime::cpu_features().fma);
  return supported;
}

void fold_batch_norm_f32(const float* mean, const float* var,
                         const float* weight, const float* bias, float eps,
                         int64_t channels, float* scale, float* shift) {
  if (avx512_kernels()) {
    fold_batch_norm_f32_avx512(mean, var, weight, bias, eps, channels, scale,
                               shift);
  } else {
    fold_batch_norm_f32_avx2(mean, var, weight, bias, eps, channels, scale,
                             shift);
  }
}

void channel_affine_planes_f32(const float* in, float* out, int64_t outer,
                               int64_t channels, int64_t inner,
                               const float* scale, const float* shift) {
  const int64_t planes = outer * channels;
  const int64_t grain =
      std::max<int64_t>(1, kGrain / std::max<int64_t>(inner, 1));
  const bool avx512 = avx512_kernels();
  parallel_chunks(planes, grain, [&](int64_t begin, int64_t end) {
    // The channel steps with the plane (no division per plane: at 7x7, 2048
    // channels, one per plane took as long as the arithmetic).
    int64_t c = begin % channels;
    for (int64_t p = begin; p < end; ++p) {
      if (avx512) {
        affine_run(in + p * inner, out + p * inner, inner, scale[c], shift[c]);
      } else {
        affine_run_avx2(in + p * inner, out + p * inner, inner, scale[c],
                        shift[c]);
      }
      if (++c == channels) c = 0;
    }
  });
}

void channel_affine_rows_f32(const float* in, float* out, int64_t rows,
                             int64_t channels, const float* scale,
                             const float* shift) {
  const int64_t grain =
      std::max<int64_t>(1, kGrain / std::max<int64_t>(channels, 1));
  const bool avx512 = avx512_kernels();
  parallel_chunks(rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      if (avx512) {
        affine_row(in + r * channels, out + r * channels, channels, scale,
                   shift);
      } else {
        affine_row_avx2(in + r * channels, out + r * channels, channels, scale,
                        shift);
      }
    }
  });
}

}  // namespace ember::kernels
