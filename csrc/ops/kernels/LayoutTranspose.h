// Re-laying activations between memory formats, faster than ATen's strided
// copy (which walks channels-last with a stride of C per element: ~1 GB/s).
#pragma once

#include <cstdint>

namespace ember::kernels {

// dst (N, C, H*W) = src (N, H*W, C): a channels-last batch of images laid
// out as NCHW. Both contiguous; `hw` is H*W.
void channels_last_to_contiguous(const float* src, float* dst, int64_t n,
                                 int64_t c, int64_t hw);
// The reverse: dst (N, H*W, C) = src (N, C, H*W).
inline void contiguous_to_channels_last(const float* src, float* dst, int64_t n,
                                        int64_t c, int64_t hw) {
  // The same per-image transpose with the two matrix sides swapped.
  channels_last_to_contiguous(src, dst, n, hw, c);
}

// dst (C, Ho, Wo) = src (C, H, W)[:, ::stride_h, ::stride_w] for one
// contiguous image: the pixels a 1x1 convolution of that stride reads
// (Ho = (H - 1) / stride_h + 1, Wo likewise).
void subsample_planes(const float* src, float* dst, int64_t c, int64_t h,
                      int64_t w, int64_t stride_h, int64_t stride_w);

// dst[j * dst_stride + i] = src[i * src_stride + j] for i, j < 16, in
// AVX-512 registers (callers check runtime::cpu_features().avx512f).
void transpose_16x16(const float* src, int64_t src_stride, float* dst,
                     int64_t dst_stride);

}  // namespace ember::kernels
