// 2-D max pooling over NCHW fp32 planes with CPU's exact semantics (the
// first maximum's index wins, NaN propagates, the index of an all -inf
// window is its first in-bounds position), so values and indices equal
// CPU's bit for bit. CPU's NCHW kernel is scalar (~27 cycles an output on
// ResNet's 3x3/2 stem pool); this one takes 16 output columns per step,
// their window taps read with masked loads (column stride 1 or 2, no
// dilation) or gathers (any other geometry); on AVX2 CPUs 8 columns per
// step, the same compares (the same values and indices).
#pragma once

#include <cstdint>

namespace ember::kernels::pooling {

struct MaxPool2d {
  int64_t planes = 0, height = 0, width = 0;  // input: planes x H x W
  int64_t out_height = 0, out_width = 0;
  int64_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0, dilation_h = 1, dilation_w = 1;
};

bool supported();  // AVX-512F, or AVX2

// out / indices: planes x out_height x out_width, contiguous.
void max_pool2d_forward(const MaxPool2d& p, const float* in, float* out,
                        int64_t* indices);

}  // namespace ember::kernels::pooling
