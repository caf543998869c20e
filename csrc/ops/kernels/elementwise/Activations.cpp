// Activations with an ember kernel by default (elementwise/VectorMath.h);
// under cpu_parity, and for what the kernels do not cover (other dtypes,
// overlapping or strided layouts, no AVX-512), CPU's kernel on aliases.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/tanh_ops.h>

#include <optional>
#include <string>

#include "flags/BackendFlags.h"
#include "observe/ExecutionPath.h"
#include "ops/CpuAlias.h"
#include "ops/LaunchedOps.h"
#include "ops/UnboxedDelegation.h"
#include "ops/kernels/EmberKernels.h"
#include "ops/kernels/OpLayouts.h"
#include "ops/kernels/elementwise/VectorMath.h"

namespace ember::kernels {
namespace {

// The layout of an fp32 or bf16 tensor the kernel runs over as one flat array,
// in the layout CPU's TensorIterator gives the result (contiguous or
// channels-last; other dense layouts and empty tensors, whose result strides
// follow finer rules, stay with CPU's kernel).
std::optional<at::MemoryFormat> flat_layout(const at::Tensor& t) {
  if ((t.scalar_type() != at::kFloat && t.scalar_type() != at::kBFloat16) ||
      t.numel() == 0 || t.is_conj() || t.is_neg()) {
    return std::nullopt;
  }
  if (t.is_contiguous()) return at::MemoryFormat::Contiguous;
  if (t.dim() == 4 && t.is_contiguous(at::MemoryFormat::ChannelsLast)) {
    return at::MemoryFormat::ChannelsLast;
  }
  return std::nullopt;
}

std::optional<at::MemoryFormat> own_kernel_layout(const at::Tensor& self) {
  if (flags::cpu_parity() || !vector_math_supported()) return std::nullopt;
  return flat_layout(self);
}

// ember's tanh over x's elements into `out` (same dtype, flat layouts).
void tanh_into(const at::Tensor& x, const at::Tensor& out) {
  if (x.scalar_type() == at::kBFloat16) {
    tanh_bf16(static_cast<const uint16_t*>(x.const_data_ptr()),
              static_cast<uint16_t*>(out.mutable_data_ptr()), x.numel());
  } else {
    tanh_f32(x.const_data_ptr<float>(), out.mutable_data_ptr<float>(),
             x.numel());
  }
}

}  // namespace

at::Tensor tanh(const at::Tensor& self) {
  const std::optional<at::MemoryFormat> layout = own_kernel_layout(self);
  if (!layout) {
    return unboxed::launched<at::_ops::tanh,
                             unboxed::OutForm<at::_ops::tanh_out>,
                             layouts::Tanh, const at::Tensor&>(self);
  }
  if (launch_async()) {
    at::Tensor out = at::empty(self.sizes(), self.options(), *layout);
    static const std::string name = "aten::tanh";
    observe::mark_path(observe::ExecutionPath::kNative, "ember/tanh");
    const bool queued = launch_on_device(
        self.device().index(), name.c_str(),
        [x = cpu_alias(self), out_cpu = cpu_alias(out)]() mutable {
          tanh_into(x, out_cpu);
        },
        out.numel());
    if (queued) count_launch(name);
    return out;
  }
  at::Tensor out = unboxed::custom<at::Tensor>(
      "aten::tanh",
      unboxed::replayable([format = *layout](const at::Tensor& x) {
        at::Tensor result = at::empty(x.sizes(), x.options(), format);
        tanh_into(x, result);
        return result;
      }),
      self);
  observe::mark_path(observe::ExecutionPath::kNative, "ember/tanh");
  return out;
}

}  // namespace ember::kernels
