#include "ops/kernels/pooling/MaxPoolKernel.h"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>

#include "ember/runtime/cpu_features.h"
#include "ops/kernels/Avx2Lanes.h"
#include "ops/kernels/ParallelChunks.h"

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

// Lanes whose element `first + lane` lies in [0, width).
__mmask16 in_row(int64_t first, int64_t width) {
  const int64_t lo = std::clamp<int64_t>(-first, 0, 16);
  const int64_t hi = std::clamp<int64_t>(width - first, 0, 16);
  if (hi <= lo) return 0;
  const uint32_t upto_hi = hi >= 16 ? 0xffffu : (1u << hi) - 1u;
  return static_cast<__mmask16>(upto_hi & ~((1u << lo) - 1u));
}

// Up to kGroups blocks of 16 output columns at once: each block's running
// maximum is a chain of dependent compares and blends, so independent
// blocks interleaved keep the core busy.
constexpr int kGroups = 4;
// Window widths up to this read their taps with masked loads when the
// column stride is 1 or 2 (a gather costs ~30 cycles on Zen 5; a CNN's stem
// pool is 9 of them per 16 outputs); wider windows, dilated ones and other
// strides gather.
constexpr int64_t kMaxLoadedTaps = 8;

// Where tap kw of block g reads in every input row; the same for all rows.
struct Tap {
  __m512i column;       // input column per lane (for the index)
  int64_t first;        // column of lane 0 (loaded taps)
  __mmask16 valid;      // live lanes whose column is in bounds
  __mmask16 low, high;  // in-bounds elements of the two loads (stride 2)
};

__attribute__((target("avx512f"))) inline __m512 read_tap(const float* row,
                                                          const Tap& tap,
                                                          int64_t stride,
                                                          bool loaded,
                                                          __m512 fallback) {
  if (!loaded) {
    return _mm512_mask_i32gather_ps(fallback, tap.valid, tap.column, row, 4);
  }
  if (stride == 1) {
    return _mm512_mask_loadu_ps(fallback, tap.valid, row + tap.first);
  }
  // What the gather `row[first + 2 * lane]` returns, from two masked loads
  // (masked-off elements are never read) and one permute.
  const __m512i evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20,
                                          22, 24, 26, 28, 30);
  const __m512 lo = _mm512_maskz_loadu_ps(tap.low, row + tap.first);
  const __m512 hi = _mm512_maskz_loadu_ps(tap.high, row + tap.first + 16);
  return _mm512_mask_mov_ps(fallback, tap.valid,
                            _mm512_permutex2var_ps(lo, evens, hi));
}

