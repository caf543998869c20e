// Convolution epilogues (ConvEpilogue.h): the held convolution and the
// steps that join it.
#include "ops/kernels/ConvEpilogue.h"

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

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
#include "ops/StorageWrites.h"
#include "ops/kernels/elementwise/ChannelAffine.h"
#include "ops/kernels/elementwise/VectorMath.h"
#include "ops/kernels/matmul/PanelTile.h"

namespace ember::kernels {
namespace {

using Kind = matmul::ChannelEpilogueStep::Kind;

// A step as held: its operands kept alive until the convolution runs, and
// where its result goes.
struct HeldStep {
  Kind kind = Kind::kRelu;
  // The result's memory: `storage` is this work's own reference to a new
  // result; an in-place step has none (it writes the result before it).
  c10::Storage storage;
  float* out = nullptr;
  int result = 0;  // index of the result it writes (0: the product)
  // kAffine: batch norm's statistics, weight and bias, folded when it runs
  std::optional<at::Tensor> weight, bias;
  at::Tensor mean, var;
  float eps = 0.0f;
  at::Tensor addend;  // kAdd
};

// What a submitted convolution runs: shared by the copies of its closure,
// so the results' reference counts say who else holds them.
struct HeldUnit {
  ConvolutionKernel kernel;
  c10::Storage product_storage;
  float* product = nullptr;
  int64_t channels = 0;
  int count = 0;
  std::array<HeldStep, matmul::kMaxEpilogueSteps> steps;
};

std::atomic<int64_t> g_convolutions{0};
std::atomic<int64_t> g_steps{0};
std::atomic<int64_t> g_written{0};

void run_unit(const HeldUnit& u) {
  if (u.count == 0) {
    u.kernel(u.product, nullptr);
    return;
  }
  // Results: 0 the product, then one per step that allocated one. Each is
  // written by the last step that writes it, and only where someone besides
  // this work holds it -- judged now: the Python temporaries are gone by
  // the time the stream's next op submitted the work.
  std::array<const c10::Storage*, matmul::kMaxEpilogueSteps + 1> storage{};
  std::array<int, matmul::kMaxEpilogueSteps + 1> last_writer{};
  storage[0] = &u.product_storage;
  last_writer[0] = -1;
  for (int k = 0; k < u.count; ++k) {
    const HeldStep& s = u.steps[k];
    if (s.storage) storage[s.result] = &s.storage;
    last_writer[s.result] = k;
  }
  const auto held = [&](int result) {
    return storage[result]->use_count() > 1;
  };
  matmul::ChannelEpilogue epilogue;
  epilogue.count = u.count;
  epilogue.store_product = last_writer[0] == -1 && held(0);
  int64_t written = epilogue.store_product;
  std::vector<std::vector<float>> folded;  // scale and shift per affine step
  folded.reserve(2 * static_cast<size_t>(u.count));
  for (int k = 0; k < u.count; ++k) {
    const HeldStep& s = u.steps[k];
    matmul::ChannelEpilogueStep& step = epilogue.steps[k];
    step.kind = s.kind;
    if (last_writer[s.result] == k && held(s.result)) {
      step.out = s.out;
      ++written;
    }
    if (s.kind == Kind::kAffine) {
      std::vector<float>& scale = folded.emplace_back(u.channels);
      std::vector<float>& shift = folded.emplace_back(u.channels);
      const auto data = [](const std::optional<at::Tensor>& t) {
        return t.has_value() && t->defined() ? t->const_data_ptr<float>()
                                             : nullptr;
      };
      fold_batch_norm_f32(s.mean.const_data_ptr<float>(),
                          s.var.const_data_ptr<float>(), data(s.weight),
                          data(s.bias), s.eps, u.channels, scale.data(),
                          shift.data());
      step.scale = scale.data();
      step.shift = shift.data();
    } else if (s.kind == Kind::kAdd) {
      step.addend = s.addend.const_data_ptr<float>();
    }
  }
  g_convolutions.fetch_add(1, std::memory_order_relaxed);
  g_steps.fetch_add(u.count, std::memory_order_relaxed);
  g_written.fetch_add(written, std::memory_order_relaxed);
  u.kernel(u.product, &epilogue);
}

class HeldConvolution final : public runtime::HeldWork {
 public:
  HeldConvolution(const std::string& name, const at::Tensor& product,
                  ConvolutionKernel kernel)
      : name_(name),
        device_(product.device().index()),
        sizes_(product.sizes().vec()),
        numel_(product.numel()),
        unit_(std::make_shared<HeldUnit>()) {
    unit_->kernel = std::move(kernel);
    unit_->product_storage = product.storage();
    unit_->product = product.mutable_data_ptr<float>();
    unit_->channels = product.size(1);
    latest_ = product.storage().unsafeGetStorageImpl();
  }

  // Whether `t` is the latest result: its memory, laid out as the product.
  bool is_latest(const at::Tensor& t) const {
    return t.device().index() == device_ &&
           t.storage().unsafeGetStorageImpl() == latest_ &&
           t.storage_offset() == 0 && t.sizes() == c10::IntArrayRef(sizes_) &&
           t.is_contiguous();
  }

  bool full() const { return unit_->count == matmul::kMaxEpilogueSteps; }

  // Whether `t` is memory this work writes (a step may not read it).
  bool writes(const at::Tensor& t) const {
    const c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
    if (s == unit_->product_storage.unsafeGetStorageImpl()) return true;
    for (int k = 0; k < unit_->count; ++k) {
      if (s == unit_->steps[k].storage.unsafeGetStorageImpl()) return true;
    }
    return false;
  }

  const std::vector<int64_t>& sizes() const { return sizes_; }

