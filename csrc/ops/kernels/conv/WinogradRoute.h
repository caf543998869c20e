// ember's route for 3x3 stride-1 fp32 convolutions of NCHW images: Winograd's
// F(2x2, 3x3) (WinogradF2x3.h) on the weight's transformed filter, kept as a
// pack (matmul/PackedWeights.h: made on the weight's second call, dropped
// when it is written or freed). Part of the default route: never under
// cpu_parity, deterministic or a bf16 conv precision (Convolution.cpp asks
// first).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

namespace ember::kernels {

// Whether the route takes this convolution (shape, layout and sizes; the
// flags are the caller's to check).
bool winograd_route_applies(const at::Tensor& input, const at::Tensor& weight,
                            const std::vector<int64_t>& stride,
                            const std::vector<int64_t>& padding,
                            const std::vector<int64_t>& dilation,
                            int64_t groups);

// The convolution on the route, or nullopt while the weight has no pack yet
// (the caller runs another route).
std::optional<at::Tensor> winograd_convolution(
    const at::Tensor& input, const at::Tensor& weight,
    const std::optional<at::Tensor>& bias, const std::vector<int64_t>& padding);

}  // namespace ember::kernels
