// GEMM over the channels of NCHW images: out (M x N) = W (M x K) @ x (K x N)
// per image, with the weight on the left. A 1x1 convolution of a contiguous
// NCHW image is exactly this (K input channels, N = H*W pixels, M output
// channels), so it runs on the image's own layout: oneDNN's convolution
// wants channels-last and pays two re-layouts per call on NCHW tensors.
// Plain C++ with AVX-512 intrinsics; no torch types.
#pragma once

#include <cstdint>

namespace ember::matmul {

// Whether this CPU runs the kernel (AVX-512F). Decided once from CPUID.
bool channel_gemm_supported();

struct ChannelGemmArgs {
  const float* w = nullptr;  // M x K, row stride ldw, unit column stride
  int64_t ldw = 0;
  const float* x = nullptr;  // K x N per image, row stride ldx
  int64_t ldx = 0;
  int64_t x_image_stride = 0;
  const float* bias = nullptr;  // M values (one per output row), or null
  float* out = nullptr;         // M x N per image, row stride ldo
  int64_t ldo = 0;
  int64_t out_image_stride = 0;
  int64_t m = 0, k = 0, n = 0, images = 1;
};

// out[i] = w @ x[i] (+ bias per row) for every image i. Parallel over
// blocks of pixels and rows; every element's sum runs over k in order,
// whatever the thread count (reproducible run to run).
void channel_gemm_f32(const ChannelGemmArgs& args);

}  // namespace ember::matmul
