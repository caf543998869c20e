#include "ops/CpuDelegation.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/jit_type.h>
#include <c10/util/SmallVector.h>

#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/CpuAllocationCapture.h"
#include "core/EmberGenerator.h"
#include "core/RuntimeErrors.h"
#include "graphs/GraphCapture.h"
#include "ops/DelegationCall.h"
#include "ops/DeviceScope.h"
#include "ops/FallbackStats.h"

namespace ember {
namespace {

// What the fallback needs to know about an operator's schema, computed once
// per operator and thread (schemas never change after registration).
struct OpPlan {
  std::string name;                // "aten::add.Tensor"
  std::vector<bool> written;       // argument is mutated (in-place/out=)
  std::vector<bool> is_generator;  // argument is a Generator?
  bool has_generator = false;
  bool accepts_cpu_tensors = false;  // CUDA accepts CPU tensors here too
};

// Ops that CUDA runs with CPU tensor arguments (index tensors on the host).
// Built when the library loads, not on first use: a fork() taken while
// another thread was building a function-local static leaves the child
// waiting on that static's guard forever.
const std::unordered_set<std::string> ops_accepting_cpu_tensors = {
    "aten::index",     "aten::index_put_", "aten::_index_put_impl_",
    "aten::index_put", "aten::_copy_from", "aten::_copy_from_and_resize"};

bool op_accepts_cpu_tensors(const std::string& base_name) {
  return ops_accepting_cpu_tensors.count(base_name) != 0;
}

bool is_generator_type(const c10::TypePtr& type) {
  const c10::Type* t = type.get();
  if (t->kind() == c10::OptionalType::Kind) {
    t = t->castRaw<c10::OptionalType>()->getElementType().get();
  }
  return t->kind() == c10::GeneratorType::Kind;
}

const OpPlan& plan_for(const c10::FunctionSchema& schema) {
  thread_local std::unordered_map<const c10::FunctionSchema*, OpPlan> plans;
  auto it = plans.find(&schema);
  if (it != plans.end()) return it->second;
  OpPlan plan;
  plan.name = schema.name();
  plan.accepts_cpu_tensors = op_accepts_cpu_tensors(plan.name);
  if (!schema.overload_name().empty()) {
    plan.name += "." + schema.overload_name();
  }
  for (const auto& argument : schema.arguments()) {
    const auto* alias = argument.alias_info();
    plan.written.push_back(alias != nullptr && alias->isWrite());
    const bool generator = is_generator_type(argument.real_type());
    plan.is_generator.push_back(generator);
    plan.has_generator |= generator;
  }
  return plans.emplace(&schema, std::move(plan)).first->second;
}

c10::IValue arguments_to_cpu(c10::IValue value, bool written,
                             DelegationCall& delegation) {
  if (value.isTensor()) {
    return delegation.to_cpu(std::move(value).toTensor(), written);
  }
  // List elements are copied out and handed over (the list is replaced).
  if (value.isTensorList()) {
    auto list = value.toTensorList();
    c10::List<at::Tensor> out;
    out.reserve(list.size());
    for (size_t i = 0; i < list.size(); ++i) {
      // get() may return a reference into the list, which dies with it.
      out.push_back(delegation.to_cpu(at::Tensor(list.get(i)), written));
    }
    return out;
  }
  if (value.isOptionalTensorList()) {
    auto list = value.toOptionalTensorList();
    c10::List<std::optional<at::Tensor>> out;
    out.reserve(list.size());
    for (size_t i = 0; i < list.size(); ++i) {
      std::optional<at::Tensor> t = list.get(i);
      out.push_back(t.has_value() ? std::optional<at::Tensor>(delegation.to_cpu(
                                        std::move(*t), written))
                                  : std::nullopt);
    }
    return out;
  }
  if (value.isDevice()) {
    const c10::Device device = value.toDevice();
    if (device.type() == c10::DeviceType::PrivateUse1) {
      if (device.has_index()) delegation.note_device(device);
      return c10::Device(c10::DeviceType::CPU);
    }
  }
  return value;
}

c10::IValue result_from_cpu(c10::IValue value, DelegationCall& delegation) {
  if (value.isTensor()) return delegation.from_cpu(value.toTensor());
  if (value.isTensorList()) {
    auto list = value.toTensorList();
    c10::List<at::Tensor> out;
    out.reserve(list.size());
    for (const at::Tensor& t : list) out.push_back(delegation.from_cpu(t));
    return out;
  }
  return value;
}

// An argument as a graph replay keeps it: converted tensors as they are,
// host tensors refused or copied (capture::keep_for_replay).
c10::IValue replay_argument(const c10::IValue& original,
                            const c10::IValue& converted, const OpPlan& plan) {
  if (original.isTensor()) {
    return capture::keep_for_replay(original.toTensor(), converted.toTensor(),
                                    plan.name);
  }
  if (original.isTensorList() || original.isOptionalTensorList()) {
    const bool optional = original.isOptionalTensorList();
    const auto before = optional ? original.toOptionalTensorList().vec()
                                 : std::vector<std::optional<at::Tensor>>();
    if (!optional) {
      for (const at::Tensor& t : original.toTensorList()) {
        capture::keep_for_replay(t, t, plan.name);  // refuses host tensors
      }
    } else {
      for (const auto& t : before) {
        if (t.has_value()) capture::keep_for_replay(*t, *t, plan.name);
      }
    }
  }
  return converted;
}

}  // namespace

void cpu_delegation_fallback(const c10::OperatorHandle& op,
                             c10::DispatchKeySet /*keys*/,
                             torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const OpPlan& plan = plan_for(schema);
  const size_t num_arguments = schema.arguments().size();
  const size_t first = stack->size() - num_arguments;

  DelegationCall delegation(plan.name, plan.accepts_cpu_tensors);
  // While a graph may be captured, the arguments as the caller gave them
  // (host tensors among them are refused or copied for replay).
  torch::jit::Stack originals;
  if (capture::underway()) [[unlikely]] {
    originals.assign(stack->begin() + first, stack->end());
  }
  for (size_t i = 0; i < num_arguments; ++i) {
    c10::IValue& argument = (*stack)[first + i];
    argument =
        arguments_to_cpu(std::move(argument), plan.written[i], delegation);
  }
  if (plan.has_generator && !delegation.saw_ember() &&
      delegation.foreign_device().has_value()) {
    // Only the generator is ember (e.g. torch.randn(3, generator=ember_gen)):
    // report it the way CUDA does.
    TORCH_CHECK(false, "Expected a '", delegation.foreign_device()->type(),
                "' device type for generator but found 'ember' (in ", plan.name,
                ")");
  }
  delegation.settle();
  const c10::DeviceIndex device = delegation.device();
  if (plan.has_generator) {
    for (size_t i = 0; i < num_arguments; ++i) {
      if (!plan.is_generator[i]) continue;
      c10::IValue& argument = (*stack)[first + i];
      argument =
          engine_for(argument.isNone()
                         ? std::nullopt
                         : std::optional<at::Generator>(argument.toGenerator()),
                     device);
    }
  }

  // The converted arguments, kept for a replay (only while capturing).
  torch::jit::Stack replay_arguments;
  if (!originals.empty() && capture::graph_for(device) != nullptr) {
    for (size_t i = 0; i < num_arguments; ++i) {
      replay_arguments.push_back(
          replay_argument(originals[i], (*stack)[first + i], plan));
    }
  }
  run_on_device_recorded(
      device, plan.name,
      [&] {
        CpuAllocationCapture capture(device);
        op.redispatchBoxed(delegation.cpu_keys(), stack);
      },
      [&] {
        // The CPU results, before they become ember tensors: they share
        // the memory the replayed kernel's fresh results are copied into.
        return [op, keys = delegation.cpu_keys(),
                arguments = std::move(replay_arguments),
                captured = std::vector<c10::IValue>(stack->begin() + first,
                                                    stack->end())] {
          torch::jit::Stack replay = arguments;
          op.redispatchBoxed(keys, &replay);
          for (size_t i = 0; i < captured.size() && i < replay.size(); ++i) {
            capture::store_result(captured[i], replay[i]);
          }
        };
      });

  delegation.write_back();
  const size_t num_returns = stack->size() - first;
  for (size_t i = 0; i < num_returns; ++i) {
    c10::IValue& result = (*stack)[first + i];
    result = result_from_cpu(std::move(result), delegation);
  }
}

}  // namespace ember
