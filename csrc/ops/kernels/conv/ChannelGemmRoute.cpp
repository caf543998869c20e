#include "ops/kernels/conv/ChannelGemmRoute.h"

#include <ATen/ops/empty.h>

#include <string>

#include "observe/ExecutionPath.h"
#include "ops/LaunchedOps.h"
#include "ops/UnboxedDelegation.h"
#include "ops/kernels/AlignedFloats.h"
#include "ops/kernels/ConvEpilogue.h"
#include "ops/kernels/LayoutTranspose.h"
#include "ops/kernels/matmul/ChannelGemm.h"

namespace ember::kernels {
namespace {

// Outputs of at least one 16-pixel panel take the route (ChannelGemmRoute.h).
constexpr int64_t kMinPixels = 16;

ConvWindow window_of(const at::Tensor& input, const at::Tensor& weight,
                     const std::vector<int64_t>& stride,
                     const std::vector<int64_t>& padding,
                     const std::vector<int64_t>& dilation) {
  ConvWindow g;
  g.channels = input.size(1);
  g.height = input.size(2);
  g.width = input.size(3);
  g.kernel_h = weight.size(2);
  g.kernel_w = weight.size(3);
  g.stride_h = stride[0];
  g.stride_w = stride[1];
  g.pad_h = padding[0];
  g.pad_w = padding[1];
  g.dilation_h = dilation[0];
  g.dilation_w = dilation[1];
  return g;
}

// The gathered pixels' buffer (one per thread) is kept for the next call
// while it holds at most kKeptGatherFloats (4 MiB: every ResNet-50 layer
// that gathers needs under 1 MiB); a larger one lives for its call only.
constexpr int64_t kKeptGatherFloats = int64_t{1} << 20;

void channel_gemm_into(float* out_data, const at::Tensor& x,
                       const at::Tensor& w, const std::optional<at::Tensor>& b,
                       const ConvWindow& window,
                       const matmul::ChannelEpilogue* epilogue = nullptr) {
  const int64_t pixels = window.out_h() * window.out_w();
  const int64_t rows = w.size(1) * w.size(2) * w.size(3);  // Cin*kh*kw
  matmul::ChannelGemmArgs args;
  args.w = w.const_data_ptr<float>();
  args.ldw = rows;
  args.ldx = pixels;
  args.bias =
      b.has_value() && b->defined() ? b->const_data_ptr<float>() : nullptr;
  args.ldo = pixels;
  args.out_image_stride = w.size(0) * pixels;
  args.m = w.size(0);
  args.k = rows;
  args.n = pixels;
  args.epilogue = epilogue;
  const float* x_data = x.const_data_ptr<float>();
  if (rows == window.channels && window.stride_h == 1 && window.stride_w == 1 &&
      window.pad_h == 0 && window.pad_w == 0) {
    args.x = x_data;  // 1x1, stride 1: the image is the GEMM's operand
    args.x_image_stride = rows * pixels;
    args.out = out_data;
    args.images = x.size(0);
    matmul::channel_gemm_f32(args);
    return;
  }
  thread_local AlignedFloats scratch;
  float* columns = scratch.resize(rows * pixels);
  const int64_t image_size = window.channels * window.height * window.width;
  matmul::ChannelEpilogue shifted;
  for (int64_t image = 0; image < x.size(0); ++image) {
    im2col(x_data + image * image_size, columns, window);
    args.x = columns;
    const int64_t offset = image * args.out_image_stride;
    args.out = out_data + offset;
    if (epilogue != nullptr) {
      // The epilogue addresses image 0: this image's places instead.
      shifted = *epilogue;
      for (int s = 0; s < shifted.count; ++s) {
        matmul::ChannelEpilogueStep& step = shifted.steps[s];
        if (step.out != nullptr) step.out += offset;
        if (step.addend != nullptr) step.addend += offset;
      }
      args.epilogue = &shifted;
    }
    matmul::channel_gemm_f32(args);
  }
  scratch.release_above(kKeptGatherFloats);
}

}  // namespace

bool channel_gemm_route_applies(const at::Tensor& input,
                                const at::Tensor& weight,
                                const std::vector<int64_t>& stride,
                                const std::vector<int64_t>& padding,
                                const std::vector<int64_t>& dilation,
                                int64_t groups) {
  if (!matmul::channel_gemm_supported() || groups != 1 ||
      !input.is_contiguous() || !weight.is_contiguous() ||
      weight.suggest_memory_format() != at::MemoryFormat::Contiguous ||
      input.suggest_memory_format() != at::MemoryFormat::Contiguous) {
    return false;
  }
  const ConvWindow g = window_of(input, weight, stride, padding, dilation);
  const int64_t pixels = g.out_h() * g.out_w();
  const bool pointwise =
      g.kernel_h == 1 && g.kernel_w == 1 && g.pad_h == 0 && g.pad_w == 0;
  // An empty or negative output size: CPU's convolution raises its error.
  return pointwise && g.out_h() > 0 && g.out_w() > 0 && pixels >= kMinPixels;
}

at::Tensor channel_gemm_convolution(const at::Tensor& input,
                                    const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias,
                                    const std::vector<int64_t>& stride,
                                    const std::vector<int64_t>& padding,
                                    const std::vector<int64_t>& dilation) {
  static const std::string launched_name = "aten::convolution (channel-gemm)";
  const ConvWindow window = window_of(input, weight, stride, padding, dilation);
  const std::vector<int64_t> sizes{input.size(0), weight.size(0),
                                   window.out_h(), window.out_w()};
  observe::mark_path(observe::ExecutionPath::kNative, "channel-gemm");
  if (holds_convolutions()) {
    // Held for the batch norm, add and ReLU that may follow (ConvEpilogue.h).
    at::Tensor held = at::empty(sizes, input.options());
    hold_convolution(launched_name, held,
                     [input, weight, bias, window](
                         float* out, const matmul::ChannelEpilogue* epilogue) {
                       channel_gemm_into(out, input, weight, bias, window,
                                         epilogue);
                     });
    return held;
  }
  const auto into = [window](const at::Tensor& out, const at::Tensor& x,
                             const at::Tensor& w,
                             const std::optional<at::Tensor>& b) {
    channel_gemm_into(const_cast<at::Tensor&>(out).mutable_data_ptr<float>(), x,
                      w, b, window);
  };
  std::optional<at::Tensor> out = unboxed::launch_into(
      launched_name, [&] { return at::empty(sizes, input.options()); }, into,
      input, weight, bias);
  if (!out) {
    out = unboxed::custom<at::Tensor>(
        "aten::convolution",
        unboxed::replayable([into, sizes](const at::Tensor& x,
                                          const at::Tensor& w,
                                          const std::optional<at::Tensor>& b) {
          at::Tensor result = at::empty(sizes, x.options());
          into(result, x, w, b);
          return result;
        }),
        input, weight, bias);
  }
  return *std::move(out);
}

}  // namespace ember::kernels
