// Elementwise chains, fused at run time. A large elementwise result that
// would run at the call on an idle stream is instead held by the stream
// (runtime::Stream::hold) with a description of how to compute any range of
// its elements (ElementwiseRanges). When something else happens on the
// stream, the held ops run: consecutive ones over the same elements, whose
// operands are the same memory or disjoint, range by range, each range
// through every op while it is in the core's L2, instead of op by op over
// the whole tensors. On hosts whose L3 serves a core at about DRAM speed, an
// op over 1.5 MB operands (GPT-2's 128 x 3072 MLP activations) reads and
// writes at ~19 GB/s per core against ~55 GB/s in L2: GPT-2's tanh-GELU,
// eight such ops, took 826 us per layer.
//
// Only ops whose every element is computed the same way wherever a range
// begins are held (ember's vector kernels, and ATen's split-free ones:
// mul, div, add/sub with alpha 1, relu, pow by 2 or 3), so a fused chain
// gives the bits the ops give one by one. Off under cpu_parity and
// deterministic mode, while the profiler records, and with
// torch.backends.ember.fuse_elementwise = False.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <vector>

#include "ember/runtime/stream.h"

namespace ember {

// Ranges of an elementwise op over `size` elements: fn(begin, end)
// computes elements [begin, end) of its result.
class ElementwiseRanges final : public runtime::RangeWork {
 public:
  using RangeFn = std::function<void(int64_t begin, int64_t end)>;
  ElementwiseRanges(int64_t size, std::vector<ByteRange> memory, RangeFn fn)
      : size_(size), memory_(std::move(memory)), fn_(std::move(fn)) {}
  int64_t size() const override { return size_; }
  void run_range(int64_t begin, int64_t end) const override { fn_(begin, end); }
  const std::vector<ByteRange>& memory() const override { return memory_; }

 private:
  int64_t size_;
  std::vector<ByteRange> memory_;
  RangeFn fn_;
};

// Whether elementwise ops may be held now (the switches above).
bool holds_elementwise();

// The memory of an elementwise op computing `out` from `operands` (CPU
// aliases) range by range, or nullopt where it cannot: `out` contiguous,
// and each defined operand either contiguous with out's sizes or 0-dim.
std::optional<std::vector<runtime::RangeWork::ByteRange>> elementwise_memory(
    const at::Tensor& out, std::initializer_list<const at::Tensor*> operands);

// Elements [begin, end) of a contiguous tensor as a flat view; a 0-dim
// tensor as it is.
at::Tensor element_range(const at::Tensor& t, int64_t begin, int64_t end);

}  // namespace ember
