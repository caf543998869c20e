// aten::max_pool2d_with_indices on ember: for contiguous (NCHW / CHW) fp32
// inputs ember's vector kernel (pooling/MaxPoolKernel.h; values and indices
// equal CPU's bit for bit), otherwise and under cpu_parity CPU's kernel,
// which also raises CPU's errors for invalid arguments.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/max_pool2d_with_indices_ops.h>

#include <limits>

#include "flags/BackendFlags.h"
#include "observe/ExecutionPath.h"
#include "ops/LaunchedOps.h"
#include "ops/UnboxedDelegation.h"
#include "ops/kernels/EmberKernels.h"
#include "ops/kernels/pooling/MaxPoolKernel.h"

namespace ember::kernels {
namespace {

using pooling::MaxPool2d;

// An [a] or [a, b] pooling argument as (a, a) or (a, b).
std::optional<std::pair<int64_t, int64_t>> pair_of(c10::IntArrayRef values) {
  if (values.size() == 1) return std::make_pair(values[0], values[0]);
  if (values.size() == 2) return std::make_pair(values[0], values[1]);
  return std::nullopt;
}

// PyTorch's pooling output size (ATen's pooling_output_shape).
int64_t output_size(int64_t input, int64_t kernel, int64_t pad, int64_t stride,
                    int64_t dilation, bool ceil_mode) {
  const int64_t numerator = input + 2 * pad - dilation * (kernel - 1) - 1 +
                            (ceil_mode ? stride - 1 : 0);
  int64_t out = (numerator >= 0 ? numerator / stride
                                : -((-numerator + stride - 1) / stride)) +
                1;
  if (ceil_mode && (out - 1) * stride >= input + pad) --out;
  return out;
}

std::optional<MaxPool2d> plan(const at::Tensor& self,
                              c10::IntArrayRef kernel_size,
                              c10::IntArrayRef stride, c10::IntArrayRef padding,
                              c10::IntArrayRef dilation, bool ceil_mode) {
  if (flags::cpu_parity() || !pooling::supported() ||
      self.scalar_type() != at::kFloat ||
      (self.dim() != 3 && self.dim() != 4) || !self.is_contiguous() ||
      self.numel() == 0) {
    return std::nullopt;
  }
  const auto k = pair_of(kernel_size);
  // An empty stride means the kernel size.
  const auto s = stride.empty() ? k : pair_of(stride);
  const auto pad = pair_of(padding);
  const auto d = pair_of(dilation);
  if (!k || !s || !pad || !d) return std::nullopt;
  MaxPool2d p;
  p.kernel_h = k->first;
  p.kernel_w = k->second;
  p.stride_h = s->first;
  p.stride_w = s->second;
  p.pad_h = pad->first;
  p.pad_w = pad->second;
  p.dilation_h = d->first;
  p.dilation_w = d->second;
  if (p.kernel_h <= 0 || p.kernel_w <= 0 || p.stride_h <= 0 ||
      p.stride_w <= 0 || p.dilation_h <= 0 || p.dilation_w <= 0 ||
      p.pad_h < 0 || p.pad_w < 0 || p.pad_h > p.kernel_h / 2 ||
      p.pad_w > p.kernel_w / 2) {
    return std::nullopt;  // CPU's kernel raises the error
  }
  p.height = self.size(-2);
  p.width = self.size(-1);
  p.planes = self.numel() / (p.height * p.width);
  p.out_height = output_size(p.height, p.kernel_h, p.pad_h, p.stride_h,
                             p.dilation_h, ceil_mode);
  p.out_width = output_size(p.width, p.kernel_w, p.pad_w, p.stride_w,
                            p.dilation_w, ceil_mode);
  if (p.out_height <= 0 || p.out_width <= 0 ||
      p.height * p.width > std::numeric_limits<int32_t>::max() / 2) {
    return std::nullopt;
  }
  return p;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> max_pool2d_with_indices(
    const at::Tensor& self, c10::IntArrayRef kernel_size,
    c10::IntArrayRef stride, c10::IntArrayRef padding,
    c10::IntArrayRef dilation, bool ceil_mode) {
  using Op = at::_ops::max_pool2d_with_indices;
  const std::optional<MaxPool2d> p =
      plan(self, kernel_size, stride, padding, dilation, ceil_mode);
  if (!p) {
    return unboxed::functional<Op, const at::Tensor&, c10::IntArrayRef,
                               c10::IntArrayRef, c10::IntArrayRef,
                               c10::IntArrayRef, bool>(
        self, kernel_size, stride, padding, dilation, ceil_mode);
  }
  using Outs = std::tuple<at::Tensor, at::Tensor>;  // values, indices
  std::vector<int64_t> sizes = self.sizes().vec();
  sizes[sizes.size() - 2] = p->out_height;
  sizes[sizes.size() - 1] = p->out_width;
  const auto empty_outs = [sizes](const at::Tensor& like) {
    return Outs(at::empty(sizes, like.options()),
                at::empty(sizes, like.options().dtype(at::kLong)));
  };
  const auto pool_into = [pool = *p](const Outs& outs, const at::Tensor& x) {
    pooling::max_pool2d_forward(
        pool, x.const_data_ptr<float>(),
        const_cast<at::Tensor&>(std::get<0>(outs)).mutable_data_ptr<float>(),
        const_cast<at::Tensor&>(std::get<1>(outs)).mutable_data_ptr<int64_t>());
  };
  static const std::string launched_name = "aten::max_pool2d_with_indices";
  std::optional<Outs> result = unboxed::launch_into(
      launched_name, [&] { return empty_outs(self); }, pool_into, self);
  if (!result) {
    result = unboxed::custom<Outs>(
        "aten::max_pool2d_with_indices",
        unboxed::replayable([empty_outs, pool_into](const at::Tensor& x) {
          Outs outs = empty_outs(x);
          pool_into(outs, x);
          return outs;
        }),
        self);
  }
  observe::mark_path(observe::ExecutionPath::kNative, "ember/max_pool2d");
  return *std::move(result);
}

}  // namespace ember::kernels
