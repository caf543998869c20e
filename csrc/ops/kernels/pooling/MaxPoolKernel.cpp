#include "ops/kernels/pooling/MaxPoolKernel.h"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>

#include "ember/runtime/cpu_features.h"

// GCC 12 reports its own intrinsics' deliberately undefined register
// operands (_mm512_undefined_*) as uninitialised.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace ember::kernels::pooling {
namespace {

// The first in-bounds tap of a window starting at `start` (CPU's rule).
int64_t first_in_bounds(int64_t start, int64_t dilation) {
  while (start < 0) start += dilation;
  return start;
}

__attribute__((target("avx512f"))) void output_row(const MaxPool2d& p,
                                                   const float* plane,
                                                   int64_t oh, float* out,
                                                   int64_t* indices) {
  const int64_t ih_start = oh * p.stride_h - p.pad_h;
  const int64_t ih_end =
      std::min(ih_start + (p.kernel_h - 1) * p.dilation_h + 1, p.height);
  const int64_t ih_first = first_in_bounds(ih_start, p.dilation_h);
  const __m512i lane =
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i width = _mm512_set1_epi32(static_cast<int>(p.width));
  for (int64_t ow0 = 0; ow0 < p.out_width; ow0 += 16) {
    const int64_t lanes = std::min<int64_t>(16, p.out_width - ow0);
    const __mmask16 live = static_cast<__mmask16>((1u << lanes) - 1u);
    // Window starts per lane: iw_start = ow * stride - pad.
    const __m512i iw_start = _mm512_sub_epi32(
        _mm512_mullo_epi32(
            _mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int>(ow0))),
            _mm512_set1_epi32(static_cast<int>(p.stride_w))),
        _mm512_set1_epi32(static_cast<int>(p.pad_w)));
    // First in-bounds column per lane (only padding makes it negative, and
    // the padding is at most half the window, so one step of dilation
    // loops suffices per lane: add dilation while negative).
    __m512i iw_first = iw_start;
    for (int64_t step = 0; step < p.kernel_w; ++step) {
      const __mmask16 negative =
          _mm512_cmplt_epi32_mask(iw_first, _mm512_setzero_si512());
      if (!negative) break;
      iw_first = _mm512_mask_add_epi32(
          iw_first, negative, iw_first,
          _mm512_set1_epi32(static_cast<int>(p.dilation_w)));
    }
    __m512 best = _mm512_set1_ps(-__builtin_inff());
    __m512i best_index = _mm512_add_epi32(
        _mm512_set1_epi32(static_cast<int>(ih_first * p.width)), iw_first);
    for (int64_t ih = ih_first; ih < ih_end; ih += p.dilation_h) {
      const float* row = plane + ih * p.width;
      const __m512i row_base =
          _mm512_set1_epi32(static_cast<int>(ih * p.width));
      for (int64_t kw = 0; kw < p.kernel_w; ++kw) {
        const __m512i iw = _mm512_add_epi32(
            iw_start, _mm512_set1_epi32(static_cast<int>(kw * p.dilation_w)));
        const __mmask16 valid =
            live & _mm512_cmpge_epi32_mask(iw, _mm512_setzero_si512()) &
            _mm512_cmplt_epi32_mask(iw, width);
        const __m512 v = _mm512_mask_i32gather_ps(best, valid, iw, row, 4);
        const __mmask16 take =
            valid & (_mm512_cmp_ps_mask(v, best, _CMP_GT_OQ) |
                     _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q));
        best = _mm512_mask_mov_ps(best, take, v);
        best_index = _mm512_mask_mov_epi32(best_index, take,
                                           _mm512_add_epi32(row_base, iw));
      }
    }
    _mm512_mask_storeu_ps(out + ow0, live, best);
    const __m512i lo =
        _mm512_cvtepi32_epi64(_mm512_castsi512_si256(best_index));
    const __m512i hi =
        _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(best_index, 1));
    _mm512_mask_storeu_epi64(indices + ow0, static_cast<__mmask8>(live), lo);
    _mm512_mask_storeu_epi64(indices + ow0 + 8,
                             static_cast<__mmask8>(live >> 8), hi);
  }
}

}  // namespace

bool supported() {
  static const bool avx512 = runtime::cpu_features().avx512f;
  return avx512;
}

void max_pool2d_forward(const MaxPool2d& p, const float* in, float* out,
                        int64_t* indices) {
  const int64_t rows = p.planes * p.out_height;
  const int64_t out_plane = p.out_height * p.out_width;
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t plane = r / p.out_height;
      const int64_t oh = r % p.out_height;
      const int64_t offset = plane * out_plane + oh * p.out_width;
      output_row(p, in + plane * p.height * p.width, oh, out + offset,
                 indices + offset);
    }
  });
}

}  // namespace ember::kernels::pooling
