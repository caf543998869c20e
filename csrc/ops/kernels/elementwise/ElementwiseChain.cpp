// Elementwise chains (ElementwiseChain.h): the held work, and the pass that
// runs it.

// GCC 12 reports its own intrinsics' deliberately undefined register
// operands (_mm512_undefined_*) as uninitialised.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "ops/kernels/elementwise/ElementwiseChain.h"

#include <ATen/ops/empty.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <utility>
#include <vector>

#include "ember/runtime/device.h"
#include "ember/runtime/stream.h"
#include "flags/BackendFlags.h"
#include "graphs/GraphCapture.h"
#include "ops/DeviceScope.h"
#include "ops/LaunchStats.h"
#include "ops/kernels/ParallelChunks.h"
#include "ops/kernels/elementwise/ArithF32.h"
#include "ops/kernels/elementwise/VectorMath.h"

namespace ember::kernels {
namespace {

static_assert(static_cast<int>(ChainOp::kRelu) ==
              static_cast<int>(Arith::kRelu));

constexpr int kMaxSteps = 16;
constexpr size_t kMaxInputs = 16;
// Floats per step and tile: 16 steps' tiles fill 32 KiB (an L1 data cache).
constexpr int64_t kTile = 512;
// Tiles per parallel chunk: 32768 elements, Arithmetic.cpp's grain.
constexpr int64_t kTilesPerChunk = 64;

// Where a step reads an operand: another step's result, elements outside
// the chain, or nothing (the scalar operand, or a unary op's).
struct Operand {
  const float* data = nullptr;
  int step = -1;
};

struct Step {
  ChainOp op = ChainOp::kAdd;
  Operand a, b;
  float scalar = 0.0f;
  float* out = nullptr;
  c10::Storage out_storage;  // the chain's own reference to the result
};

// What a submitted chain runs: shared by the copies of its closure, so the
// result storages' reference counts say who else holds them.
struct ChainUnit {
  int64_t n = 0;
  int count = 0;
  std::array<Step, kMaxSteps> steps;
  std::vector<c10::Storage> inputs;  // operands from outside, kept alive
};

std::atomic<int64_t> g_chains{0};
std::atomic<int64_t> g_steps{0};
std::atomic<int64_t> g_written{0};
std::atomic<int64_t> g_skipped{0};

void run_step(const Step& s, const float* a, const float* b, float* out,
              int64_t len) {
  switch (s.op) {
    case ChainOp::kAdd:
      return arith_f32<Arith::kAdd>(a, b, s.scalar, out, 0, len);
    case ChainOp::kSub:
      return arith_f32<Arith::kSub>(a, b, s.scalar, out, 0, len);
    case ChainOp::kMul:
      return arith_f32<Arith::kMul>(a, b, s.scalar, out, 0, len);
    case ChainOp::kDiv:
      return arith_f32<Arith::kDiv>(a, b, s.scalar, out, 0, len);
    case ChainOp::kRelu:
      return arith_f32<Arith::kRelu>(a, nullptr, 0.0f, out, 0, len);
    case ChainOp::kTanh:
      return tanh_f32(a, out, len);  // one tile: below its parallel grain
    case ChainOp::kSquare:
      return power_f32<2>(a, out, len);
    case ChainOp::kCube:
      return power_f32<3>(a, out, len);
  }
}

void run_chain(const ChainUnit& u) {
  // A result is written where someone besides the chain holds it (the
  // caller's tensor, a view, autograd); computed where written or read by
  // a later step. Judged now: the Python temporaries are gone by the time
  // the stream's next op submitted the chain.
  std::array<bool, kMaxSteps> write{};
  std::array<bool, kMaxSteps> needed{};
  for (int k = u.count - 1; k >= 0; --k) {
    const Step& s = u.steps[k];
    write[k] = s.out_storage.use_count() > 1;
    needed[k] = needed[k] || write[k];
    if (!needed[k]) continue;
    if (s.a.step >= 0) needed[s.a.step] = true;
    if (s.b.step >= 0) needed[s.b.step] = true;
  }
  int64_t written = 0, run = 0;
  for (int k = 0; k < u.count; ++k) {
    written += write[k];
    run += needed[k];
  }
  g_chains.fetch_add(1, std::memory_order_relaxed);
  g_steps.fetch_add(run, std::memory_order_relaxed);
  g_written.fetch_add(written, std::memory_order_relaxed);
  g_skipped.fetch_add(u.count - run, std::memory_order_relaxed);

  const int64_t tiles = (u.n + kTile - 1) / kTile;
  parallel_chunks(tiles, kTilesPerChunk, [&](int64_t first, int64_t last) {
    alignas(64) float scratch[kMaxSteps][kTile];
    for (int64_t t = first; t < last; ++t) {
      const int64_t offset = t * kTile;
      const int64_t len = std::min(kTile, u.n - offset);
      const auto where = [&](const Operand& o) -> const float* {
        if (o.step < 0) return o.data != nullptr ? o.data + offset : nullptr;
        return write[o.step] ? u.steps[o.step].out + offset : scratch[o.step];
      };
      for (int k = 0; k < u.count; ++k) {
        if (!needed[k]) continue;
        const Step& s = u.steps[k];
        float* out = write[k] ? s.out + offset : scratch[k];
        run_step(s, where(s.a), where(s.b), out, len);
      }
    }
  });
}

const std::string& chain_launch_name() {
  static const std::string name = "ember::elementwise_chain";
  return name;
}

class ElementwiseChain final : public runtime::HeldWork {
 public:
  ElementwiseChain(c10::DeviceIndex device, int64_t n)
      : device_(device), unit_(std::make_shared<ChainUnit>()) {
    unit_->n = n;
  }

