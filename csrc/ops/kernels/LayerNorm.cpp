// native_layer_norm on ember (fp32, or bf16 throughout): for small inputs
// (token-at-a-time decoding, batch-1 inference, where the host's per-op
// cost is what matters) launched on the stream (ops/LaunchedOps.h): the results
// are allocated here in the shapes CPU gives them and the worker runs CPU's
// kernel, copying its results in (CPU's layer-norm kernel has no out= form
// ember can reach; the copy is a few KB at these sizes). Larger inputs, where
// the kernel's time dwarfs the host's, and anything unusual take the
// synchronous CPU delegation, which writes in place.
#include <ATen/core/Tensor.h>
#include <ATen/native/layer_norm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/native_layer_norm_ops.h>
#include <c10/util/DimVector.h>
#include <torch/library.h>

#include <tuple>

#include "ops/CpuAlias.h"
#include "ops/DelegationCall.h"
#include "ops/LaunchedOps.h"
#include "ops/UnboxedDelegation.h"

namespace ember::kernels {
namespace {

using T = const at::Tensor&;
using OptT = const std::optional<at::Tensor>&;
using Result = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using Op = at::_ops::native_layer_norm;

bool plain(const at::Tensor& t, at::ScalarType dtype) {
  return t.scalar_type() == dtype && t.is_contiguous() && !t.is_conj() &&
         !t.is_neg();
}

// fp32, or bf16 throughout (CPU's statistics are then bf16 too, the
// input's dtype, as the results allocated below are; a bf16 input with
// fp32 parameters has fp32 statistics and stays synchronous).
bool launchable(T input, OptT weight, OptT bias) {
  const at::ScalarType dtype = input.scalar_type();
  return launch_async() && (dtype == at::kFloat || dtype == at::kBFloat16) &&
         plain(input, dtype) && input.numel() > 0 &&
         (!weight.has_value() || !weight->defined() || plain(*weight, dtype)) &&
         (!bias.has_value() || !bias->defined() || plain(*bias, dtype));
}

Result native_layer_norm(T input, c10::SymIntArrayRef normalized_shape,
                         OptT weight, OptT bias, double eps) {
  if (!launchable(input, weight, bias)) {
    return unboxed::functional<Op, T, c10::SymIntArrayRef, OptT, OptT, double>(
        input, normalized_shape, weight, bias, eps);
  }
  const at::Tensor gamma = weight.value_or(at::Tensor());
  const at::Tensor beta = bias.value_or(at::Tensor());
  const c10::IntArrayRef normalized = C10_AS_INTARRAYREF_SLOW(normalized_shape);
  DelegationCall call(unboxed::op_name<Op>(), /*accepts_cpu_tensors=*/false);
  at::Tensor x = call.to_cpu(input, false);
  at::Tensor g = call.to_cpu(gamma, false);
  at::Tensor b = call.to_cpu(beta, false);
  call.settle();
  // CPU's argument checks, raising what its kernel raises.
  (void)at::native::_check_layer_norm_inputs(x, normalized, g, b);
  // CPU's result shapes: the output like the input, the statistics with
  // the normalized dimensions kept as 1s.
  const int64_t axis = input.dim() - static_cast<int64_t>(normalized.size());
  c10::DimVector stat_shape(input.sizes().begin(),
                            input.sizes().begin() + axis);
  stat_shape.resize(input.dim(), 1);
  at::Tensor out = at::empty(input.sizes(), input.options());
  at::Tensor mean = at::empty(stat_shape, input.options());
  at::Tensor rstd = at::empty(stat_shape, input.options());
  const bool queued = launch_on_device(
      call.device(), unboxed::op_name<Op>().c_str(),
      [x, normalized = normalized.vec(), g, b, eps, out_cpu = cpu_alias(out),
       mean_cpu = cpu_alias(mean), rstd_cpu = cpu_alias(rstd)]() mutable {
        // Rows are normalised one per thread: split-free.
        run_split_free([&] {
          const auto [y, mu, sigma] =
              Op::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), x,
                             c10::fromIntArrayRefSlow(normalized), g, b, eps);
          out_cpu.copy_(y);
          mean_cpu.copy_(mu);
          rstd_cpu.copy_(sigma);
        });
      },
      out.numel());
  if (queued) count_launch(unboxed::op_name<Op>());
  return {std::move(out), std::move(mean), std::move(rstd)};
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("native_layer_norm", TORCH_FN(native_layer_norm));
}

}  // namespace
}  // namespace ember::kernels
