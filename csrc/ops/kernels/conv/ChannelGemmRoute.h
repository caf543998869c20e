// ember's route for unpadded 1x1 fp32 convolutions of NCHW images: the
// channel GEMM (matmul/ChannelGemm.h) on the image's own layout. Part of the
// default route: never under cpu_parity, deterministic or a bf16 conv
// precision (Convolution.cpp asks first).
//
// A contiguous NCHW input and weight, per image: out (Cout x HW) = W (Cout x
// Cin) @ x (Cin x HW), on the NCHW layout itself (no re-layouts, the weight
// read as it is: no pack to keep fresh).
//  - stride 1: x is the image itself.
//  - strided (ResNet's downsampling shortcuts): x is the pixels the
//    convolution reads, gathered image by image. oneDNN ran ResNet-50's
//    three at 116-154 GFLOP/s against ~200 here.
// Outputs of at least one 16-pixel panel; smaller ones stay on oneDNN (on
// AVX2 too since its dot-product tails: ResNet-50's 7x7-output 1x1 layers
// 0.89-0.95x oneDNN's time, docs/backends.md "AVX2 CPUs").
// Other windows take oneDNN's pack whatever the image: ResNet-50's 3x3
// layers on 7x7 outputs ran here on their im2col columns until in-process
// A/B on Zen 4 (2026-11-28, 2 cores, medians of 20 x 10 calls, three runs)
// gave oneDNN's packed route 0.72x (512 channels, 7x7 in) and 0.82x (stride
// 2, 14x14 in) this route's time, and ResNet-50 eager 49.8 against 50.9 ms
// (32 of 40 alternating runs faster); an earlier A/B on that host kind had
// found this route ahead (1.26 against 1.48 ms) in other minutes.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

namespace ember::kernels {

// Whether the route takes this convolution (shape, layout and sizes; the
// flags are the caller's to check).
bool channel_gemm_route_applies(const at::Tensor& input,
                                const at::Tensor& weight,
                                const std::vector<int64_t>& stride,
                                const std::vector<int64_t>& padding,
                                const std::vector<int64_t>& dilation,
                                int64_t groups);

// The convolution on the route: held for its epilogue where
// holds_convolutions() (ConvEpilogue.h), else launched or run at the call.
at::Tensor channel_gemm_convolution(const at::Tensor& input,
                                    const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias,
                                    const std::vector<int64_t>& stride,
                                    const std::vector<int64_t>& padding,
                                    const std::vector<int64_t>& dilation);

}  // namespace ember::kernels
