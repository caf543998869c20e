#include <ATen/Context.h>
#include <ATen/ExpandUtils.h>
#include <ATen/TensorOperators.h>
#include <ATen/WrapDimUtils.h>
#include <ATen/core/Reduction.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/_softmax.h>
#include <ATen/ops/_softmax_backward_data.h>
#include <ATen/ops/_softmax_backward_data_ops.h>
#include <ATen/ops/_softmax_ops.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/complex.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/gelu_ops.h>
#include <ATen/ops/imag.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/linalg_vector_norm_ops.h>
#include <ATen/ops/mean_ops.h>
#include <ATen/ops/mse_loss.h>
#include <ATen/ops/mse_loss_ops.h>
#include <ATen/ops/nansum_ops.h>
#include <ATen/ops/native_group_norm.h>
#include <ATen/ops/native_group_norm_backward.h>
#include <ATen/ops/native_group_norm_backward_ops.h>
#include <ATen/ops/native_group_norm_ops.h>
#include <ATen/ops/native_layer_norm_backward.h>
#include <ATen/ops/native_layer_norm_backward_ops.h>
#include <ATen/ops/norm_ops.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/real.h>
#include <ATen/ops/std_mean_ops.h>
#include <ATen/ops/std_ops.h>
#include <ATen/ops/sum_ops.h>
#include <ATen/ops/var_mean_ops.h>
#include <ATen/ops/var_ops.h>
#include <ATen/record_function.h>

#include <cmath>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/CpuAllocationCapture.h"
#include "core/ForkSafety.h"
#include "flags/BackendFlags.h"
#include "ops/CpuDelegation.h"
#include "ops/DelegationCall.h"
#include "ops/DeviceScope.h"
#include "ops/UnboxedDelegation.h"
#include "ops/kernels/DeterministicCommon.h"
#include "ops/kernels/DeterministicOps.h"
#include "ops/kernels/DeterministicReduce.h"
#include "ops/kernels/SerialScope.h"