// Tap kw of the block of 16 output columns from `ow0`.
__attribute__((target("avx512f"))) Tap plan_tap(const MaxPool2d& p,
                                                __m512i iw_start,
                                                __mmask16 live, int64_t ow0,
                                                int64_t kw) {
  Tap tap;
  tap.column = _mm512_add_epi32(
      iw_start, _mm512_set1_epi32(static_cast<int>(kw * p.dilation_w)));
  tap.valid = live &
              _mm512_cmpge_epi32_mask(tap.column, _mm512_setzero_si512()) &
              _mm512_cmplt_epi32_mask(
                  tap.column, _mm512_set1_epi32(static_cast<int>(p.width)));
  tap.first = ow0 * p.stride_w - p.pad_w + kw;
  tap.low = in_row(tap.first, p.width);
  tap.high = in_row(tap.first + 16, p.width);
  return tap;
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
  const int64_t stride = p.stride_w;
  const bool loaded = p.dilation_w == 1 && (stride == 1 || stride == 2) &&
                      p.kernel_w <= kMaxLoadedTaps;
  const int64_t taps_per_block = loaded ? p.kernel_w : 1;
  Tap taps[kMaxLoadedTaps][kGroups];
  for (int64_t ow_base = 0; ow_base < p.out_width; ow_base += 16 * kGroups) {
    __m512 best[kGroups];
    __m512i best_index[kGroups];
    __m512i iw_start[kGroups];
    __mmask16 live[kGroups];
    for (int g = 0; g < kGroups; ++g) {
      const int64_t ow0 = ow_base + 16 * g;
      const int64_t lanes = std::clamp<int64_t>(p.out_width - ow0, 0, 16);
      live[g] = static_cast<__mmask16>((1u << lanes) - 1u);
      // Window starts per lane: iw_start = ow * stride - pad.
      iw_start[g] = _mm512_sub_epi32(
          _mm512_mullo_epi32(
              _mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int>(ow0))),
              _mm512_set1_epi32(static_cast<int>(stride))),
          _mm512_set1_epi32(static_cast<int>(p.pad_w)));
      // First in-bounds column per lane (only padding makes it negative,
      // and the padding is at most half the window: add dilation while
      // negative).
      __m512i iw_first = iw_start[g];
      for (int64_t step = 0; step < p.kernel_w; ++step) {
        const __mmask16 negative =
            _mm512_cmplt_epi32_mask(iw_first, _mm512_setzero_si512());
        if (!negative) break;
        iw_first = _mm512_mask_add_epi32(
            iw_first, negative, iw_first,
            _mm512_set1_epi32(static_cast<int>(p.dilation_w)));
      }
      best[g] = _mm512_set1_ps(-__builtin_inff());
      best_index[g] = _mm512_add_epi32(
          _mm512_set1_epi32(static_cast<int>(ih_first * p.width)), iw_first);
    }
    if (loaded) {
      for (int64_t kw = 0; kw < p.kernel_w; ++kw) {
        for (int g = 0; g < kGroups; ++g) {
          taps[loaded ? kw : 0][g] =
              plan_tap(p, iw_start[g], live[g], ow_base + 16 * g, kw);
        }
      }
    }
    for (int64_t ih = ih_first; ih < ih_end; ih += p.dilation_h) {
      const float* row = plane + ih * p.width;
      const __m512i row_base =
          _mm512_set1_epi32(static_cast<int>(ih * p.width));
      for (int64_t kw = 0; kw < p.kernel_w; ++kw) {
        if (!loaded) {
          for (int g = 0; g < kGroups; ++g) {
            taps[loaded ? kw : 0][g] =
                plan_tap(p, iw_start[g], live[g], ow_base + 16 * g, kw);
          }
        }
        const Tap* block = taps[std::min(kw, taps_per_block - 1)];
#pragma GCC unroll 4
        for (int g = 0; g < kGroups; ++g) {
          const __m512 v = read_tap(row, block[g], stride, loaded, best[g]);
          const __mmask16 take =
              block[g].valid & (_mm512_cmp_ps_mask(v, best[g], _CMP_GT_OQ) |
                                _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q));
          best[g] = _mm512_mask_mov_ps(best[g], take, v);
          best_index[g] = _mm512_mask_mov_epi32(
              best_index[g], take, _mm512_add_epi32(row_base, block[g].column));
        }
      }
    }
    for (int g = 0; g < kGroups; ++g) {
      const int64_t ow0 = ow_base + 16 * g;
      _mm512_mask_storeu_ps(out + ow0, live[g], best[g]);
      const __m512i lo =
          _mm512_cvtepi32_epi64(_mm512_castsi512_si256(best_index[g]));
      const __m512i hi =
          _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(best_index[g], 1));
      _mm512_mask_storeu_epi64(indices + ow0, static_cast<__mmask8>(live[g]),
                               lo);
      _mm512_mask_storeu_epi64(indices + ow0 + 8,
                               static_cast<__mmask8>(live[g] >> 8), hi);
    }
  }
}

// --- The same kernel for AVX2 CPUs: 8 output columns per block, lane
// masks as vectors (all ones: live), the same compares in the same order,
// so the same values and indices (CPU's).

struct Tap8 {
  __m256i column;     // input column per lane
  int64_t first;      // column of lane 0 (loaded taps)
  __m256i valid;      // live lanes whose column is in bounds
  __m256i low, high;  // in-bounds elements of the two loads (stride 2)
};

