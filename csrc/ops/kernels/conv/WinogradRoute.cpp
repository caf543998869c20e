#include "ops/kernels/conv/WinogradRoute.h"

#include <ATen/ops/convolution.h>
#include <ATen/ops/empty.h>

#include <string>

#include "graphs/GraphCapture.h"
#include "observe/ExecutionPath.h"
#include "ops/LaunchedOps.h"
#include "ops/UnboxedDelegation.h"
#include "ops/kernels/ConvEpilogue.h"
#include "ops/kernels/conv/WinogradF2x3.h"
#include "ops/kernels/matmul/PackedWeights.h"

namespace ember::kernels {
namespace {

// Smallest channel counts the route takes: with fewer, the 16 GEMMs are too
// thin to pay for the transforms.
constexpr int64_t kMinChannels = 16;
// Smallest tile count (tiles of all images). With fewer, the GEMMs stream the
// transformed filter (16/9 of the weight) for too few columns. Zen 4, 2 cores,
// against oneDNN's pack: 256 channels on 7x7 images, batch 2 (32 tiles) 0.66
// against 0.54 ms; on 14x14 (49 tiles: ResNet-50's layer3) 0.64 against 0.97.
constexpr int64_t kMinTiles = 48;
// Largest transformed filter (16 x K x C floats): 512 channels in and out
// (16 MiB) streamed per call lost to oneDNN's pack at every batch tried
// (7x7 images: batch 1 1.06 against 0.89 ms, batch 4 4.47 against 3.74).
constexpr int64_t kMaxFilterFloats = int64_t{1} << 21;

conv::WinogradGeometry geometry_of(const at::Tensor& input,
                                   const at::Tensor& weight,
                                   const std::vector<int64_t>& padding) {
  conv::WinogradGeometry g;
  g.images = input.size(0);
  g.channels = input.size(1);
  g.out_channels = weight.size(0);
  g.height = input.size(2);
  g.width = input.size(3);
  g.pad_h = padding[0];
  g.pad_w = padding[1];
  return g;
}

}  // namespace

bool winograd_route_applies(const at::Tensor& input, const at::Tensor& weight,
                            const std::vector<int64_t>& stride,
                            const std::vector<int64_t>& padding,
                            const std::vector<int64_t>& dilation,
                            int64_t groups) {
  if (!conv::winograd_supported() || groups != 1 || weight.size(2) != 3 ||
      weight.size(3) != 3 || stride[0] != 1 || stride[1] != 1 ||
      dilation[0] != 1 || dilation[1] != 1 || padding[0] > 2 ||
      padding[1] > 2 || !input.is_contiguous() || !weight.is_contiguous() ||
      input.suggest_memory_format() != at::MemoryFormat::Contiguous ||
      weight.suggest_memory_format() != at::MemoryFormat::Contiguous) {
    return false;
  }
  const conv::WinogradGeometry g = geometry_of(input, weight, padding);
  return g.channels >= kMinChannels && g.out_channels >= kMinChannels &&
         g.out_h() > 0 && g.out_w() > 0 && g.tiles() >= kMinTiles &&
         conv::winograd_filter_floats(g.out_channels, g.channels) <=
             kMaxFilterFloats &&
         conv::winograd_buffer_floats(g, 1) <= conv::winograd_group_floats;
}

std::optional<at::Tensor> winograd_convolution(
    const at::Tensor& input, const at::Tensor& weight,
    const std::optional<at::Tensor>& bias,
    const std::vector<int64_t>& padding) {
  const int64_t out_channels = weight.size(0), channels = weight.size(1);
  const auto packed = matmul::packed_onednn_weight(
      weight, matmul::PackKind::kWinogradF32, /*geometry=*/0,
      [&](const at::Tensor& cpu_weight) {
        at::Tensor filter =
            at::empty({conv::winograd_filter_floats(out_channels, channels)},
                      cpu_weight.options());
        conv::winograd_transform_filter(cpu_weight.const_data_ptr<float>(),
                                        out_channels, channels,
                                        filter.mutable_data_ptr<float>());
        return filter;
      });
  if (!packed) return std::nullopt;
  const conv::WinogradGeometry g = geometry_of(input, weight, padding);
  const std::vector<int64_t> sizes{g.images, out_channels, g.out_h(),
                                   g.out_w()};
  // Into `out` (NCHW, contiguous) from the pack, or, in a replay after the
  // weight was written, CPU's convolution of the weight's memory.
  const auto into = [g, packed, padding,
                     watched = capture::WatchedWeight::of(weight)](
                        const at::Tensor& out, const at::Tensor& x,
                        const std::optional<at::Tensor>& b) {
    if (watched.written_since()) [[unlikely]] {
      const_cast<at::Tensor&>(out).copy_(at::convolution(
          x, watched.weight_cpu, b, {1, 1}, padding, {1, 1}, false, {0, 0}, 1));
      return;
    }
    conv::winograd_conv(
        g, x.const_data_ptr<float>(), packed->onednn.const_data_ptr<float>(),
        b.has_value() && b->defined() ? b->const_data_ptr<float>() : nullptr,
        const_cast<at::Tensor&>(out).mutable_data_ptr<float>());
  };
  static const std::string launched_name = "aten::convolution (winograd)";
  observe::mark_path(observe::ExecutionPath::kNative, "winograd");
  if (holds_convolutions()) {
    // Held for the batch norm, add and ReLU that may follow (ConvEpilogue.h):
    // their steps run on each output row as the transform writes it.
    at::Tensor held = at::empty(sizes, input.options());
    hold_convolution(launched_name, held,
                     [g, packed, input, bias](
                         float* out, const matmul::ChannelEpilogue* epilogue) {
                       conv::winograd_conv(
                           g, input.const_data_ptr<float>(),
                           packed->onednn.const_data_ptr<float>(),
                           bias.has_value() && bias->defined()
                               ? bias->const_data_ptr<float>()
                               : nullptr,
                           out, epilogue);
                     });
    return held;
  }
  std::optional<at::Tensor> out = unboxed::launch_into(
      launched_name, [&] { return at::empty(sizes, input.options()); }, into,
      input, bias);
  if (!out) {
    out = unboxed::custom<at::Tensor>(
        "aten::convolution",
        unboxed::replayable([into, sizes](const at::Tensor& x,
                                          const std::optional<at::Tensor>& b) {
          at::Tensor result = at::empty(sizes, x.options());
          into(result, x, b);
          return result;
        }),
        input, bias);
  }
  return out;
}

}  // namespace ember::kernels