namespace ember::kernels::deterministic {

namespace ops = at::_ops;
using unboxed::functional;
using namespace detail;  // NOLINT: the shared aliases of this kernel family

// --- boxed: serial delegation and alerts -----------------------------------

void single_threaded_when_deterministic(const c10::OperatorHandle& op,
                                        c10::DispatchKeySet keys,
                                        torch::jit::Stack* stack) {
  if (!flags::deterministic()) {
    cpu_delegation_fallback(op, keys, stack);
    return;
  }
  const SerialScope one_thread;
  cpu_delegation_fallback(op, keys, stack);
}

void serial_when_deterministic(const c10::OperatorHandle& op,
                               c10::DispatchKeySet keys,
                               torch::jit::Stack* stack) {
  if (!flags::deterministic()) {
    cpu_delegation_fallback(op, keys, stack);
    return;
  }
  // Stream::run executes inline on this thread, so the CPU kernel runs
  // inside the serial region.
  RECORD_FUNCTION("ember::deterministic::serial",
                  c10::ArrayRef<const c10::IValue>{});
  fixed::run_serially([&] { cpu_delegation_fallback(op, keys, stack); });
}

namespace {

// The out= overload of an elementwise op (sigmoid -> sigmoid.out,
// pow.Tensor_Scalar -> pow.Tensor_Scalar_out, sigmoid_backward ->
// sigmoid_backward.grad_input), if it takes the same arguments plus `out`.
std::optional<c10::OperatorHandle> out_overload(const c10::OperatorHandle& op) {
  // A leaf (the dispatcher's lookup takes only the dispatcher's own lock).
  static ForkHeldMutex mutex;
  static std::unordered_map<std::string, std::optional<c10::OperatorHandle>>
      cache;
  const auto& schema = op.schema();
  const std::string key = schema.name() + "." + schema.overload_name();
  std::lock_guard<std::mutex> lock(mutex);
  const auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  std::optional<c10::OperatorHandle> found;
  const std::string base = schema.overload_name();
  for (const std::string& overload :
       {base.empty() ? std::string("out") : base + "_out",
        std::string("grad_input")}) {
    auto candidate =
        c10::Dispatcher::singleton().findOp({schema.name(), overload});
    if (candidate.has_value() && candidate->schema().arguments().size() ==
                                     schema.arguments().size() + 1) {
      found = candidate;
      break;
    }
  }
  cache.emplace(key, found);
  return found;
}

// Elements per chunk of a chunked elementwise op: a multiple of every
// vector width, so only the last chunk has a scalar tail.
constexpr int64_t kElementwiseChunk = 65536;

}  // namespace

void elementwise_when_deterministic(const c10::OperatorHandle& op,
                                    c10::DispatchKeySet keys,
                                    torch::jit::Stack* stack) {
  if (!flags::deterministic()) {
    cpu_delegation_fallback(op, keys, stack);
    return;
  }
  // Chunkable: every tensor argument contiguous, of one floating dtype and
  // one shape; no complex scalar (the result keeps the inputs' dtype).
  const size_t count = op.schema().arguments().size();
  const size_t first = stack->size() - count;
  at::Tensor like;
  bool chunkable = true;
  for (size_t i = first; i < stack->size() && chunkable; ++i) {
    const c10::IValue& v = (*stack)[i];
    if (v.isTensor()) {
      const at::Tensor& t = v.toTensor();
      if (!like.defined()) like = t;
      chunkable = t.is_floating_point() && t.is_contiguous() &&
                  t.scalar_type() == like.scalar_type() &&
                  t.sizes() == like.sizes() && !t.is_conj() && !t.is_neg();
    } else if (v.isScalar()) {
      chunkable = !v.toScalar().isComplex();
    } else if (!(v.isNone() || v.isBool() || v.isInt() || v.isDouble() ||
                 v.isString())) {
      chunkable = false;
    }
  }
  const auto out_op =
      chunkable && like.defined() && like.numel() > kElementwiseChunk
          ? out_overload(op)
          : std::nullopt;
  if (!out_op.has_value()) {
    serial_when_deterministic(op, keys, stack);
    return;
  }
  RECORD_FUNCTION("ember::deterministic::elementwise",
                  c10::ArrayRef<const c10::IValue>{});
  // ATen's kernel on fixed chunks of the flattened tensors, in parallel:
  // each chunk runs serially, so every element takes the same (vector or
  // scalar) path whatever the thread count.
  at::Tensor out = at::empty_like(like, at::MemoryFormat::Contiguous);
  DelegationCall call(op.schema().name(), /*accepts_cpu_tensors=*/false);
  // (The aliases borrow the stack's tensors, which stay until the end.)
  std::vector<c10::IValue> arguments;
  arguments.reserve(count);
  for (size_t i = first; i < stack->size(); ++i) {
    const c10::IValue& v = (*stack)[i];
    arguments.emplace_back(
        v.isTensor()
            ? c10::IValue(call.to_cpu(v.toTensor(), false).reshape({-1}))
            : v);
  }
  const at::Tensor out_cpu = call.to_cpu(out, true).reshape({-1});
  call.settle();
  const int64_t numel = like.numel();
  const int64_t chunks = (numel + kElementwiseChunk - 1) / kElementwiseChunk;
  const c10::DeviceIndex device = call.device();
  run_on_device(device, [&] {
    CpuAllocationCapture capture(device);
    fixed::parallel_tiles(chunks, [&](int64_t chunk) {
      const int64_t start = chunk * kElementwiseChunk;
      const int64_t length = std::min(kElementwiseChunk, numel - start);
      torch::jit::Stack local;
      local.reserve(arguments.size() + 1);
      for (const c10::IValue& v : arguments) {
        local.emplace_back(
            v.isTensor() ? c10::IValue(v.toTensor().narrow(0, start, length))
                         : v);
      }
      local.emplace_back(out_cpu.narrow(0, start, length));
      out_op->redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU),
                              &local);
    });
  });
  torch::jit::drop(*stack, count);
  stack->emplace_back(out);
}

