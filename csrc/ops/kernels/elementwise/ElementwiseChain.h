// Elementwise chains: ember's fp32 elementwise kernels launched one after
// another over the same elements (GPT-2's GELU is eight: pow, mul, add, mul,
// tanh, add, mul, mul over the whole MLP activation) are held on their
// stream (runtime HeldWork) instead of run one by one, and run as one unit
// when the stream is next used for anything else: tile by tile, each step
// reading its operands from the tile the step before it has just written
// (in L1) instead of from memory, and a step's result that no one holds any
// more by then (a Python temporary) is never written to memory at all.
//
// Each step is the kernel the op runs unchained (ArithF32.h, VectorMath.h),
// element by element, so the bits are the same. Off:
// torch.backends.ember.fuse_elementwise = False (EMBER_FUSE_ELEMENTWISE=0).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace ember::kernels {

// The first five in Arith's order (ArithF32.h).
enum class ChainOp : uint8_t {
  kAdd,
  kSub,
  kMul,
  kDiv,
  kRelu,
  kTanh,
  kSquare,
  kCube,
};

// Whether an op over the flat fp32 tensor `a` joins a chain now: the
// switch is on, ops are launched (asynchronous execution, not cpu_parity),
// no graph captures, the CPU has the kernels (AVX-512F), and a has at least
// kMinChainElements elements (below, the elements stay in cache between
// unchained passes anyway).
bool chains(const at::Tensor& a);
inline constexpr int64_t kMinChainElements = 16384;

// Runs `op` over `a` (flat fp32, chains(a)) and `b` (for the binary ops: a
// flat fp32 tensor with a's sizes on a's device, or nullptr for `scalar`)
// as the next step of the current stream's chain; returns its result
// (allocated now, contiguous with a's sizes; computed when the chain runs).
at::Tensor chain_step(ChainOp op, const at::Tensor& a, const at::Tensor* b,
                      float scalar = 0.0f);

// What the chains did since the last reset (torch_ember.chain_stats()):
// chains run, the steps they ran, the steps whose results were written to
// memory (someone still held them) and the steps skipped (no one held the
// result and no later step read it).
struct ChainStats {
  int64_t chains = 0;
  int64_t steps = 0;
  int64_t written = 0;
  int64_t skipped = 0;
};
ChainStats chain_stats();
void reset_chain_stats();

}  // namespace ember::kernels