// Lanes whose element `first + lane` lies in [0, width).
__attribute__((target("avx2"))) inline __m256i in_row8(int64_t first,
                                                       int64_t width) {
  const __m256i column =
      _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                       _mm256_set1_epi32(static_cast<int>(std::clamp<int64_t>(
                           first, -(int64_t{1} << 30), int64_t{1} << 30))));
  return _mm256_andnot_si256(
      _mm256_cmpgt_epi32(_mm256_setzero_si256(), column),
      _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(width)), column));
}

__attribute__((target("avx2"))) inline __m256 read_tap8(const float* row,
                                                        const Tap8& tap,
                                                        int64_t stride,
                                                        bool loaded) {
  // Lanes outside `valid` are never taken, whatever they hold.
  if (!loaded) {
    return _mm256_mask_i32gather_ps(_mm256_setzero_ps(), row, tap.column,
                                    _mm256_castsi256_ps(tap.valid), 4);
  }
  if (stride == 1) return _mm256_maskload_ps(row + tap.first, tap.valid);
  // row[first + 2 * lane]: the even elements of two masked loads.
  const __m256 lo = _mm256_maskload_ps(row + tap.first, tap.low);
  const __m256 hi = _mm256_maskload_ps(row + tap.first + 8, tap.high);
  return _mm256_castpd_ps(_mm256_permute4x64_pd(
      _mm256_castps_pd(_mm256_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0))),
      0xd8));
}

__attribute__((target("avx2"))) Tap8 plan_tap8(const MaxPool2d& p,
                                               __m256i iw_start, __m256i live,
                                               int64_t ow0, int64_t kw) {
  Tap8 tap;
  tap.column = _mm256_add_epi32(
      iw_start, _mm256_set1_epi32(static_cast<int>(kw * p.dilation_w)));
  const __m256i in_bounds = _mm256_andnot_si256(
      _mm256_cmpgt_epi32(_mm256_setzero_si256(), tap.column),
      _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(p.width)),
                         tap.column));
  tap.valid = _mm256_and_si256(live, in_bounds);
  tap.first = ow0 * p.stride_w - p.pad_w + kw;
  tap.low = in_row8(tap.first, p.width);
  tap.high = in_row8(tap.first + 8, p.width);
  return tap;
}

