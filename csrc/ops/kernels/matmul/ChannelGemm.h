// GEMM over the channels of NCHW images: out (M x N) = W (M x K) @ x (K x N)
// per image, with the weight on the left. A 1x1 convolution of a contiguous
// NCHW image is exactly this (K input channels, N = H*W pixels, M output
// channels), so it runs on the image's own layout: oneDNN's convolution
// wants channels-last and pays two re-layouts per call on NCHW tensors.
// Plain C++ with AVX-512 or AVX2 + FMA intrinsics; no torch types.
#pragma once

#include <cstdint>

namespace ember::matmul {

// Whether this CPU runs the kernel (AVX-512F, or AVX2 + FMA). Decided once
// from CPUID.
bool channel_gemm_supported();
// Whether it applies epilogues (the same CPUs).
bool channel_epilogues_supported();

// Elementwise steps applied to each block of the product while it is in
// cache (a convolution's batch norm, residual add and ReLU), each with the
// arithmetic of the op's own kernel, so the bits are those of the ops run
// one after another on this CPU (channel_epilogues_supported()).
struct ChannelEpilogueStep {
  enum class Kind : uint8_t {
    kAffine,  // v * scale[row] + shift[row], as batch norm's kernel rounds
    kAdd,     // v + addend (same layout as out)
    kRelu,    // max(0, v)
  };
  Kind kind = Kind::kRelu;
  const float* scale = nullptr;  // kAffine: one per output row
  const float* shift = nullptr;
  const float* addend = nullptr;  // kAdd: image 0, row stride ldo
  float* out = nullptr;           // where the step's result is stored, or null
};

inline constexpr int kMaxEpilogueSteps = 8;

struct ChannelEpilogue {
  int count = 0;
  ChannelEpilogueStep steps[kMaxEpilogueSteps];
  // Whether the product itself (args.out) is stored; when not, out is
  // still addressed (the steps' layout) but never written.
  bool store_product = true;
};

// Columns apply_channel_epilogue takes per call: a block of the kernel's
// (3 pixel panels and a dot-product tail).
inline constexpr int64_t kChannelEpilogueColumns = 52;

// The epilogue's steps over `rows` x `columns` (<= kChannelEpilogueColumns)
// of a product block at `product` (row stride ld), whose place in out's
// layout is element `at` (first output row, i.e. channel, `row0`; row
// stride ldo). For kernels that compute outputs of this layout otherwise
// (conv/WinogradF2x3.h).
void apply_channel_epilogue(const ChannelEpilogue& e, const float* product,
                            int64_t ld, int64_t at, int64_t ldo, int64_t row0,
                            int64_t rows, int64_t columns);

struct ChannelGemmArgs {
  const float* w = nullptr;  // M x K, row stride ldw, unit column stride
  int64_t ldw = 0;
  const float* x = nullptr;  // K x N per image, row stride ldx
  int64_t ldx = 0;
  int64_t x_image_stride = 0;
  const float* bias = nullptr;  // M values (one per output row), or null
  float* out = nullptr;         // M x N per image, row stride ldo
  int64_t ldo = 0;
  int64_t out_image_stride = 0;
  int64_t m = 0, k = 0, n = 0, images = 1;
  // Steps applied to the product (null: none). Their outputs and addends
  // follow out's layout (ldo, out_image_stride).
  const ChannelEpilogue* epilogue = nullptr;
};

// out[i] = w @ x[i] (+ bias per row) for every image i. Parallel over
// blocks of pixels and rows; every element's sum runs over k in order,
// whatever the thread count (reproducible run to run).
void channel_gemm_f32(const ChannelGemmArgs& args);

}  // namespace ember::matmul
