// native_batch_norm on ember in inference (training = False, running
// statistics given) over fp32 contiguous or channels-last inputs: the
// statistics, weight and bias are folded into a scale and a shift per
// channel, and ember's one-pass kernel (elementwise/ChannelAffine.h) applies
// them. CPU's path folds the same terms through small tensor ops and costs
// 8-20 us per call more than a copy of the data at ResNet-50's sizes.
// Training, other dtypes and layouts, and cpu_parity take CPU's kernel,
// which also raises CPU's errors.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/native_batch_norm_ops.h>
#include <immintrin.h>
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <vector>

#include "flags/BackendFlags.h"
#include "observe/ExecutionPath.h"
#include "ops/LaunchedOps.h"
#include "ops/UnboxedDelegation.h"
#include "ops/kernels/ConvEpilogue.h"
#include "ops/kernels/elementwise/ChannelAffine.h"

namespace ember::kernels {
namespace {

using T = const at::Tensor&;
using OptT = const std::optional<at::Tensor>&;
using Result = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using Op = at::_ops::native_batch_norm;

bool channel_vector(OptT t, int64_t channels, c10::Device device) {
  return t.has_value() && t->defined() && t->device() == device &&
         t->scalar_type() == at::kFloat && t->dim() == 1 &&
         t->size(0) == channels && t->is_contiguous() && !t->is_conj() &&
         !t->is_neg();
}

bool optional_channel_vector(OptT t, int64_t channels, c10::Device device) {
  return !t.has_value() || !t->defined() || channel_vector(t, channels, device);
}

enum class Layout { kPlanes, kRows };

std::optional<Layout> inference_layout(T input, OptT weight, OptT bias,
                                       OptT running_mean, OptT running_var,
                                       bool training) {
  if (training || flags::cpu_parity() || !channel_affine_supported() ||
      input.scalar_type() != at::kFloat || input.dim() < 2 ||
      input.numel() == 0 || input.is_conj() || input.is_neg()) {
    return std::nullopt;
  }
  const int64_t channels = input.size(1);
  const c10::Device device = input.device();
  if (!channel_vector(running_mean, channels, device) ||
      !channel_vector(running_var, channels, device) ||
      !optional_channel_vector(weight, channels, device) ||
      !optional_channel_vector(bias, channels, device)) {
    return std::nullopt;
  }
  if (input.is_contiguous()) return Layout::kPlanes;
  if (input.dim() == 4 && input.is_contiguous(at::MemoryFormat::ChannelsLast)) {
    return Layout::kRows;
  }
  return std::nullopt;
}

const float* data_or_null(const std::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? t->const_data_ptr<float>() : nullptr;
}

Result native_batch_norm(T input, OptT weight, OptT bias, OptT running_mean,
                         OptT running_var, bool training, double momentum,
                         double eps) {
  const std::optional<Layout> layout = inference_layout(
      input, weight, bias, running_mean, running_var, training);
  if (!layout) {
    return unboxed::functional<Op, T, OptT, OptT, OptT, OptT, bool, double,
                               double>(input, weight, bias, running_mean,
                                       running_var, training, momentum, eps);
  }
  const bool rows = *layout == Layout::kRows;
  if (!rows) {
    // The step after a held convolution (ConvEpilogue.h)?
    if (std::optional<at::Tensor> out = epilogue_batch_norm(
            input, weight, bias, *running_mean, *running_var, eps)) {
      return std::make_tuple(*out, at::empty({0}, out->options()),
                             at::empty({0}, out->options()));
    }
  }
  const auto normalize_into = [rows, epsilon = static_cast<float>(eps)](
                                  const at::Tensor& out, const at::Tensor& x,
                                  const std::optional<at::Tensor>& w,
                                  const std::optional<at::Tensor>& b,
                                  const std::optional<at::Tensor>& mean,
                                  const std::optional<at::Tensor>& var) {
    const int64_t channels = x.size(1);
    std::vector<float> scale(static_cast<size_t>(channels)),
        shift(static_cast<size_t>(channels));
    fold_batch_norm_f32(mean->const_data_ptr<float>(),
                        var->const_data_ptr<float>(), data_or_null(w),
                        data_or_null(b), epsilon, channels, scale.data(),
                        shift.data());
    float* y = const_cast<at::Tensor&>(out).mutable_data_ptr<float>();
    if (rows) {
      channel_affine_rows_f32(x.const_data_ptr<float>(), y,
                              x.numel() / channels, channels, scale.data(),
                              shift.data());
    } else {
      channel_affine_planes_f32(x.const_data_ptr<float>(), y, x.size(0),
                                channels, x.numel() / (x.size(0) * channels),
                                scale.data(), shift.data());
    }
  };
  const auto empty_result = [rows](const at::Tensor& like) {
    return at::empty(
        like.sizes(), like.options(),
        rows ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous);
  };
  // In inference CPU returns no saved statistics: empty tensors.
  const auto with_statistics = [](const at::Tensor& out) {
    return std::make_tuple(out, at::empty({0}, out.options()),
                           at::empty({0}, out.options()));
  };
  static const std::string launched_name = "aten::native_batch_norm";
  std::optional<at::Tensor> out = unboxed::launch_into(
      launched_name, [&] { return empty_result(input); }, normalize_into, input,
      weight, bias, running_mean, running_var);
  Result result =
      out ? with_statistics(*out)
          : unboxed::custom<Result>(
                "aten::native_batch_norm",
                unboxed::replayable(
                    [normalize_into, empty_result, with_statistics](
                        const at::Tensor& x, const std::optional<at::Tensor>& w,
                        const std::optional<at::Tensor>& b,
                        const std::optional<at::Tensor>& mean,
                        const std::optional<at::Tensor>& var) {
                      at::Tensor y = empty_result(x);
                      normalize_into(y, x, w, b, mean, var);
                      return with_statistics(y);
                    }),
                input, weight, bias, running_mean, running_var);
  observe::mark_path(observe::ExecutionPath::kNative, "ember/batch_norm");
  return result;
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("native_batch_norm", TORCH_FN(native_batch_norm));
}

}  // namespace
}  // namespace ember::kernels