  // Appends a step writing a new result `out`, or (out undefined) the
  // latest result in place.
  void append(HeldStep step, const at::Tensor& out) {
    HeldUnit& u = *unit_;
    if (out.defined()) {
      step.storage = out.storage();
      step.out = out.mutable_data_ptr<float>();
      step.result = ++results_;
      latest_ = out.storage().unsafeGetStorageImpl();
      latest_out_ = step.out;
    } else {
      step.out = results_ == 0 ? u.product : latest_out_;
      step.result = results_;
    }
    u.steps[u.count++] = std::move(step);
  }

  void submit(runtime::Stream& stream) override {
    const bool queued = launch_on_stream(
        stream, device_, name_.c_str(), [unit = unit_] { run_unit(*unit); },
        numel_);
    if (queued) count_launch(name_);
  }

 private:
  const std::string& name_;
  c10::DeviceIndex device_;
  std::vector<int64_t> sizes_;
  int64_t numel_;
  std::shared_ptr<HeldUnit> unit_;
  const c10::StorageImpl* latest_ = nullptr;
  float* latest_out_ = nullptr;
  int results_ = 0;
};

bool flat_f32(const at::Tensor& t) {
  return t.defined() && t.is_privateuseone() && t.scalar_type() == at::kFloat &&
         t.is_contiguous() && !t.is_conj() && !t.is_neg();
}

// Runs `join(conv)` on the held convolution of input's current stream
// whose latest result is `input`; its result, or nullopt.
template <class Join>
std::optional<at::Tensor> join_held(const at::Tensor& input, Join&& join) {
  if (!flat_f32(input)) return std::nullopt;
  runtime::Stream& stream =
      runtime::device(input.device().index()).streams().current();
  std::optional<at::Tensor> result;
  stream.extend_held([&](runtime::HeldWork& held) {
    auto* conv = dynamic_cast<HeldConvolution*>(&held);
    if (conv == nullptr || conv->full() || !conv->is_latest(input)) {
      return false;
    }
    result = join(*conv);
    return result.has_value();
  });
  return result;
}

at::Tensor new_result(const at::Tensor& like) {
  at::Tensor out = at::empty(like.sizes(), like.options());
  note_storage_write(out);
  return out;
}

bool channel_vector(const at::Tensor& t, int64_t channels, c10::Device device) {
  return flat_f32(t) && t.device() == device && t.dim() == 1 &&
         t.size(0) == channels;
}

}  // namespace

bool holds_convolutions() {
  return flags::fuse_elementwise() && launch_async() &&
         flags::verbose_level() == 0 && !capture::underway() &&
         matmul::channel_epilogues_supported() && vector_math_supported();
}

void hold_convolution(const std::string& name, const at::Tensor& product,
                      ConvolutionKernel kernel) {
  note_storage_write(product);
  runtime::Stream& stream =
      runtime::device(product.device().index()).streams().current();
  // submits the stream's held work first
  stream.hold(
      std::make_unique<HeldConvolution>(name, product, std::move(kernel)));
}

std::optional<at::Tensor> epilogue_batch_norm(
    const at::Tensor& input, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& bias, const at::Tensor& running_mean,
    const at::Tensor& running_var, double eps) {
  if (input.dim() != 4) return std::nullopt;
  const int64_t channels = input.size(1);
  const c10::Device device = input.device();
  const auto optional_ok = [&](const std::optional<at::Tensor>& t) {
    return !t.has_value() || !t->defined() ||
           channel_vector(*t, channels, device);
  };
  if (!channel_vector(running_mean, channels, device) ||
      !channel_vector(running_var, channels, device) || !optional_ok(weight) ||
      !optional_ok(bias)) {
    return std::nullopt;
  }
  return join_held(input, [&](HeldConvolution& conv) {
    HeldStep step;
    step.kind = Kind::kAffine;
    step.weight = weight;
    step.bias = bias;
    step.mean = running_mean;
    step.var = running_var;
    step.eps = static_cast<float>(eps);
    at::Tensor out = new_result(input);
    conv.append(std::move(step), out);
    return std::optional<at::Tensor>(out);
  });
}

std::optional<at::Tensor> epilogue_relu(const at::Tensor& input) {
  return join_held(input, [&](HeldConvolution& conv) {
    HeldStep step;
    step.kind = Kind::kRelu;
    at::Tensor out = new_result(input);
    conv.append(std::move(step), out);
    return std::optional<at::Tensor>(out);
  });
}

namespace {

std::optional<at::Tensor> join_add(const at::Tensor& input,
                                   const at::Tensor& other, bool in_place) {
  if (!flat_f32(other) || other.device() != input.device() ||
      other.sizes() != input.sizes()) {
    return std::nullopt;
  }
  return join_held(input, [&](HeldConvolution& conv) {
    // An addend the held work computes is not in memory yet.
    if (conv.writes(other)) return std::optional<at::Tensor>();
    HeldStep step;
    step.kind = Kind::kAdd;
    step.addend = other;
    at::Tensor out = in_place ? at::Tensor() : new_result(input);
    conv.append(std::move(step), out);
    return std::optional<at::Tensor>(in_place ? input : out);
  });
}

}  // namespace

std::optional<at::Tensor> epilogue_add(const at::Tensor& input,
                                       const at::Tensor& other) {
  return join_add(input, other, /*in_place=*/false);
}

bool epilogue_add_(const at::Tensor& input, const at::Tensor& other) {
  if (join_add(input, other, /*in_place=*/true)) {
    note_storage_write(input);
    return true;
  }
  return false;
}

EpilogueStats epilogue_stats() {
  return {g_convolutions.load(), g_steps.load(), g_written.load()};
}

void reset_epilogue_stats() {
  g_convolutions = 0;
  g_steps = 0;
  g_written = 0;
}

}  // namespace ember::kernels
