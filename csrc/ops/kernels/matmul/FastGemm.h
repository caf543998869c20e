// ember's default route for Linear-shaped fp32 GEMMs (mm, addmm with a row
// bias) when CPU parity is off: B packed once (PackedWeights.h), then
//   M <= 16  the skinny kernel streaming packed panels (SkinnyGemm.h),
//            fp32, or bf16 panels under "medium" fp32 precision;
//   M > 16   fp32: MKL's packed GEMM on Intel CPUs, ember's panel kernel
//            on the same panels elsewhere (oneDNN without AVX-512);
//            bf16 operands and "medium": oneDNN's matmul on its blocked
//            weight, bias fused.
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

// Which packed GEMM runs fp32 GEMMs of more than 16 rows here: "mkl"
// (Intel CPUs), "panels" (ember's panel kernel, other AVX-512 CPUs) or
// "onednn"; the prefix of the route names verbose output shows.
const char* tall_gemm_library();

// An activation applied to a GEMM's result.
enum class Epilogue { kNone, kRelu, kGeluErf, kGeluTanh };

// act(bias + a @ b) on the packed weight: one oneDNN call with the
// activation as a post-op, or (MKL, fp32 panels) the activation applied to
// the product in place with the unfused ops' kernels; nullopt for a call
// no packed fp32 route takes.
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
