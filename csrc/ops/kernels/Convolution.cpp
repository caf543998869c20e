// aten::convolution on ember. By default a 2-D fp32 convolution runs oneDNN
// on a prepacked weight (packed once per weight and call geometry, see
// matmul/PackedWeights.h): CPU's path reorders the weight into oneDNN's
// blocked layout on every call. Unpadded 1x1 convolutions of NCHW images run
// as ember's channel GEMM (conv/ChannelGemmRoute.h), and 3x3 stride-1 ones with
// enough channels and tiles as Winograd's F(2x2, 3x3) (conv/WinogradRoute.h).
// Otherwise CPU's whole convolution path on aliases (ATen picks oneDNN, im2col
// or depthwise kernels). When torch.backends.ember asks for it, ember picks the
// 2-D forward algorithm itself: conv.fp32_precision = "bf16" (bf16 operands,
// fp32 accumulation) or benchmark = True (time oneDNN against ATen's
// im2col+GEMM kernel).
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/_slow_conv2d_forward.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/mkldnn_convolution.h>
#include <ATen/ops/mkldnn_reorder_conv2d_weight.h>
#include <ATen/ops/slow_conv_dilated2d.h>
#include <ATen/ops/to_mkldnn_ops.h>

#include <algorithm>
#include <sstream>
#include <vector>

#include "flags/BackendFlags.h"
#include "graphs/GraphCapture.h"
#include "observe/ExecutionPath.h"
#include "ops/CpuAlias.h"
#include "ops/LaunchedOps.h"
#include "ops/UnboxedDelegation.h"
#include "ops/kernels/AlignedFloats.h"
#include "ops/kernels/ConvEpilogue.h"
#include "ops/kernels/EmberKernels.h"
#include "ops/kernels/LayoutTranspose.h"
#include "ops/kernels/OneDnnSupport.h"
#include "ops/kernels/conv/ChannelGemmRoute.h"
#include "ops/kernels/conv/WinogradRoute.h"
#include "ops/kernels/matmul/ChannelGemm.h"
#include "ops/kernels/matmul/PackedWeights.h"
#include "ops/kernels/tuning/Autotune.h"

