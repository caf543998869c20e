// cat and index_select on ember, launched on the stream (ops/LaunchedOps.h):
// the result's layout comes from CPU's own rules (cat's structured meta
// function; index_select's contiguous result of the input's shape with the
// selected dimension resized), and the worker runs CPU's out= kernel into
// it. Anything else (host tensors among the inputs, async execution off, a
// meta check that fails) takes the synchronous CPU delegation, which
// raises CPU's errors.
#include <ATen/WrapDimUtils.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat_meta_dispatch.h>
#include <ATen/ops/cat_ops.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/index_select_ops.h>
#include <c10/util/DimVector.h>
#include <torch/library.h>

#include <vector>

#include "ops/CpuAlias.h"
#include "ops/DelegationCall.h"
#include "ops/LaunchedOps.h"
#include "ops/UnboxedDelegation.h"

namespace ember::kernels {
namespace {

constexpr c10::DispatchKeySet kCpu{c10::DispatchKey::CPU};

at::Tensor cat(const at::ITensorListRef& tensors, int64_t dim) {
  using Op = at::_ops::cat;
  const auto sync = [&] {
    static const c10::OperatorHandle op =
        c10::Dispatcher::singleton().findSchemaOrThrow("aten::cat", "");
    const std::vector<at::Tensor> list(tensors.begin(), tensors.end());
    return unboxed::boxed(op, list, dim).back().toTensor();
  };
  if (!launch_async()) return sync();
  at::Tensor out;
  {
    DelegationCall call(unboxed::op_name<Op>(), /*accepts_cpu_tensors=*/false);
    std::vector<at::Tensor> inputs;
    inputs.reserve(tensors.size());
    for (const at::Tensor& t : tensors) {
      if (!t.is_privateuseone()) return sync();
      inputs.push_back(call.to_cpu(t, false));
    }
    call.settle();
    at::Tensor meta;
    try {
      meta = at::meta::cat(c10::ArrayRef<at::Tensor>(inputs), dim);
    } catch (const std::exception&) {
      return sync();
    }
    out = unboxed::empty_like_meta(meta, call.device());
    if (!launch_on_device(
            call.device(), unboxed::op_name<Op>().c_str(),
            [inputs = std::move(inputs), dim,
             out_cpu = cpu_alias(out)]() mutable {
              run_split_free([&] {
                at::_ops::cat_out::redispatch(
                    kCpu, c10::ArrayRef<at::Tensor>(inputs), dim, out_cpu);
              });
            },
            out.numel())) {
      return out;
    }
  }
  count_launch(unboxed::op_name<Op>());
  return out;
}

at::Tensor index_select(const at::Tensor& self, int64_t dim,
                        const at::Tensor& index) {
  using Op = at::_ops::index_select;
  const auto sync = [&] {
    return unboxed::functional<Op, const at::Tensor&, int64_t,
                               const at::Tensor&>(self, dim, index);
  };
  if (!launch_async() || !index.is_privateuseone() || self.dim() == 0 ||
      index.dim() > 1 ||
      (index.scalar_type() != at::kLong && index.scalar_type() != at::kInt)) {
    return sync();
  }
  const int64_t d = at::maybe_wrap_dim(dim, self.dim());
  at::Tensor out;
  {
    DelegationCall call(unboxed::op_name<Op>(), /*accepts_cpu_tensors=*/false);
    at::Tensor self_cpu = call.to_cpu(self, false);
    at::Tensor index_cpu = call.to_cpu(index, false);
    call.settle();
    // CPU's result: contiguous, the input's shape with `dim` resized to the
    // number of indices. (Indices out of range are reported by the kernel,
    // asynchronously, as CUDA reports them.)
    c10::DimVector sizes(self.sizes().begin(), self.sizes().end());
    sizes[d] = index.numel();
    out = at::empty(sizes, self.options());
    if (!launch_on_device(
            call.device(), unboxed::op_name<Op>().c_str(),
            [self_cpu, d, index_cpu, out_cpu = cpu_alias(out)]() mutable {
              run_split_free([&] {
                at::_ops::index_select_out::redispatch(kCpu, self_cpu, d,
                                                       index_cpu, out_cpu);
              });
            },
            out.numel())) {
      return out;
    }
  }
  count_launch(unboxed::op_name<Op>());
  return out;
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("cat", TORCH_FN(cat));
  m.impl("index_select", TORCH_FN(index_select));
}

}  // namespace
}  // namespace ember::kernels
