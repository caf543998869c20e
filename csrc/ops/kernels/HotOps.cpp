// Unboxed registrations for the ops that dominate small-tensor workloads
// (elementwise arithmetic, softmax, layer norm, activations). Each is
// exactly the CPU delegation (the matmul family is in Matmul.cpp), minus the
// cost of boxing its arguments.
#include <ATen/core/Tensor.h>
#include <ATen/ops/_log_softmax_ops.h>
#include <ATen/ops/_softmax_ops.h>
#include <ATen/ops/add_ops.h>
#include <ATen/ops/div_ops.h>
#include <ATen/ops/gelu_ops.h>
#include <ATen/ops/mul_ops.h>
#include <ATen/ops/native_layer_norm_ops.h>
#include <ATen/ops/relu_ops.h>
#include <ATen/ops/sub_ops.h>
#include <c10/core/DispatchKeySet.h>
#include <torch/library.h>

#include "ops/UnboxedDelegation.h"
#include "ops/kernels/DeterministicOps.h"
#include "ops/kernels/EmberKernels.h"

namespace ember {
namespace {

// Exact C++ parameter types of the schemas (the dispatcher checks them).
using T = const at::Tensor&;
using S = const at::Scalar&;
using OptT = const std::optional<at::Tensor>&;

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  using namespace unboxed;
  namespace ops = at::_ops;
  m.impl("add.Tensor", TORCH_FN((functional<ops::add_Tensor, T, T, S>)));
  m.impl("sub.Tensor", TORCH_FN((functional<ops::sub_Tensor, T, T, S>)));
  m.impl("mul.Tensor", TORCH_FN((functional<ops::mul_Tensor, T, T>)));
  m.impl("div.Tensor", TORCH_FN((functional<ops::div_Tensor, T, T>)));
  m.impl("add_.Tensor", TORCH_FN((inplace<ops::add__Tensor, T, S>)));
  m.impl("mul_.Tensor", TORCH_FN((inplace<ops::mul__Tensor, T>)));
  // Under determinism these two take a fixed-order path (DeterministicOps).
  m.impl("_softmax", TORCH_FN(kernels::deterministic::softmax));
  m.impl("_log_softmax",
         TORCH_FN((functional<ops::_log_softmax, T, int64_t, bool>)));
  m.impl("native_layer_norm",
         TORCH_FN((functional<ops::native_layer_norm, T, c10::SymIntArrayRef,
                              OptT, OptT, double>)));
  m.impl("gelu", TORCH_FN(kernels::deterministic::gelu));
  m.impl("relu", TORCH_FN((functional<ops::relu, T>)));
  m.impl("tanh", TORCH_FN(kernels::tanh));
}

}  // namespace
}  // namespace ember