void put_(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
          torch::jit::Stack* stack) {
  // put_(self, index, source, accumulate): accumulate is last.
  const bool accumulate = stack->back().toBool();
  if (flags::deterministic() && !accumulate &&
      !at::globalContext().deterministicAlgorithms()) {
    // (Under use_deterministic_algorithms the CPU kernel alerts itself.)
    flags::alert_not_deterministic("put_");
  }
  serial_when_deterministic(op, keys, stack);
}

void loss_reduction(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                    torch::jit::Stack* stack) {
  if (!flags::deterministic()) {
    cpu_delegation_fallback(op, keys, stack);
    return;
  }
  const auto& arguments = op.schema().arguments();
  const size_t first = stack->size() - arguments.size();
  size_t index = 0;
  while (index < arguments.size() && arguments[index].name() != "reduction") {
    ++index;
  }
  TORCH_INTERNAL_ASSERT(index < arguments.size(), op.schema().name(),
                        " has no reduction argument");
  c10::IValue& reduction = (*stack)[first + index];
  const int64_t mode = reduction.toInt();
  if (mode == at::Reduction::None) {
    cpu_delegation_fallback(op, keys, stack);
    return;
  }
  RECORD_FUNCTION("ember::deterministic::loss_reduction",
                  c10::ArrayRef<const c10::IValue>{});
  reduction = c10::IValue(static_cast<int64_t>(at::Reduction::None));
  cpu_delegation_fallback(op, keys, stack);
  // The elementwise loss (an ember tensor), reduced by ember's kernels.
  const at::Tensor unreduced = stack->back().toTensor();
  stack->pop_back();
  stack->emplace_back(mode == at::Reduction::Mean ? unreduced.mean()
                                                  : unreduced.sum());
}

void reduction_out(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                   torch::jit::Stack* stack) {
  if (!flags::deterministic()) {
    cpu_delegation_fallback(op, keys, stack);
    return;
  }
  // sum.IntList_out -> sum.dim_IntList, mean.out -> mean.dim, ...: the
  // functional overload takes the same arguments minus `out`.
  static const std::unordered_map<std::string, std::string> functional_of = {
      {"aten::sum.IntList_out", "dim_IntList"},
      {"aten::mean.out", "dim"},
      {"aten::nansum.out", ""},
      {"aten::var.correction_out", "correction"},
      {"aten::std.correction_out", "correction"},
      {"aten::linalg_vector_norm.out", ""},
      {"aten::norm.out", "ScalarOpt_dim"},
  };
  const auto& schema = op.schema();
  const std::string name = schema.name() + "." + schema.overload_name();
  const auto it = functional_of.find(name);
  TORCH_INTERNAL_ASSERT(it != functional_of.end(), name,
                        " has no functional form here");
  const c10::OperatorHandle functional_op =
      c10::Dispatcher::singleton().findSchemaOrThrow(schema.name().c_str(),
                                                     it->second.c_str());
  at::Tensor out = stack->back().toTensor();
  stack->pop_back();
  functional_op.callBoxed(stack);  // below autograd: ember's kernel
  const at::Tensor result = stack->back().toTensor();
  stack->pop_back();
  at::native::resize_output(out, result.sizes());
  out.copy_(result);
  stack->emplace_back(out);
}

void alert_when_deterministic(const c10::OperatorHandle& op,
                              c10::DispatchKeySet keys,
                              torch::jit::Stack* stack) {
  if (flags::deterministic()) {
    static thread_local std::string name;
    name = op.schema().name();
    if (name.rfind("aten::", 0) == 0) name = name.substr(6);
    flags::alert_not_deterministic(name.c_str());
  }
  cpu_delegation_fallback(op, keys, stack);
}

}  // namespace ember::kernels::deterministic
