// The CPU delegation of ops/CpuDelegation.cpp without boxing, for hot ops:
// arguments stay typed C++ values, and the CPU kernel is reached through
// the op's typed redispatch. Same semantics as the boxed fallback (same
// DelegationCall), a few hundred nanoseconds cheaper per call.
//
// Use: m.impl("add.Tensor", TORCH_FN((delegate<at::_ops::add_Tensor,
//                                     ARGS...>))) — see ops/kernels/HotOps.cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/CpuAllocationCapture.h"
#include "ops/CpuDelegation.h"
#include "ops/DelegationCall.h"
#include "ops/DeviceScope.h"

namespace ember::unboxed {

template <class Op>
const std::string& op_name() {
  static const std::string name =
      std::string(Op::name) + (std::string(Op::overload_name).empty()
                                   ? ""
                                   : "." + std::string(Op::overload_name));
  return name;
}

// An argument kept by queued work: tensors as CPU aliases (or copied host
// scalars), array and string views as owning copies.
template <class T>
struct Kept {
  using type = std::decay_t<T>;
};
template <>
struct Kept<c10::string_view> {
  using type = std::string;
};
template <>
struct Kept<c10::IntArrayRef> {
  using type = std::vector<int64_t>;
};
template <>
struct Kept<c10::SymIntArrayRef> {
  using type = std::vector<c10::SymInt>;
};
template <>
struct Kept<at::OptionalIntArrayRef> {
  using type = std::optional<std::vector<int64_t>>;
};
template <class T>
using kept_t = typename Kept<T>::type;

// What the kernel gets back from a kept argument.
template <class T>
const T& use(const T& value) {
  return value;
}
inline c10::string_view use(const std::string& value) { return value; }
inline c10::IntArrayRef use(const std::vector<int64_t>& value) { return value; }
inline c10::SymIntArrayRef use(const std::vector<c10::SymInt>& value) {
  return value;
}
inline at::OptionalIntArrayRef use(
    const std::optional<std::vector<int64_t>>& value) {
  if (!value) return std::nullopt;
  return c10::IntArrayRef(*value);
}

// A kept copy of a non-tensor argument.
template <class T>
kept_t<T> own(const T& value) {
  if constexpr (std::is_same_v<kept_t<T>, std::decay_t<T>>) {
    return value;
  } else if constexpr (std::is_same_v<T, at::OptionalIntArrayRef>) {
    if (!value.has_value()) return std::nullopt;
    return value->vec();
  } else {
    return kept_t<T>(value.begin(), value.end());
  }
}

// An argument as a graph replay keeps it (GraphCapture.h): from the
// caller's original and its converted form.
inline at::Tensor replay_arg(const at::Tensor& original,
                             const at::Tensor& converted, std::string_view op) {
  return capture::keep_for_replay(original, converted, op);
}
inline std::optional<at::Tensor> replay_arg(
    const std::optional<at::Tensor>& original,
    const std::optional<at::Tensor>& converted, std::string_view op) {
  if (!original.has_value()) return std::nullopt;
  return capture::keep_for_replay(*original, *converted, op);
}
template <class T, class C>
kept_t<T> replay_arg(const T& original, const C&, std::string_view) {
  return own(original);
}

// Every argument of a call, kept for replay.
template <class... Args, class Converted>
std::tuple<kept_t<Args>...> replay_args(std::string_view op,
                                        const Converted& converted,
                                        const Args&... args) {
  return [&]<size_t... I>(std::index_sequence<I...>) {
    return std::tuple<kept_t<Args>...>{
        replay_arg(args, std::get<I>(converted), op)...};
  }
  (std::index_sequence_for<Args...>{});
}

// A replayed kernel's results into the ones capture returned.
inline void store_results(const at::Tensor& captured, const at::Tensor& fresh) {
  capture::store_result(captured, fresh);
}
template <class T>
void store_results(const T&, const T&) {}
template <class... Ts>
void store_results(const std::tuple<Ts...>& captured,
                   const std::tuple<Ts...>& fresh) {
  [&]<size_t... I>(std::index_sequence<I...>) {
    (store_results(std::get<I>(captured), std::get<I>(fresh)), ...);
  }
  (std::index_sequence_for<Ts...>{});
}

// A kernel for custom()/custom_out() that owns what it uses (captures by
// value), so a graph may run it again: only these are recorded; a custom op
// with any other kernel refuses to be captured.
template <class K>
struct Replayable {
  K kernel;
  template <class... A>
  decltype(auto) operator()(A&&... a) const {
    return kernel(std::forward<A>(a)...);
  }
};
template <class K>
Replayable<std::decay_t<K>> replayable(K&& kernel) {
  return {std::forward<K>(kernel)};
}
template <class K>
inline constexpr bool is_replayable = false;
template <class K>
inline constexpr bool is_replayable<Replayable<K>> = true;

// Argument conversion: tensors become aliases, everything else passes.
inline at::Tensor to_cpu(DelegationCall& call, const at::Tensor& t,
                         bool written) {
  return call.to_cpu(t, written);
}
inline std::optional<at::Tensor> to_cpu(DelegationCall& call,
                                        const std::optional<at::Tensor>& t,
                                        bool written) {
  if (!t.has_value()) return std::nullopt;
  return call.to_cpu(*t, written);
}
template <class T>
const T& to_cpu(DelegationCall&, const T& value, bool) {
  return value;
}

inline at::Tensor from_cpu(DelegationCall& call, const at::Tensor& t) {
  return call.from_cpu(t);
}
template <class... Ts>
std::tuple<Ts...> from_cpu(DelegationCall& call, const std::tuple<Ts...>& t) {
  return std::apply(
      [&](const auto&... items) {
        return std::tuple<Ts...>(from_cpu(call, items)...);
      },
      t);
}

constexpr c10::DispatchKeySet kCpuKeys{c10::DispatchKey::CPU};

// An op returning new tensors (or a tuple of them).
// Args are the exact parameter types of the op's C++ signature.
template <class Op, class... Args>
auto functional(Args... args) -> typename c10::guts::infer_function_traits_t<
    decltype(Op::call)>::return_type {
  using Return = typename c10::guts::infer_function_traits_t<
      decltype(Op::call)>::return_type;
  DelegationCall call(op_name<Op>(), /*accepts_cpu_tensors=*/false);
  // Braced initialisation evaluates left to right: argument order is kept.
  std::tuple<std::decay_t<decltype(to_cpu(call, args, false))>...> cpu_args{
      to_cpu(call, args, false)...};
  call.settle();
  const c10::DeviceIndex device = call.device();
  Return result;
  run_on_device_recorded(
      device, op_name<Op>(),
      [&] {
        CpuAllocationCapture capture(device);
        result = std::apply(
            [&](auto&... a) { return Op::redispatch(kCpuKeys, a...); },
            cpu_args);
      },
      [&] {
        return [kept = replay_args(op_name<Op>(), cpu_args, args...),
                captured = result] {
          const Return fresh = std::apply(
              [](const auto&... a) {
                return Op::redispatch(kCpuKeys, use(a)...);
              },
              kept);
          store_results(captured, fresh);
        };
      });
  return from_cpu(call, result);
}

// An op that writes into its first argument and returns it.
template <class Op, class... Args>
at::Tensor& inplace(at::Tensor& self, Args... args) {
  DelegationCall call(op_name<Op>(), /*accepts_cpu_tensors=*/false);
  at::Tensor self_cpu = call.to_cpu(self, /*written=*/true);
  std::tuple<std::decay_t<decltype(to_cpu(call, args, false))>...> cpu_args{
      to_cpu(call, args, false)...};
  call.settle();
  const c10::DeviceIndex device = call.device();
  run_on_device_recorded(
      device, op_name<Op>(),
      [&] {
        CpuAllocationCapture capture(device);
        std::apply(
            [&](auto&... a) { Op::redispatch(kCpuKeys, self_cpu, a...); },
            cpu_args);
      },
      [&] {
        return [kept = replay_args(op_name<Op>(), cpu_args, args...),
                self_cpu]() mutable {
          std::apply(
              [&](const auto&... a) {
                Op::redispatch(kCpuKeys, self_cpu, use(a)...);
              },
              kept);
        };
      });
  call.write_back();
  return self;
}

// An op ember computes with its own code on the CPU aliases: `kernel` gets
// the converted arguments and returns CPU tensors allocated inside the call
// (they are captured from the ember pool and handed back as ember tensors).
template <class Return, class Kernel, class... Args>
Return custom(std::string_view name, Kernel&& kernel, const Args&... args) {
  DelegationCall call(name, /*accepts_cpu_tensors=*/false);
  std::tuple<std::decay_t<decltype(to_cpu(call, args, false))>...> cpu_args{
      to_cpu(call, args, false)...};
  call.settle();
  Return result;
  const c10::DeviceIndex device = call.device();
  auto work = [&] {
    CpuAllocationCapture capture(device);
    result = std::apply(kernel, cpu_args);
  };
  if constexpr (is_replayable<std::decay_t<Kernel>>) {
    run_on_device_recorded(device, name, work, [&] {
      return [kernel = kernel, kept = replay_args(name, cpu_args, args...),
              captured = result] {
        const Return fresh = std::apply(
            [&](const auto&... a) { return kernel(use(a)...); }, kept);
        store_results(captured, fresh);
      };
    });
  } else {
    run_on_device(device, work);
  }
  return from_cpu(call, result);
}

// Same for an out= op: `kernel(out_alias, args...)` writes the result.
template <class Kernel, class... Args>
at::Tensor& custom_out(std::string_view name, Kernel&& kernel, at::Tensor& out,
                       const Args&... args) {
  DelegationCall call(name, /*accepts_cpu_tensors=*/false);
  std::tuple<std::decay_t<decltype(to_cpu(call, args, false))>...> cpu_args{
      to_cpu(call, args, false)...};
  at::Tensor out_cpu = call.to_cpu(out, /*written=*/true);
  call.settle();
  const c10::DeviceIndex device = call.device();
  auto work = [&] {
    CpuAllocationCapture capture(device);
    std::apply([&](const auto&... a) { kernel(out_cpu, a...); }, cpu_args);
  };
  if constexpr (is_replayable<std::decay_t<Kernel>>) {
    run_on_device_recorded(device, name, work, [&] {
      return [kernel = kernel, kept = replay_args(name, cpu_args, args...),
              out_cpu]() mutable {
        std::apply([&](const auto&... a) { kernel(out_cpu, use(a)...); }, kept);
      };
    });
  } else {
    run_on_device(device, work);
  }
  call.write_back();
  return out;
}

// The boxed CPU delegation, called from a typed kernel (for ops whose
// default path is the generic one, e.g. out= variants): returns the stack.
template <class... Args>
torch::jit::Stack boxed(const c10::OperatorHandle& op, const Args&... args) {
  torch::jit::Stack stack;
  stack.reserve(sizeof...(Args));
  (stack.emplace_back(args), ...);
  cpu_delegation_fallback(
      op, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), &stack);
  return stack;
}

}  // namespace ember::unboxed