namespace ember::kernels {
namespace {

using flags::Fp32Precision;

struct ConvParams {
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups;
};

bool engine_applies(const at::Tensor& input, const at::Tensor& weight,
                    bool transposed) {
  if (transposed || input.dim() != 4 || input.scalar_type() != at::kFloat ||
      weight.scalar_type() != at::kFloat) {
    return false;
  }
  return flags::benchmark() ||
         flags::conv_fp32_precision() == Fp32Precision::kBf16;
}

at::Tensor with_bias(at::Tensor out, const std::optional<at::Tensor>& bias) {
  if (bias.has_value() && bias->defined()) {
    out.add_(bias->view({1, -1, 1, 1}));
  }
  return out;
}

at::Tensor onednn_conv(const at::Tensor& input, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias,
                       const ConvParams& p, Fp32Precision precision) {
  if (precision == Fp32Precision::kBf16 && !kernels::onednn_bf16_supported()) {
    // No bf16 convolution here: the same arithmetic (bf16 operands, whose
    // products are exact in fp32, fp32 accumulation) on fp32 kernels.
    const auto rounded = [](const at::Tensor& t) {
      return t.to(at::kBFloat16).to(at::kFloat);
    };
    return at::mkldnn_convolution(rounded(input), rounded(weight), bias,
                                  p.padding, p.stride, p.dilation, p.groups);
  }
  if (precision == Fp32Precision::kBf16) {
    // Bias is added in fp32, after the bf16 convolution.
    at::Tensor out = at::mkldnn_convolution(
        input.to(at::kBFloat16), weight.to(at::kBFloat16), std::nullopt,
        p.padding, p.stride, p.dilation, p.groups);
    return with_bias(out.to(at::kFloat), bias);
  }
  return at::mkldnn_convolution(input, weight, bias, p.padding, p.stride,
                                p.dilation, p.groups);
}

// ATen's own im2col + GEMM kernels (groups == 1 only).
at::Tensor im2col_conv(const at::Tensor& input, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias,
                       const ConvParams& p) {
  const std::vector<int64_t> kernel{weight.size(2), weight.size(3)};
  const bool dilated = p.dilation[0] != 1 || p.dilation[1] != 1;
  at::Tensor out =
      dilated ? at::slow_conv_dilated2d(input, weight, kernel, bias, p.stride,
                                        p.padding, p.dilation)
              : at::_slow_conv2d_forward(input.contiguous(), weight, kernel,
                                         bias, p.stride, p.padding);
  return out.contiguous(input.suggest_memory_format());
}

std::string signature(const at::Tensor& input, const at::Tensor& weight,
                      bool has_bias, const ConvParams& p,
                      Fp32Precision precision) {
  std::ostringstream s;
  s << "input" << input.sizes() << input.strides() << " weight"
    << weight.sizes() << weight.strides() << (has_bias ? " bias" : "")
    << " stride" << c10::IntArrayRef(p.stride) << " padding"
    << c10::IntArrayRef(p.padding) << " dilation"
    << c10::IntArrayRef(p.dilation) << " groups " << p.groups << " "
    << flags::to_string(precision);
  return s.str();
}

at::Tensor engine_conv(const at::Tensor& input, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias,
                       const ConvParams& p) {
  const Fp32Precision precision = flags::conv_fp32_precision();
  observe::mark_path(
      observe::ExecutionPath::kNative,
      precision == Fp32Precision::kBf16 ? "onednn/bf16" : nullptr);
  const bool im2col_possible =
      p.groups == 1 && precision == Fp32Precision::kIeee;
  if (!flags::benchmark() || !im2col_possible) {
    if (precision != Fp32Precision::kBf16) {
      observe::mark_path(observe::ExecutionPath::kNative, "onednn");
    }
    return onednn_conv(input, weight, bias, p, precision);
  }
  tuning::Key key("convolution");
  key.add(input.sizes())
      .add(input.strides())
      .add(weight.sizes())
      .add(weight.strides())
      .add(bias.has_value() && bias->defined() ? 1 : 0)
      .add(p.stride)
      .add(p.padding)
      .add(p.dilation)
      .add(p.groups)
      .add(static_cast<int64_t>(precision));
  std::optional<size_t> cached = tuning::lookup(key);
  if (!cached.has_value()) {
    const std::vector<tuning::Candidate> candidates{
        {"onednn", [&] { onednn_conv(input, weight, bias, p, precision); }},
        {"im2col", [&] { im2col_conv(input, weight, bias, p); }},
    };
    cached = tuning::tune(
        key,
        signature(input, weight, bias.has_value() && bias->defined(), p,
                  precision),
        candidates);
  }
  const size_t choice = *cached;
  observe::mark_path(observe::ExecutionPath::kNative,
                     choice == 0 ? "onednn" : "im2col");
  return choice == 0 ? onednn_conv(input, weight, bias, p, precision)
                     : im2col_conv(input, weight, bias, p);
}

// --- the default route: a prepacked weight ---------------------------------

constexpr int64_t kMinPackedChannels = 4;

bool packed_route_applies(const at::Tensor& input, const at::Tensor& weight,
                          const std::optional<at::Tensor>& bias,
                          const ConvParams& p) {
  if (flags::cpu_parity() || flags::deterministic() ||
      flags::conv_fp32_precision() != Fp32Precision::kIeee) {
    return false;
  }
  // A graph capturing a training step reads the weight from its memory (a
  // graphed optimizer step writes it; the pack is a copy). Inference graphs
  // keep the pack and check the weight's version at each replay.
  if (capture::underway() && at::GradMode::is_enabled() &&
      weight.requires_grad()) {
    return false;
  }
  // An image of 1-3 channels (a first layer: RGB) takes CPU's path, whose
  // oneDNN first-layer kernel reads the plain image; the packed route pads
  // the channels to 8 or 16 and re-lays it out. Zen 3, 2 cores: ResNet-50's
  // stem 4.0-4.5 -> 2.2-2.3 ms, ViT-B/16's patch embedding 3.6-4.3 -> 3.0-3.1
  // (docs/backends.md); Zen 4 had the stem at 1.19 against 1.15 ms.
  if (input.dim() == 4 && input.size(1) < kMinPackedChannels) return false;
  const c10::Device device = input.device();
  const bool bias_ok =
      !bias.has_value() || !bias->defined() ||
      (bias->device() == device && bias->scalar_type() == at::kFloat &&
       bias->dim() == 1 && bias->is_contiguous());
  return device.type() == c10::DeviceType::PrivateUse1 &&
         weight.device() == device && bias_ok && input.numel() > 0 &&
         (input.is_contiguous() ||
          input.is_contiguous(at::MemoryFormat::ChannelsLast));
}

uint64_t geometry(const at::Tensor& input, const at::Tensor& weight,
                  const ConvParams& p, bool channels_last) {
  uint64_t h = channels_last ? 1 : 0;
  const auto mix = [&h](int64_t v) {
    h = h * 1000003u ^ std::hash<int64_t>()(v);
  };
  for (int64_t v : input.sizes()) mix(v);
  for (int64_t v : weight.sizes()) mix(v);
  for (int64_t v : weight.strides()) mix(v);
  for (const auto* values : {&p.stride, &p.padding, &p.dilation}) {
    for (int64_t v : *values) mix(v);
  }
  mix(p.groups);
  // oneDNN fits a reordered weight to the thread count of the moment: a pack
  // run on another count took 2.5-5x the time (Zen 3, 3x3 128 channels
  // 28x28, 1 <-> 2 threads). Each count gets its own pack.
  mix(at::get_num_threads());
  return h;
}

at::Tensor convolution_pointwise(const at::Tensor& input,
                                 const at::Tensor& weight,
                                 const std::optional<at::Tensor>& bias,
                                 const ConvParams& p) {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow(
          "mkldnn::_convolution_pointwise", "");
  torch::jit::Stack stack;
  stack.reserve(10);
  stack.emplace_back(input);
  stack.emplace_back(weight);
  stack.emplace_back(bias);
  stack.emplace_back(p.padding);
  stack.emplace_back(p.stride);
  stack.emplace_back(p.dilation);
  stack.emplace_back(p.groups);
  stack.emplace_back("none");
  stack.emplace_back(c10::List<std::optional<at::Scalar>>());
  stack.emplace_back(c10::IValue());
  op.callBoxed(stack);
  return stack.back().toTensor();
}

// The result's sizes (N, Cout, Hout, Wout) of a 2-D convolution.
std::vector<int64_t> output_sizes(const at::Tensor& input,
                                  const at::Tensor& weight,
                                  const ConvParams& p) {
  std::vector<int64_t> sizes{input.size(0), weight.size(0)};
  for (int d = 0; d < 2; ++d) {
    const int64_t extent = p.dilation[d] * (weight.size(2 + d) - 1) + 1;
    sizes.push_back(
        (input.size(2 + d) + 2 * p.padding[d] - extent) / p.stride[d] + 1);
  }
  return sizes;
}

// A contiguous NCHW fp32 image batch re-laid channels-last by ember's
// transposes (oneDNN's own re-layout of an NCHW input is ATen's strided
// copy).
at::Tensor channels_last_copy(const at::Tensor& x) {
  at::Tensor out = at::empty_strided(
      x.sizes(),
      {x.size(1) * x.size(2) * x.size(3), 1, x.size(3) * x.size(1), x.size(1)},
      x.options());
  contiguous_to_channels_last(x.const_data_ptr<float>(),
                              out.mutable_data_ptr<float>(), x.size(0),
                              x.size(1), x.size(2) * x.size(3));
  return out;
}

// oneDNN on the weight's pack, or nullopt when the weight has no pack yet
// (it is packed when it comes back unchanged). The output's memory format is
// CPU's: NCHW for an NCHW input, channels-last for a channels-last one.
// Every kernel size on an NCHW input runs channels-last, its input and output
// re-laid by ember's transposes: oneDNN's NCHW route re-lays the input, the
// weight and the output on every call (its blocked-to-NCHW output reorder
// alone is 0.85 ms for ResNet-50's 256x56x56), measured 1.2-7x slower than
// the channels-last route on ResNet-50's 1x1, 3x3 and 7x7 layers.
std::optional<at::Tensor> packed_conv(const at::Tensor& input,
                                      const at::Tensor& weight,
                                      const std::optional<at::Tensor>& bias,
                                      const ConvParams& p) {
  // CPU's rule (ATen's mkldnn_conv_use_channels_last): either operand in
  // channels-last makes the convolution channels-last.
  const bool channels_last =
      input.suggest_memory_format() == at::MemoryFormat::ChannelsLast ||
      weight.suggest_memory_format() == at::MemoryFormat::ChannelsLast;
  const std::vector<int64_t> sizes = output_sizes(input, weight, p);
  // An empty or negative output size: CPU's convolution raises its error.
  if (std::any_of(sizes.begin(), sizes.end(),
                  [](int64_t size) { return size <= 0; })) {
    return std::nullopt;
  }
  const std::vector<int64_t> input_size = input.sizes().vec();
  const auto packed = matmul::packed_onednn_weight(
      weight, matmul::PackKind::kOneDnnConv,
      geometry(input, weight, p, channels_last),
      [&](const at::Tensor& cpu_weight) {
        return at::mkldnn_reorder_conv2d_weight(
            at::_ops::to_mkldnn::call(cpu_weight.contiguous(), std::nullopt),
            p.padding, p.stride, p.dilation, p.groups, input_size);
      });
  if (!packed) return std::nullopt;
  // oneDNN on the pack into `out` (the layout `fresh` would have), or a
  // fresh result where `out` is undefined.
  const auto compute = [channels_last, packed, p,
                        watched = capture::WatchedWeight::of(weight)](
                           const at::Tensor& out, const at::Tensor& x,
                           const std::optional<at::Tensor>& b) -> at::Tensor {
    if (watched.written_since()) [[unlikely]] {
      // A replay after the weight was written: CPU's kernel on it.
      at::Tensor result =
          at::convolution(x, watched.weight_cpu, b, p.stride, p.padding,
                          p.dilation, false, {0, 0}, p.groups);
      return out.defined() ? const_cast<at::Tensor&>(out).copy_(result)
                           : result;
    }
    // The pointwise op is oneDNN's channels-last route.
    const at::Tensor result = convolution_pointwise(
        !channels_last && x.is_contiguous() ? channels_last_copy(x) : x,
        packed->onednn, b, p);
    if (channels_last) {
      return out.defined() ? const_cast<at::Tensor&>(out).copy_(result)
                           : result;
    }
    at::Tensor nchw =
        out.defined() ? out : at::empty(result.sizes(), result.options());
    channels_last_to_contiguous(
        result.const_data_ptr<float>(), nchw.mutable_data_ptr<float>(),
        result.size(0), result.size(1), result.size(2) * result.size(3));
    return nchw;
  };
  static const std::string launched_name = "aten::convolution (onednn)";
  if (!channels_last && input.is_contiguous() &&
      input.scalar_type() == at::kFloat && holds_convolutions()) {
    // Held for the batch norm, add and ReLU that may follow (ConvEpilogue.h):
    // their steps run on each block of the result as it is re-laid to NCHW,
    // instead of as passes of their own over it.
    at::Tensor held = at::empty(sizes, input.options());
    hold_convolution(launched_name, held,
                     [input, bias, packed, p](
                         float* out, const matmul::ChannelEpilogue* epilogue) {
                       const at::Tensor x = cpu_alias(input);
                       const std::optional<at::Tensor> b =
                           bias.has_value() && bias->defined()
                               ? std::optional<at::Tensor>(cpu_alias(*bias))
                               : std::nullopt;
                       const at::Tensor result = convolution_pointwise(
                           channels_last_copy(x), packed->onednn, b, p);
                       channels_last_to_contiguous(
                           result.const_data_ptr<float>(), out, result.size(0),
                           result.size(1), result.size(2) * result.size(3),
                           epilogue);
                     });
    observe::mark_path(observe::ExecutionPath::kNative, "onednn/packed");
    return held;
  }
  // A channels-last result is oneDNN's own: launched, it is copied into the
  // preallocated one. At the call the synchronous form below returns it
  // (as the packed GEMM does: matmul/FastGemm.cpp run_onednn).
  const int64_t result_numel = sizes[0] * sizes[1] * sizes[2] * sizes[3];
  std::optional<at::Tensor> out;
  if (!channels_last || !runs_at_call(input.device().index(), result_numel)) {
    out = unboxed::launch_into(
        launched_name,
        [&] {
          return channels_last
                     ? at::empty(sizes, input.options().memory_format(
                                            at::MemoryFormat::ChannelsLast))
                     : at::empty(sizes, input.options());
        },
        [compute](const at::Tensor& o, const at::Tensor& x,
                  const std::optional<at::Tensor>& b) { compute(o, x, b); },
        input, bias);
  }
  if (!out) {
    out = unboxed::custom<at::Tensor>(
        "aten::convolution",
        unboxed::replayable(
            [compute](const at::Tensor& x, const std::optional<at::Tensor>& b) {
              return compute(at::Tensor(), x, b);
            }),
        input, bias);
  }
  observe::mark_path(observe::ExecutionPath::kNative, "onednn/packed");
  return *std::move(out);
}

std::vector<int64_t> concrete(c10::SymIntArrayRef values) {
  std::vector<int64_t> out;
  for (const auto& v : values) out.push_back(v.guard_int(__FILE__, __LINE__));
  return out;
}

// Positive strides and dilations, no negative padding, and the dilated
// kernel inside the padded image in both dimensions (what CPU checks).
bool window_fits(const at::Tensor& input, const at::Tensor& weight,
                 const ConvParams& p) {
  for (int d = 0; d < 2; ++d) {
    if (p.stride[d] < 1 || p.dilation[d] < 1 || p.padding[d] < 0) return false;
    const int64_t extent = p.dilation[d] * (weight.size(2 + d) - 1) + 1;
    if (input.size(2 + d) + 2 * p.padding[d] < extent) return false;
  }
  return true;
}

// The default: CPU's whole convolution path, through the boxed delegation.
at::Tensor cpu_convolution(const at::Tensor& input, const at::Tensor& weight,
                           const std::optional<at::Tensor>& bias,
                           c10::SymIntArrayRef stride,
                           c10::SymIntArrayRef padding,
                           c10::SymIntArrayRef dilation, bool transposed,
                           c10::SymIntArrayRef output_padding,
                           const c10::SymInt& groups) {
  static const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::convolution", "");
  return unboxed::boxed(op, input, weight, bias, stride, padding, dilation,
                        transposed, output_padding, groups)
      .back()
      .toTensor();
}

}  // namespace

at::Tensor convolution(const at::Tensor& input, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias,
                       c10::SymIntArrayRef stride, c10::SymIntArrayRef padding,
                       c10::SymIntArrayRef dilation, bool transposed,
                       c10::SymIntArrayRef output_padding, c10::SymInt groups) {
  const bool fp32_2d = !transposed && input.dim() == 4 &&
                       input.scalar_type() == at::kFloat &&
                       weight.scalar_type() == at::kFloat;
  if (!fp32_2d ||
      (flags::cpu_parity() && !engine_applies(input, weight, transposed))) {
    return cpu_convolution(input, weight, bias, stride, padding, dilation,
                           transposed, output_padding, groups);
  }
  ConvParams params{concrete(stride), concrete(padding), concrete(dilation),
                    groups.guard_int(__FILE__, __LINE__)};
  // Argument validation (shapes, channels, groups, strides, padding,
  // dilation, a window larger than the padded image) is CPU's: an invalid
  // call never reaches the engine.
  if (params.stride.size() != 2 || params.padding.size() != 2 ||
      params.dilation.size() != 2 || weight.dim() != 4 ||
      input.size(1) != weight.size(1) * params.groups ||
      weight.size(0) % params.groups != 0 || input.size(0) == 0 ||
      !window_fits(input, weight, params)) {
    return cpu_convolution(input, weight, bias, stride, padding, dilation,
                           transposed, output_padding, groups);
  }
  if (packed_route_applies(input, weight, bias, params)) {
    if (channel_gemm_route_applies(input, weight, params.stride, params.padding,
                                   params.dilation, params.groups)) {
      return channel_gemm_convolution(input, weight, bias, params.stride,
                                      params.padding, params.dilation);
    }
    if (winograd_route_applies(input, weight, params.stride, params.padding,
                               params.dilation, params.groups)) {
      if (auto out = winograd_convolution(input, weight, bias, params.padding))
        return *out;
    }
    if (auto out = packed_conv(input, weight, bias, params)) return *out;
  }
  if (!engine_applies(input, weight, transposed)) {
    return cpu_convolution(input, weight, bias, stride, padding, dilation,
                           transposed, output_padding, groups);
  }
  return unboxed::custom<at::Tensor>(
      "aten::convolution",
      unboxed::replayable([params](const at::Tensor& x, const at::Tensor& w,
                                   const std::optional<at::Tensor>& b) {
        return engine_conv(x, w, b, params);
      }),
      input, weight, bias);
}

}  // namespace ember::kernels
