#include "ops/kernels/LayoutTranspose.h"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>

#include "ember/runtime/cpu_features.h"
#include "ops/kernels/AlignedFloats.h"
#include "ops/kernels/ParallelChunks.h"

// GCC 12 reports its own intrinsics' deliberately undefined register
// operands (_mm512_undefined_*) as uninitialised.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace ember::kernels {
namespace {

constexpr int64_t kTile = 16;

// One 16 x 16 tile: 16 pixels of 16 channels (rows `src_stride` apart) to
// 16 channels of 16 pixels (rows `dst_stride` apart), in registers.
__attribute__((target("avx512f"))) void transpose_tile_16x16(
    const float* src, int64_t src_stride, float* dst, int64_t dst_stride) {
  __m512 r[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * src_stride);
  __m512 t[16];
  // Fully unrolled, so r and t stay in the 32 zmm registers (a loop over
  // the arrays spilled them to the stack: 3x slower at -O2).
  // Interleave pairs of rows (32-bit), then pairs of pairs (64-bit), then
  // 128-bit lanes twice: the classic 4-stage 16 x 16 transpose.
#pragma GCC unroll 8
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_castpd_ps(
        _mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
    r[i + 1] = _mm512_castpd_ps(
        _mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
    r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]),
                                                   _mm512_castps_pd(t[i + 3])));
    r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]),
                                                   _mm512_castps_pd(t[i + 3])));
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
    r[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
    r[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xdd);
  }
  // r[k] now holds channel k of the 16 pixels.
#pragma GCC unroll 16
  for (int k = 0; k < 16; ++k) _mm512_storeu_ps(dst + k * dst_stride, r[k]);
}

// One 8 x 8 tile in AVX2 registers: pairs of rows interleaved, then pairs
// of pairs, then the 128-bit halves swapped across.
__attribute__((target("avx2"))) void transpose_tile_8x8(const float* src,
                                                        int64_t src_stride,
                                                        float* dst,
                                                        int64_t dst_stride) {
  __m256 r[8], t[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + i * src_stride);
#pragma GCC unroll 4
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
#pragma GCC unroll 2
  for (int i = 0; i < 8; i += 4) {
    r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
    r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
  }
  // r[0..3]: channels 0-3 (low half) and 4-7 (high) of pixels 0-3, r[4..7]
  // the same of pixels 4-7.
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    _mm256_storeu_ps(dst + k * dst_stride,
                     _mm256_permute2f128_ps(r[k], r[k + 4], 0x20));
    _mm256_storeu_ps(dst + (k + 4) * dst_stride,
                     _mm256_permute2f128_ps(r[k], r[k + 4], 0x31));
  }
}

void transpose_tile_scalar(const float* src, int64_t src_stride, float* dst,
                           int64_t dst_stride, int64_t rows, int64_t cols) {
  for (int64_t p = 0; p < rows; ++p) {
    for (int64_t ch = 0; ch < cols; ++ch) {
      dst[ch * dst_stride + p] = src[p * src_stride + ch];
    }
  }
}

// A tile of up to 16 x 16 on AVX2: its full 8 x 8 blocks in registers,
// the rest element by element.
void transpose_tile_avx2(const float* src, int64_t src_stride, float* dst,
                         int64_t dst_stride, int64_t rows, int64_t cols) {
  for (int64_t p0 = 0; p0 < rows; p0 += 8) {
    for (int64_t c0 = 0; c0 < cols; c0 += 8) {
      const float* s = src + p0 * src_stride + c0;
      float* d = dst + c0 * dst_stride + p0;
      if (rows - p0 >= 8 && cols - c0 >= 8) {
        transpose_tile_8x8(s, src_stride, d, dst_stride);
      } else {
        transpose_tile_scalar(s, src_stride, d, dst_stride,
                              std::min<int64_t>(8, rows - p0),
                              std::min<int64_t>(8, cols - c0));
      }
    }
  }
}

// dst[i] = src[2 i] for i < count: 16 outputs per two loads and a permute.
// The row holds at least 2 count - 1 elements, so the loads of src[2 i,
// 2 i + 32) stay inside it while i + 16 < count; the rest one by one.
__attribute__((target("avx512f"))) void even_elements(const float* src,
                                                      float* dst,
                                                      int64_t count) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20,
                                         22, 24, 26, 28, 30);
  int64_t i = 0;
  for (; i + 16 < count; i += 16) {
    const __m512 lo = _mm512_loadu_ps(src + 2 * i);
    const __m512 hi = _mm512_loadu_ps(src + 2 * i + 16);
    _mm512_storeu_ps(dst + i, _mm512_permutex2var_ps(lo, even, hi));
  }
  for (; i < count; ++i) dst[i] = src[2 * i];
}

}  // namespace

