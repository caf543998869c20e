// native_layer_norm on ember (fp32, or bf16 throughout): launched on the
// stream (ops/LaunchedOps.h). The results are allocated here in the shapes
// CPU gives them and the worker runs the kernel CPU's native_layer_norm
// runs (ATen's LayerNormKernel stub) straight into them. Anything unusual
// takes the synchronous CPU delegation.
// DispatchStub.h declares the per-ISA kernel pointers of a stub (exported by
// libtorch_cpu) only under these, which ATen's own build defines.
#define HAVE_AVX512_CPU_DEFINITION
#define HAVE_AVX2_CPU_DEFINITION
#include <ATen/Version.h>
#include <ATen/core/Tensor.h>
#include <ATen/native/layer_norm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/native_layer_norm_ops.h>
#include <c10/util/DimVector.h>
#include <c10/util/accumulate.h>
#include <torch/library.h>

#include <string>
#include <tuple>

#include "observe/ExecutionPath.h"
#include "ops/LaunchedOps.h"
#include "ops/UnboxedDelegation.h"

namespace ember::kernels {
namespace {

using T = const at::Tensor&;
using OptT = const std::optional<at::Tensor>&;
using Result = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using Op = at::_ops::native_layer_norm;

// The kernel CPU's native_layer_norm runs: ATen's LayerNormKernel stub for
// this CPU's capability, chosen as the stub chooses (its own dispatch entry
// point is not exported).
at::native::forward_fn cpu_layer_norm_kernel() {
  using Stub = at::native::DispatchStub<
      at::native::forward_fn,
      at::native::LayerNormKernel_DECLARE_DISPATCH_type>;
  static const at::native::forward_fn kernel = [] {
    const std::string capability = at::get_cpu_capability();
    if (capability == "AVX512" && Stub::AVX512 != nullptr) return Stub::AVX512;
    if ((capability == "AVX512" || capability == "AVX2") &&
        Stub::AVX2 != nullptr) {
      return Stub::AVX2;
    }
    return Stub::DEFAULT;
  }();
  return kernel;
}

// fp32, or bf16 throughout (CPU's statistics are then bf16 too, the
// input's dtype, as the results allocated below are; a bf16 input with
// fp32 parameters has fp32 statistics and stays synchronous).
bool launchable(T input, OptT weight, OptT bias) {
  const at::ScalarType dtype = input.scalar_type();
  return launch_async() && (dtype == at::kFloat || dtype == at::kBFloat16) &&
         unboxed::plain_contiguous(input, dtype) && input.numel() > 0 &&
         (!weight.has_value() || !weight->defined() ||
          unboxed::plain_contiguous(*weight, dtype)) &&
         (!bias.has_value() || !bias->defined() ||
          unboxed::plain_contiguous(*bias, dtype));
}

// A contiguous tensor as queued work keeps it: its storage (alive until the
// work has run), where its elements start and its sizes, read at the call;
// the worker builds the CPU tensor the kernel takes (the host makes no CPU
// alias: at a batch-1 step's sizes the six of them cost more than the kernel).
struct ContiguousView {
  c10::Storage storage;
  void* data = nullptr;
  c10::SmallVector<int64_t, 5> sizes;
  at::ScalarType dtype = at::kFloat;

  static ContiguousView of(const at::Tensor& t) {
    if (!t.defined()) return {};
    return {t.storage(), const_cast<void*>(t.const_data_ptr()),
            c10::SmallVector<int64_t, 5>(t.sizes().begin(), t.sizes().end()),
            t.scalar_type()};
  }
  at::Tensor cpu() const {
    if (data == nullptr) return at::Tensor();
    return at::from_blob(data, sizes, at::TensorOptions().dtype(dtype));
  }
};

// Weight and bias on the input's device (or absent); anything else takes
// the delegation, which raises CPU's or the device check's error.
bool on_device_of(T input, OptT t) {
  return !t.has_value() || !t->defined() || t->device() == input.device();
}

Result native_layer_norm(T input, c10::SymIntArrayRef normalized_shape,
                         OptT weight, OptT bias, double eps) {
  if (!launchable(input, weight, bias) || !input.is_privateuseone() ||
      !on_device_of(input, weight) || !on_device_of(input, bias)) {
    return unboxed::functional<Op, T, c10::SymIntArrayRef, OptT, OptT, double>(
        input, normalized_shape, weight, bias, eps);
  }
  const at::Tensor gamma = weight.value_or(at::Tensor());
  const at::Tensor beta = bias.value_or(at::Tensor());
  const c10::IntArrayRef normalized = C10_AS_INTARRAYREF_SLOW(normalized_shape);
  observe::mark_path(observe::ExecutionPath::kDelegated);
  // CPU's argument checks (shapes only), raising what its kernel raises.
  (void)at::native::_check_layer_norm_inputs(input, normalized, gamma, beta);
  // CPU's result shapes: the output like the input, the statistics with
  // the normalized dimensions kept as 1s.
  const int64_t axis = input.dim() - static_cast<int64_t>(normalized.size());
  c10::DimVector stat_shape(input.sizes().begin(),
                            input.sizes().begin() + axis);
  stat_shape.resize(input.dim(), 1);
  at::Tensor out = at::empty(input.sizes(), input.options());
  at::Tensor mean = at::empty(stat_shape, input.options());
  at::Tensor rstd = at::empty(stat_shape, input.options());
  const int64_t rows = c10::multiply_integers(input.sizes().begin(),
                                              input.sizes().begin() + axis);
  const int64_t row_size = input.numel() / rows;  // launchable: not empty
  const c10::DeviceIndex device = input.device().index();
  const char* name = unboxed::op_name<Op>().c_str();
  auto work = [x = ContiguousView::of(input), g = ContiguousView::of(gamma),
               b = ContiguousView::of(beta), y = ContiguousView::of(out),
               m = ContiguousView::of(mean), r = ContiguousView::of(rstd), eps,
               rows, row_size] {
    // CPU's kernel (the one native_layer_norm calls) writing into the
    // results: no allocation or copy on the worker. Rows are
    // normalised one per thread: split-free.
    at::Tensor out_cpu = y.cpu();
    at::Tensor mean_cpu = m.cpu();
    at::Tensor rstd_cpu = r.cpu();
    run_split_free([&] {
      cpu_layer_norm_kernel()(x.cpu(), g.cpu(), b.cpu(), rows, row_size, eps,
                              &out_cpu, &mean_cpu, &rstd_cpu);
    });
  };
  // Tiny work on an idle stream: at the call, as the worker would run it.
  if (runtime::Stream* idle =
          idle_stream_for_tiny_work(device, input.numel())) {
    run_launched_inline(*idle, name, device, work);
    return {std::move(out), std::move(mean), std::move(rstd)};
  }
  const bool queued =
      launch_on_device(device, name, std::move(work), out.numel());
  if (queued) count_launch(unboxed::op_name<Op>());
  return {std::move(out), std::move(mean), std::move(rstd)};
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("native_layer_norm", TORCH_FN(native_layer_norm));
}

}  // namespace
}  // namespace ember::kernels
