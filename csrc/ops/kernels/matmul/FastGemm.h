// ember's default route for Linear-shaped fp32 GEMMs (mm, addmm with a row
// bias) when CPU parity is off: B packed once (PackedWeights.h), then
//   M <= 16  the skinny kernel streaming packed panels (SkinnyGemm.h),
//            fp32, or bf16 panels under "medium" fp32 precision;
//   M > 16   oneDNN's matmul on its blocked weight, bias fused.
// Takes ember tensors. Returns nullopt for a call it does not take (other
// switches, shapes, dtypes, a B not packed yet): the caller's route runs.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>

#include <optional>

namespace ember::matmul {

// out = bias + a @ b; `bias` may be undefined (mm).
std::optional<at::Tensor> fast_linear(const at::Tensor& bias,
                                      const at::Tensor& a, const at::Tensor& b,
                                      const at::Scalar& beta,
                                      const at::Scalar& alpha);

// An activation applied to a GEMM's result.
enum class Epilogue { kNone, kRelu, kGeluErf, kGeluTanh };

// act(bias + a @ b) in one oneDNN call on the packed weight (the activation
// applied to each output block while it is in cache), when the call takes
// the fp32 oneDNN route (more than 16 rows); nullopt otherwise.
std::optional<at::Tensor> fast_linear_epilogue(const at::Tensor& bias,
                                               const at::Tensor& a,
                                               const at::Tensor& b,
                                               Epilogue epilogue);

// The same into `out` (mm.out / addmm.out, as Inductor's generated code
// calls them); false, having done nothing, for a call it does not take.
bool fast_linear_out(const at::Tensor& out, const at::Tensor& bias,
                     const at::Tensor& a, const at::Tensor& b,
                     const at::Scalar& beta, const at::Scalar& alpha);

}  // namespace ember::matmul