void im2col(const float* src, float* dst, const ConvWindow& g) {
  static const bool avx512 = runtime::cpu_features().avx512f;
  const int64_t out_h = g.out_h();
  const int64_t out_w = g.out_w();
  const int64_t taps = g.kernel_h * g.kernel_w;
  // Tasks: rows of output pixels, (channel, tap, output row) triples.
  parallel_chunks(
      g.channels * taps * out_h, 64, [&](int64_t begin, int64_t end) {
        for (int64_t task = begin; task < end; ++task) {
          const int64_t oy = task % out_h;
          const int64_t tap = task / out_h % taps;
          const int64_t channel = task / (out_h * taps);
          const int64_t ky = tap / g.kernel_w, kx = tap % g.kernel_w;
          float* d = dst + task * out_w;
          const int64_t iy = oy * g.stride_h - g.pad_h + ky * g.dilation_h;
          if (iy < 0 || iy >= g.height) {
            std::fill(d, d + out_w, 0.0f);
            continue;
          }
          const float* row = src + (channel * g.height + iy) * g.width;
          const int64_t ix0 = kx * g.dilation_w - g.pad_w;
          const int64_t ix_last = ix0 + (out_w - 1) * g.stride_w;
          if (avx512 && g.stride_w == 2 && ix0 >= 0 && ix_last < g.width) {
            even_elements(row + ix0, d, out_w);
            continue;
          }
          for (int64_t ox = 0; ox < out_w; ++ox) {
            const int64_t ix = ix0 + ox * g.stride_w;
            d[ox] = ix >= 0 && ix < g.width ? row[ix] : 0.0f;
          }
        }
      });
}

void transpose_16x16(const float* src, int64_t src_stride, float* dst,
                     int64_t dst_stride) {
  static const bool avx512 = runtime::cpu_features().avx512f;
  if (avx512) {
    transpose_tile_16x16(src, src_stride, dst, dst_stride);
  } else if (layout_transposes_supported()) {
    transpose_tile_avx2(src, src_stride, dst, dst_stride, 16, 16);
  } else {
    transpose_tile_scalar(src, src_stride, dst, dst_stride, 16, 16);
  }
}

bool layout_transposes_supported() {
  static const bool supported =
      runtime::cpu_features().avx512f || runtime::cpu_features().avx2;
  return supported;
}

void channels_last_to_contiguous(const float* src, float* dst, int64_t n,
                                 int64_t c, int64_t hw) {
  channels_last_to_contiguous(src, dst, n, c, hw, nullptr);
}

void channels_last_to_contiguous(const float* src, float* dst, int64_t n,
                                 int64_t c, int64_t hw,
                                 const matmul::ChannelEpilogue* epilogue) {
  static const bool avx512 = runtime::cpu_features().avx512f;
  static const bool avx2 = !avx512 && layout_transposes_supported();
  if (epilogue != nullptr && epilogue->count == 0) epilogue = nullptr;
  // Blocks of kBlock pixels x kBlock channels, their 16 x 16 tiles channel
  // by channel: each block's reads and writes stay within a few KB of rows,
  // in either direction of use (the row-by-row order ran 3x slower for a
  // 256-row source). Blocks are the parallel tasks, so small images and few
  // channels still use every thread.
  constexpr int64_t kBlock = 128;
  const int64_t pixel_blocks = (hw + kBlock - 1) / kBlock;
  const int64_t channel_blocks = (c + kBlock - 1) / kBlock;
  const int64_t per_image = pixel_blocks * channel_blocks;
  const bool to_scratch = epilogue != nullptr && !epilogue->store_product;
  parallel_chunks(n * per_image, 1, [&](int64_t begin, int64_t end) {
    thread_local AlignedFloats scratch;
    float* block = to_scratch ? scratch.resize(kBlock * kBlock) : nullptr;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t image = t / per_image;
      const int64_t pb = (t % per_image) / channel_blocks * kBlock;
      const int64_t cb = (t % per_image) % channel_blocks * kBlock;
      const int64_t pe = std::min(hw, pb + kBlock);
      const int64_t ce = std::min(c, cb + kBlock);
      const float* s = src + image * hw * c;
      // Where the block's (channel, pixel) goes: dst, or the scratch block.
      const int64_t ld = to_scratch ? kBlock : hw;
      const auto place = [&](int64_t channel, int64_t pixel) {
        return to_scratch ? block + (channel - cb) * kBlock + (pixel - pb)
                          : dst + image * hw * c + channel * hw + pixel;
      };
      for (int64_t c0 = cb; c0 < ce; c0 += kTile) {
        const int64_t cols = std::min(kTile, c - c0);
        for (int64_t p0 = pb; p0 < pe; p0 += kTile) {
          const int64_t rows = std::min(kTile, hw - p0);
          if (avx512 && rows == kTile && cols == kTile) {
            transpose_tile_16x16(s + p0 * c + c0, c, place(c0, p0), ld);
          } else if (avx2) {
            transpose_tile_avx2(s + p0 * c + c0, c, place(c0, p0), ld, rows,
                                cols);
          } else {
            transpose_tile_scalar(s + p0 * c + c0, c, place(c0, p0), ld, rows,
                                  cols);
          }
        }
      }
      if (epilogue == nullptr) continue;
      for (int64_t p0 = pb; p0 < pe; p0 += matmul::kChannelEpilogueColumns) {
        const int64_t columns =
            std::min(matmul::kChannelEpilogueColumns, pe - p0);
        matmul::apply_channel_epilogue(*epilogue, place(cb, p0), ld,
                                       image * hw * c + cb * hw + p0, hw, cb,
                                       ce - cb, columns);
      }
    }
  });
}

}  // namespace ember::kernels
