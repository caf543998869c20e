// Where ember's deterministic mode hooks in (flags::deterministic()).
// Registration only: kernels live in ops/kernels/DeterministicOps.cpp; each
// is the plain CPU delegation while the mode is off. _softmax is the one
// deterministic kernel registered elsewhere (ops/kernels/HotOps.cpp).
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
  m.impl("mse_loss", TORCH_FN(det::mse_loss));
  m.impl("_softmax_backward_data", TORCH_FN(det::softmax_backward_data));
  m.impl("native_layer_norm_backward", TORCH_FN(det::layer_norm_backward));
  m.impl("native_group_norm", TORCH_FN(det::group_norm));
  m.impl("native_group_norm_backward", TORCH_FN(det::group_norm_backward));

  // ATen's kernel, serially (order-dependent only through threads).
  const auto serial = [] {
    return torch::CppFunction::makeFromBoxedFunction<
        &det::serial_when_deterministic>();
  };
  m.impl("_index_put_impl_", serial());
  m.impl("index_copy_", serial());
  m.impl("index_copy", serial());
  m.impl("index_copy.out", serial());
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
