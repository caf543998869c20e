// ember's own route for the matmul family (mm, addmm, bmm, baddbmm) when a
// torch.backends.ember switch asks for something ATen's CPU kernel does not
// do: reduced fp32 precision (bf16, bf16x3), a forced BLAS library,
// autotuning between libraries, or thread-count-independent determinism.
// Works on CPU tensors (the aliases of ember tensors).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>

#include <string>

namespace ember::matmul {

// Whether the current switches route a matmul on `a`'s dtype through the
// engine; false means ATen's CPU kernel, unchanged (the default).
bool engine_applies(const at::Tensor& a);

// out = beta * self + alpha * (a @ b); 2-D (MxK @ KxN) or 3-D batched.
// `out` has its final shape; `self` (may be undefined) broadcasts to it.
void gemm(const char* op, const at::Tensor& out, const at::Tensor& a,
          const at::Tensor& b, const at::Tensor& self, const at::Scalar& beta,
          const at::Scalar& alpha);

// The engine's last choice on this thread ("onednn/bf16", "mkl/ieee/tiled"),
// for verbose output.
const std::string& last_route();

}  // namespace ember::matmul
