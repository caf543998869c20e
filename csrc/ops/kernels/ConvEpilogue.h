// Convolution epilogues: a channel-GEMM convolution (1x1, matmul/
// ChannelGemm.h) or a Winograd one (3x3, conv/WinogradF2x3.h: the steps run
// on each output row) launched with asynchronous execution on is held on its
// stream (runtime HeldWork) instead of run, and the ops that follow it over
// its result -- inference batch norm, a residual add (out of place or in
// place), ReLU: ResNet's conv -> bn -> relu and bn -> += -> relu -- join it
// as epilogue steps. When the stream is next used for anything else, the
// convolution runs once with the steps applied to each output block while
// it is in cache; a step's result (the product's too) is written to memory
// only where someone besides the held work still holds it (a Python
// temporary is gone by then).
//
// Each step is the arithmetic of the op's own kernel (batch norm's multiply
// then add, CPU's clamp_min for ReLU, one add), so the bits are the ops'
// run one by one. Same switch as elementwise chains:
// torch.backends.ember.fuse_elementwise (EMBER_FUSE_ELEMENTWISE=0: off).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "ops/kernels/matmul/ChannelGemm.h"

namespace ember::kernels {

// Whether a convolution is held now: the switch is on, ops are launched
// (asynchronous execution, not cpu_parity, no verbose output), no graph
// captures, and the CPU has AVX-512F or AVX2 + FMA (the epilogue kernels).
bool holds_convolutions();

// Computes the held convolution into `product` (the data of the tensor
// given to hold_convolution) with `epilogue` (null: none) applied to its
// blocks; the epilogue's pointers address image 0 in the product's layout.
using ConvolutionKernel = std::function<void(
    float* product, const matmul::ChannelEpilogue* epilogue)>;

// Holds `kernel` on the current stream of product's device (submitting any
// work held before), its result `product` (allocated by the caller, NCHW
// contiguous fp32). Only where holds_convolutions(). `name` (static) names the
// work in launch_stats.
void hold_convolution(const std::string& name, const at::Tensor& product,
                      ConvolutionKernel kernel);

// Each joins the held convolution whose latest result is `input` (the same
// memory, contiguous, the product's sizes) and returns the step's result
// (allocated now, computed when the convolution runs), or nullopt when it
// cannot join: the caller then runs the op as usual.
std::optional<at::Tensor> epilogue_batch_norm(
    const at::Tensor& input, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, const at::Tensor& running_mean,
    const at::Tensor& running_var, double eps);
std::optional<at::Tensor> epilogue_relu(const at::Tensor& input);
// input + other, other contiguous fp32 of input's sizes.
std::optional<at::Tensor> epilogue_add(const at::Tensor& input,
                                       const at::Tensor& other);
// input += other in place; true when joined.
bool epilogue_add_(const at::Tensor& input, const at::Tensor& other);

// What held convolutions did since the last reset (in chain_stats()):
// convolutions run with at least one step, the steps they applied, and
// the results (product and steps) written to memory.
struct EpilogueStats {
  int64_t convolutions = 0;
  int64_t steps = 0;
  int64_t written = 0;
};
EpilogueStats epilogue_stats();
void reset_epilogue_stats();

}  // namespace ember::kernels
