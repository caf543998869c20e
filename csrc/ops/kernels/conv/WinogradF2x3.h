// 3x3 stride-1 convolutions of NCHW images by Winograd's minimal filtering
// F(2x2, 3x3) (Lavin & Gray, 2015): each 2x2 block of outputs (a tile) is
// computed from a 4x4 block of inputs with 16 multiplies per input channel
// instead of direct convolution's 36.
//
//   U = G g G^T    per (output channel, input channel): the 3x3 filter g as
//                  a 4x4 one (once per weight: a pack, Convolution.cpp)
//   V = B^T d B    per (input channel, tile): the tile's 4x4 inputs d
//   M = U V        16 GEMMs, one per position xi of the 4x4 transforms:
//                  M[xi] (K x P) = U[xi] (K x C) @ V[xi] (C x P), on the
//                  channel GEMM (matmul/ChannelGemm.h)
//   Y = A^T M A    per (output channel, tile): the 2x2 outputs
//
// Results differ from direct convolution's by rounding (the transforms add
// and subtract inputs and products before and after the sums over
// channels): a few float32 ulps of the output's magnitude. Every element is
// computed in the same order whatever the thread count (reproducible run to
// run). Plain C++ with AVX-512 intrinsics; no torch types.
#pragma once

#include <cstdint>

#include "ops/kernels/matmul/ChannelGemm.h"

namespace ember::conv {

// Whether this CPU runs the kernels (AVX-512F). Decided once from CPUID.
bool winograd_supported();

struct WinogradGeometry {
  int64_t images = 0;
  int64_t channels = 0;      // C: input channels
  int64_t out_channels = 0;  // K
  int64_t height = 0, width = 0;
  int64_t pad_h = 0, pad_w = 0;  // zero padding, at most 2 on each side

  int64_t out_h() const { return height + 2 * pad_h - 2; }
  int64_t out_w() const { return width + 2 * pad_w - 2; }
  int64_t tiles_h() const { return (out_h() + 1) / 2; }
  int64_t tiles_w() const { return (out_w() + 1) / 2; }
  // P: tiles of all images, the GEMMs' column count.
  int64_t tiles() const { return images * tiles_h() * tiles_w(); }
};

// Floats of the transformed filter of a K x C x 3 x 3 weight.
inline int64_t winograd_filter_floats(int64_t out_channels, int64_t channels) {
  return 16 * out_channels * channels;
}

// U (16 x K x C, position-major) of a contiguous K x C x 3 x 3 weight.
void winograd_transform_filter(const float* weight, int64_t out_channels,
                               int64_t channels, float* filter);

// Floats of the transformed inputs and products (V and M) of `images`
// images of geometry g: the scratch a call holds while it runs.
int64_t winograd_buffer_floats(const WinogradGeometry& g, int64_t images);
// A call runs its images in groups whose scratch takes at most this many
// floats (8 MiB), one image at least.
inline constexpr int64_t winograd_group_floats = int64_t{1} << 21;

// out (N x K x out_h x out_w, contiguous) = the convolution of `input`
// (N x C x H x W, contiguous) with the filter U transformed above, plus
// `bias` (K values) when not null, then `epilogue`'s steps (null: none;
// matmul/ChannelGemm.h, rows = output channels) applied to each output row
// while it is in registers; out is then stored only if the epilogue says so.
void winograd_conv(const WinogradGeometry& g, const float* input,
                   const float* filter, const float* bias, float* out,
                   const matmul::ChannelEpilogue* epilogue = nullptr);

}  // namespace ember::conv