__attribute__((target("avx2"))) void output_row_avx2(const MaxPool2d& p,
                                                     const float* plane,
                                                     int64_t oh, float* out,
                                                     int64_t* indices) {
  const int64_t ih_start = oh * p.stride_h - p.pad_h;
  const int64_t ih_end =
      std::min(ih_start + (p.kernel_h - 1) * p.dilation_h + 1, p.height);
  const int64_t ih_first = first_in_bounds(ih_start, p.dilation_h);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const int64_t stride = p.stride_w;
  const bool loaded = p.dilation_w == 1 && (stride == 1 || stride == 2) &&
                      p.kernel_w <= kMaxLoadedTaps;
  const int64_t taps_per_block = loaded ? p.kernel_w : 1;
  Tap8 taps[kMaxLoadedTaps][kGroups];
  for (int64_t ow_base = 0; ow_base < p.out_width; ow_base += 8 * kGroups) {
    __m256 best[kGroups];
    __m256i best_index[kGroups];
    __m256i iw_start[kGroups];
    __m256i live[kGroups];
    for (int g = 0; g < kGroups; ++g) {
      const int64_t ow0 = ow_base + 8 * g;
      live[g] = kernels::lane_mask(p.out_width - ow0);
      iw_start[g] = _mm256_sub_epi32(
          _mm256_mullo_epi32(
              _mm256_add_epi32(lane, _mm256_set1_epi32(static_cast<int>(ow0))),
              _mm256_set1_epi32(static_cast<int>(stride))),
          _mm256_set1_epi32(static_cast<int>(p.pad_w)));
      __m256i iw_first = iw_start[g];
      for (int64_t step = 0; step < p.kernel_w; ++step) {
        const __m256i negative =
            _mm256_cmpgt_epi32(_mm256_setzero_si256(), iw_first);
        if (_mm256_testz_si256(negative, negative)) break;
        iw_first = _mm256_add_epi32(
            iw_first,
            _mm256_and_si256(
                negative, _mm256_set1_epi32(static_cast<int>(p.dilation_w))));
      }
      best[g] = _mm256_set1_ps(-__builtin_inff());
      best_index[g] = _mm256_add_epi32(
          _mm256_set1_epi32(static_cast<int>(ih_first * p.width)), iw_first);
    }
    if (loaded) {
      for (int64_t kw = 0; kw < p.kernel_w; ++kw) {
        for (int g = 0; g < kGroups; ++g) {
          taps[kw][g] = plan_tap8(p, iw_start[g], live[g], ow_base + 8 * g, kw);
        }
      }
    }
    for (int64_t ih = ih_first; ih < ih_end; ih += p.dilation_h) {
      const float* row = plane + ih * p.width;
      const __m256i row_base =
          _mm256_set1_epi32(static_cast<int>(ih * p.width));
      for (int64_t kw = 0; kw < p.kernel_w; ++kw) {
        if (!loaded) {
          for (int g = 0; g < kGroups; ++g) {
            taps[0][g] =
                plan_tap8(p, iw_start[g], live[g], ow_base + 8 * g, kw);
          }
        }
        const Tap8* block = taps[std::min(kw, taps_per_block - 1)];
#pragma GCC unroll 4
        for (int g = 0; g < kGroups; ++g) {
          const __m256 v = read_tap8(row, block[g], stride, loaded);
          const __m256 take =
              _mm256_and_ps(_mm256_castsi256_ps(block[g].valid),
                            _mm256_or_ps(_mm256_cmp_ps(v, best[g], _CMP_GT_OQ),
                                         _mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
          best[g] = _mm256_blendv_ps(best[g], v, take);
          best_index[g] = _mm256_castps_si256(_mm256_blendv_ps(
              _mm256_castsi256_ps(best_index[g]),
              _mm256_castsi256_ps(_mm256_add_epi32(row_base, block[g].column)),
              take));
        }
      }
    }
    for (int g = 0; g < kGroups; ++g) {
      const int64_t ow0 = ow_base + 8 * g;
      if (ow0 >= p.out_width) break;
      kernels::store_lanes(out + ow0, p.out_width - ow0, live[g], best[g]);
      const __m256i lo =
          _mm256_cvtepi32_epi64(_mm256_castsi256_si128(best_index[g]));
      const __m256i hi =
          _mm256_cvtepi32_epi64(_mm256_extracti128_si256(best_index[g], 1));
      auto* at = reinterpret_cast<long long*>(indices + ow0);
      if (p.out_width - ow0 >= 8) {  // plain stores: see store_lanes
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(at), lo);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(at + 4), hi);
        continue;
      }
      _mm256_maskstore_epi64(
          at, _mm256_cvtepi32_epi64(_mm256_castsi256_si128(live[g])), lo);
      _mm256_maskstore_epi64(
          at + 4, _mm256_cvtepi32_epi64(_mm256_extracti128_si256(live[g], 1)),
          hi);
    }
  }
}

bool avx512_kernels() {
  static const bool avx512 = runtime::cpu_features().avx512f;
  return avx512;
}

}  // namespace

bool supported() {
  static const bool supported =
      avx512_kernels() || runtime::cpu_features().avx2;
  return supported;
}

void max_pool2d_forward(const MaxPool2d& p, const float* in, float* out,
                        int64_t* indices) {
  const int64_t rows = p.planes * p.out_height;
  const int64_t out_plane = p.out_height * p.out_width;
  const bool avx512 = avx512_kernels();
  parallel_chunks(rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t plane = r / p.out_height;
      const int64_t oh = r % p.out_height;
      const int64_t offset = plane * out_plane + oh * p.out_width;
      if (avx512) {
        output_row(p, in + plane * p.height * p.width, oh, out + offset,
                   indices + offset);
      } else {
        output_row_avx2(p, in + plane * p.height * p.width, oh, out + offset,
                        indices + offset);
      }
    }
  });
}

}  // namespace ember::kernels::pooling
