// argmax with ember's row kernel (elementwise/RowArgmax.h) over the last
// dimension (or every element) of a contiguous fp32 or bf16 tensor: a
// greedy decode step's pick from its vocabulary row. Its answer is CPU's
// exactly; cpu_parity, other dtypes and layouts, and machines without
// AVX-512 run CPU's kernel on aliases (launched like the other hot ops).
#include <ATen/core/Tensor.h>
#include <ATen/ops/argmax_ops.h>
#include <ATen/ops/empty.h>
#include <c10/core/WrapDimMinimal.h>

#include <algorithm>
#include <optional>
#include <string>

#include "flags/BackendFlags.h"
#include "observe/ExecutionPath.h"
#include "ops/CpuAlias.h"
#include "ops/LaunchedOps.h"
#include "ops/UnboxedDelegation.h"
#include "ops/kernels/EmberKernels.h"
#include "ops/kernels/OpLayouts.h"
#include "ops/kernels/elementwise/RowArgmax.h"

namespace ember::kernels {
namespace {

// The row length the row kernel reduces `self` in, or nothing where CPU's
// kernel runs instead.
std::optional<int64_t> row_length(const at::Tensor& self,
                                  std::optional<int64_t> dim) {
  if (flags::cpu_parity() || !row_argmax_supported()) return std::nullopt;
  if ((self.scalar_type() != at::kFloat &&
       self.scalar_type() != at::kBFloat16) ||
      !self.is_contiguous() || self.numel() == 0 || self.is_conj() ||
      self.is_neg()) {
    return std::nullopt;
  }
  int64_t n = self.numel();
  if (dim.has_value()) {
    const int64_t d = c10::maybe_wrap_dim(*dim, self.dim());
    if (self.dim() > 0 && d != self.dim() - 1) return std::nullopt;
    if (self.dim() > 0) n = self.size(d);
  }
  if (n < 1 || n >= kRowArgmaxMaxLength) return std::nullopt;
  return n;
}

// argmax's result shape: the reduced dimension dropped (kept as 1 with
// keepdim); every dimension reduced when no dim is given.
c10::DimVector result_sizes(const at::Tensor& self, std::optional<int64_t> dim,
                            bool keepdim) {
  c10::DimVector sizes(self.sizes().begin(), self.sizes().end());
  if (!dim.has_value() || self.dim() == 0) {
    if (!keepdim) return {};
    std::fill(sizes.begin(), sizes.end(), 1);
    return sizes;
  }
  if (keepdim) {
    sizes.back() = 1;
  } else {
    sizes.pop_back();
  }
  return sizes;
}

void argmax_into(const at::Tensor& x, const at::Tensor& out, int64_t n) {
  const int64_t rows = x.numel() / n;
  auto* result = out.mutable_data_ptr<int64_t>();
  if (x.scalar_type() == at::kBFloat16) {
    row_argmax_bf16(static_cast<const uint16_t*>(x.const_data_ptr()), rows, n,
                    result);
  } else {
    row_argmax_f32(x.const_data_ptr<float>(), rows, n, result);
  }
}

}  // namespace

at::Tensor argmax(const at::Tensor& self, std::optional<int64_t> dim,
                  bool keepdim) {
  const std::optional<int64_t> n = row_length(self, dim);
  if (!n) {
    return unboxed::launched<
        at::_ops::argmax, unboxed::SplitFreeOutForm<at::_ops::argmax_out>,
        layouts::Argmax, const at::Tensor&, std::optional<int64_t>, bool>(
        self, dim, keepdim);
  }
  static const std::string name = "aten::argmax";
  observe::mark_path(observe::ExecutionPath::kNative, "ember/argmax");
  const c10::DimVector sizes = result_sizes(self, dim, keepdim);
  const auto length = *n;
  if (launch_async()) {
    at::Tensor out = at::empty(sizes, self.options().dtype(at::kLong));
    const bool queued = launch_on_device(
        self.device().index(), name.c_str(),
        [x = cpu_alias(self), out_cpu = cpu_alias(out), length]() {
          argmax_into(x, out_cpu, length);
        },
        self.numel());
    if (queued) count_launch(name);
    return out;
  }
  return unboxed::custom<at::Tensor>(
      name.c_str(), unboxed::replayable([sizes, length](const at::Tensor& x) {
        at::Tensor result = at::empty(sizes, x.options().dtype(at::kLong));
        argmax_into(x, result, length);
        return result;
      }),
      self);
}

}  // namespace ember::kernels
