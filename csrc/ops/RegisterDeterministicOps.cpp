// Where ember's deterministic mode hooks in (flags::deterministic()).
// Registration only: kernels live in ops/kernels/Deterministic*.cpp
// (reductions and softmax in Ops, norms in Norms, boxed paths in Boxed);
// each is the plain CPU delegation while the mode is off. _softmax and gelu
// are registered in ops/kernels/HotOps.cpp, which points them at
// kernels::deterministic::softmax and ::gelu (and pow.Tensor_Scalar at the
// chunked elementwise path below).
#include <torch/library.h>

#include "ops/kernels/DeterministicOps.h"

namespace ember {
namespace {

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  namespace det = kernels::deterministic;
  // Reductions in a fixed order.
  m.impl("sum.dim_IntList", TORCH_FN(det::sum));
  m.impl("mean.dim", TORCH_FN(det::mean));
  m.impl("var.correction", TORCH_FN(det::var));
  m.impl("std.correction", TORCH_FN(det::std_dev));
  m.impl("var_mean.correction", TORCH_FN(det::var_mean));
  m.impl("std_mean.correction", TORCH_FN(det::std_mean));
  m.impl("linalg_vector_norm", TORCH_FN(det::linalg_vector_norm));
  m.impl("nansum", TORCH_FN(det::nansum));
  m.impl("norm.ScalarOpt_dim", TORCH_FN(det::norm));
  m.impl("mse_loss", TORCH_FN(det::mse_loss));
  m.impl("_softmax_backward_data", TORCH_FN(det::softmax_backward_data));
  m.impl("native_layer_norm_backward", TORCH_FN(det::layer_norm_backward));
  m.impl("native_group_norm", TORCH_FN(det::group_norm));
  m.impl("native_group_norm_backward", TORCH_FN(det::group_norm_backward));

  // Losses that reduce inside their CPU kernel.
  const auto loss = [] {
    return torch::CppFunction::makeFromBoxedFunction<&det::loss_reduction>();
  };
  m.impl("smooth_l1_loss", loss());
  m.impl("huber_loss", loss());
  m.impl("binary_cross_entropy", loss());
  m.impl("multi_margin_loss", loss());
  // out= forms.
  const auto out = [] {
    return torch::CppFunction::makeFromBoxedFunction<&det::reduction_out>();
  };
  m.impl("sum.IntList_out", out());
  m.impl("mean.out", out());
  m.impl("nansum.out", out());
  m.impl("var.correction_out", out());
  m.impl("std.correction_out", out());
  m.impl("linalg_vector_norm.out", out());
  m.impl("norm.out", out());

  // Kernels whose oneDNN/MKL calls split sums by thread: one thread.
  const auto single = [] {
    return torch::CppFunction::makeFromBoxedFunction<
        &det::single_threaded_when_deterministic>();
  };
  m.impl("convolution_backward", single());
  m.impl("_linalg_eigh", single());
  m.impl("_linalg_svd", single());
  m.impl("linalg_inv_ex", single());
  m.impl("linalg_cholesky_ex", single());
  m.impl("linalg_qr", single());
  m.impl("linalg_lu_factor_ex", single());
  m.impl("_linalg_solve_ex", single());

  // ATen's kernel, serially (order-dependent only through threads).
  const auto serial = [] {
    return torch::CppFunction::makeFromBoxedFunction<
        &det::serial_when_deterministic>();
  };
  m.impl("_index_put_impl_", serial());
  // index_copy_ is launched (kernels/HotOps.cpp), serial under the mode.
  m.impl("index_copy", serial());
  m.impl("index_copy.out", serial());
  // Elementwise ops whose vectorised and scalar loops round differently:
  // ATen's thread split decides which elements take the scalar tail.
  // Functional forms run on fixed chunks (sigmoid and silu too, registered
  // in ops/kernels/HotOps.cpp); in-place and out= forms serially.
  const auto chunked = [] {
    return torch::CppFunction::makeFromBoxedFunction<
        &det::elementwise_when_deterministic>();
  };
  for (const char* name :
       {"sigmoid_backward", "silu_backward", "mish", "mish_backward",
        "softplus", "softplus_backward", "elu", "elu_backward", "gelu_backward",
        "pow.Tensor_Tensor", "pow.Scalar", "atan2", "atanh", "cosh", "sinh",
        "exp2"}) {
    m.impl(name, chunked());
  }
  for (const char* name : {"sigmoid_",
                           "sigmoid.out",
                           "sigmoid_backward.grad_input",
                           "silu_",
                           "silu.out",
                           "silu_backward.grad_input",
                           "mish_",
                           "mish.out",
                           "softplus.out",
                           "softplus_backward.grad_input",
                           "elu_",
                           "elu.out",
                           "elu_backward.grad_input",
                           "gelu_",
                           "gelu.out",
                           "gelu_backward.grad_input",
                           "pow_.Scalar",
                           "pow.Tensor_Scalar_out",
                           "pow_.Tensor",
                           "pow.Tensor_Tensor_out",
                           "pow.Scalar_out",
                           "atan2_",
                           "atan2.out",
                           "atanh_",
                           "atanh.out",
                           "cosh_",
                           "cosh.out",
                           "sinh_",
                           "sinh.out",
                           "exp2_",
                           "exp2.out"}) {
    m.impl(name, serial());
  }
  m.impl("put_", torch::CppFunction::makeFromBoxedFunction<&det::put_>());

  // No deterministic implementation: raise (or warn) under the mode.
  const auto alert = [] {
    return torch::CppFunction::makeFromBoxedFunction<
        &det::alert_when_deterministic>();
  };
  m.impl("_fft_c2c", alert());
  m.impl("_fft_r2c", alert());
  m.impl("_fft_c2r", alert());
}

}  // namespace
}  // namespace ember