  // Appends `op` with result `out`; false where it cannot join: the chain
  // is full, another device or size, or an operand reads a result of the
  // chain at another place (a slice of it: not computed yet).
  bool append(ChainOp op, const at::Tensor& a, const at::Tensor* b,
              float scalar, const at::Tensor& out) {
    ChainUnit& u = *unit_;
    if (u.count == kMaxSteps || a.device().index() != device_ ||
        a.numel() != u.n) {
      return false;
    }
    const size_t inputs = u.inputs.size();
    Step s{op, {}, {}, scalar, out.mutable_data_ptr<float>(), out.storage()};
    if (!operand(a, &s.a) || (b != nullptr && !operand(*b, &s.b))) {
      u.inputs.resize(inputs);  // nothing half-appended
      return false;
    }
    u.steps[u.count++] = std::move(s);
    return true;
  }

  void submit(runtime::Stream& stream) override {
    const std::string& name = chain_launch_name();
    const int64_t n = unit_->n;
    // The closure shares the unit: this object's reference is dropped when
    // the stream destroys it, outside its hold lock (stream.cpp).
    const bool queued = launch_on_stream(
        stream, device_, name.c_str(), [unit = unit_] { run_chain(*unit); }, n);
    if (queued) count_launch(name);
  }

 private:
  bool operand(const at::Tensor& t, Operand* o) {
    ChainUnit& u = *unit_;
    const float* data = t.const_data_ptr<float>();
    const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
    for (int k = 0; k < u.count; ++k) {
      if (u.steps[k].out == data) {
        o->step = k;
        return true;
      }
      if (u.steps[k].out_storage.unsafeGetStorageImpl() == storage) {
        return false;
      }
    }
    if (u.inputs.size() == kMaxInputs) return false;
    u.inputs.push_back(t.storage());
    o->data = data;
    return true;
  }

  c10::DeviceIndex device_;
  std::shared_ptr<ChainUnit> unit_;
};

}  // namespace

bool chains(const at::Tensor& a) {
  return a.numel() >= kMinChainElements && flags::fuse_elementwise() &&
         launch_async() && !capture::underway() && vector_math_supported();
}

at::Tensor chain_step(ChainOp op, const at::Tensor& a, const at::Tensor* b,
                      float scalar) {
  at::Tensor out = at::empty(a.sizes(), a.options());
  const c10::DeviceIndex device = a.device().index();
  runtime::Stream& stream = runtime::device(device).streams().current();
  const bool joined = stream.extend_held([&](runtime::HeldWork& held) {
    auto* chain = dynamic_cast<ElementwiseChain*>(&held);
    return chain != nullptr && chain->append(op, a, b, scalar, out);
  });
  if (!joined) {
    auto chain = std::make_unique<ElementwiseChain>(device, a.numel());
    // A fresh chain has no results an operand could overlap.
    TORCH_INTERNAL_ASSERT(chain->append(op, a, b, scalar, out));
    stream.hold(std::move(chain));  // submits the stream's held work first
  }
  return out;
}

ChainStats chain_stats() {
  return {g_chains.load(), g_steps.load(), g_written.load(), g_skipped.load()};
}

void reset_chain_stats() {
  g_chains = 0;
  g_steps = 0;
  g_written = 0;
  g_skipped = 0;
}

}  // namespace ember::kernels
