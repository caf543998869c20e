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
#include "ops/kernels/DeterministicOps.h"
#include "ops/kernels/EmberKernels.h"
#include "ops/kernels/OpLayouts.h"
#include "ops/kernels/elementwise/ElementwiseChain.h"
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

// One of ember's vector kernels over x's elements into `out` (same dtype,
// flat layouts).
using UnaryF32 = void (*)(const float*, float*, int64_t);
using UnaryBf16 = void (*)(const uint16_t*, uint16_t*, int64_t);

void map_into(const at::Tensor& x, const at::Tensor& out, UnaryF32 f32,
              UnaryBf16 bf16) {
  if (x.scalar_type() == at::kBFloat16) {
    bf16(static_cast<const uint16_t*>(x.const_data_ptr()),
         static_cast<uint16_t*>(out.mutable_data_ptr()), x.numel());
  } else {
    f32(x.const_data_ptr<float>(), out.mutable_data_ptr<float>(), x.numel());
  }
}

// `self` through a vector kernel (the flat `layout` own_kernel_layout
// found): launched on the stream where the engine launches, else at the
// call (replayable in a graph). `name` is the op's, `route` the kernel's.
at::Tensor own_unary(const at::Tensor& self, at::MemoryFormat layout,
                     const std::string& name, const char* route, UnaryF32 f32,
                     UnaryBf16 bf16) {
  observe::mark_path(observe::ExecutionPath::kNative, route);
  if (launch_async()) {
    at::Tensor out = at::empty(self.sizes(), self.options(), layout);
    const bool queued = launch_on_device(
        self.device().index(), name.c_str(),
        [x = cpu_alias(self), out_cpu = cpu_alias(out), f32, bf16]() {
          map_into(x, out_cpu, f32, bf16);
        },
        out.numel());
    if (queued) count_launch(name);
    return out;
  }
  return unboxed::custom<at::Tensor>(
      name.c_str(),
      unboxed::replayable([layout, f32, bf16](const at::Tensor& x) {
        at::Tensor result = at::empty(x.sizes(), x.options(), layout);
        map_into(x, result, f32, bf16);
        return result;
      }),
      self);
}

}  // namespace

at::Tensor tanh(const at::Tensor& self) {
  const std::optional<at::MemoryFormat> layout = own_kernel_layout(self);
  if (!layout) {
    return unboxed::launched<at::_ops::tanh,
                             unboxed::OutForm<at::_ops::tanh_out>,
                             layouts::Tanh, const at::Tensor&>(self);
  }
  if (*layout == at::MemoryFormat::Contiguous &&
      self.scalar_type() == at::kFloat && chains(self)) {
    observe::mark_path(observe::ExecutionPath::kNative, "ember/tanh");
    return chain_step(ChainOp::kTanh, self, nullptr);
  }
  static const std::string name = "aten::tanh";
  return own_unary(self, *layout, name, "ember/tanh", tanh_f32, tanh_bf16);
}

// GELU's tanh form (CPU's vector kernel: ~4.5x ember's time); the erf
// form, and deterministic mode (CPU's kernel run serially), stay CPU's.
at::Tensor gelu(const at::Tensor& self, c10::string_view approximate) {
  const std::optional<at::MemoryFormat> layout = own_kernel_layout(self);
  if (!layout || approximate != "tanh" || flags::deterministic()) {
    return deterministic::gelu(self, approximate);
  }
  static const std::string name = "aten::gelu";
  return own_unary(self, *layout, name, "ember/gelu_tanh", gelu_tanh_f32,
                   gelu_tanh_bf16);
}

}  // namespace ember::kernels
