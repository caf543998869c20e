// Re-laying activations between memory formats, faster than ATen's strided
// copy (which walks channels-last with a stride of C per element: ~1 GB/s).
#pragma once

#include <cstdint>

#include "ops/kernels/matmul/ChannelGemm.h"

namespace ember::kernels {

// dst (N, C, H*W) = src (N, H*W, C): a channels-last batch of images laid
// out as NCHW. Both contiguous; `hw` is H*W.
void channels_last_to_contiguous(const float* src, float* dst, int64_t n,
                                 int64_t c, int64_t hw);
// The same, with `epilogue`'s steps (matmul/ChannelGemm.h: rows = channels,
// addresses in dst's layout from image 0) applied to each block of the
// result right after it is re-laid, while it is in cache; dst itself is
// written only where epilogue->store_product (else the block goes to a
// per-thread scratch). A held oneDNN convolution's result takes its batch
// norm, residual add and ReLU this way (ConvEpilogue.h).
void channels_last_to_contiguous(const float* src, float* dst, int64_t n,
                                 int64_t c, int64_t hw,
                                 const matmul::ChannelEpilogue* epilogue);
// The reverse: dst (N, H*W, C) = src (N, C, H*W).
inline void contiguous_to_channels_last(const float* src, float* dst, int64_t n,
                                        int64_t c, int64_t hw) {
  // The same per-image transpose with the two matrix sides swapped.
  channels_last_to_contiguous(src, dst, n, hw, c);
}

// A convolution's input window geometry for one image (C, H, W).
struct ConvWindow {
  int64_t channels = 0, height = 0, width = 0;
  int64_t kernel_h = 1, kernel_w = 1;
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t out_h() const {
    return (height + 2 * pad_h - dilation_h * (kernel_h - 1) - 1) / stride_h +
           1;
  }
  int64_t out_w() const {
    return (width + 2 * pad_w - dilation_w * (kernel_w - 1) - 1) / stride_w + 1;
  }
};

// im2col: one contiguous image's pixels as the columns a GEMM with the
// convolution's weight (Cout x C*kh*kw, row-major as the weight is) reads.
// dst (C*kh*kw, Ho*Wo): row (c, ky, kx), column (oy, ox) is
// src[c][oy*sh - ph + ky*dh][ox*sw - pw + kx*dw], zero outside the image.
void im2col(const float* src, float* dst, const ConvWindow& window);

// Whether the transposes run in registers here (AVX-512F: 16 x 16 tiles;
// AVX2: 8 x 8 ones). Elsewhere they are element by element.
bool layout_transposes_supported();

// dst[j * dst_stride + i] = src[i * src_stride + j] for i, j < 16, in
// registers where layout_transposes_supported().
void transpose_16x16(const float* src, int64_t src_stride, float* dst,
                     int64_t dst_stride);

}  // namespace ember::kernels
