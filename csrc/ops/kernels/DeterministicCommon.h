// Shared by the deterministic-mode kernels (DeterministicOps.cpp,
// DeterministicNorms.cpp, DeterministicBoxed.cpp): aliases, and running a
// fixed-order body on the CPU aliases of ember tensors.
#pragma once

#include <ATen/WrapDimUtils.h>
#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>

#include <optional>

#include "ops/UnboxedDelegation.h"
#include "ops/kernels/DeterministicReduce.h"

namespace ember::kernels::deterministic::detail {

namespace fixed = ember::deterministic;
using OptDims = at::OptionalIntArrayRef;
using OptDtype = std::optional<at::ScalarType>;
using OptScalar = const std::optional<at::Scalar>&;

// unboxed::custom (the CPU aliases, device checks, allocation capture and
// adoption every delegated op gets) with a profiler marker naming the
// deterministic kernel.
template <class Body, class... Tensors>
auto on_aliases(const char* name, Body&& body, const Tensors&... tensors) {
  using Result = decltype(body(
      unboxed::to_cpu(std::declval<DelegationCall&>(), tensors, false)...));
  return unboxed::custom<Result>(
      name,
      [&](const auto&... cpu) {
        RECORD_FUNCTION(name, c10::ArrayRef<const c10::IValue>{});
        return body(cpu...);
      },
      tensors...);
}

// Floating and complex reductions round; integer ones do not, so ATen's
// order is as good as any.
inline bool rounds(at::ScalarType dtype) {
  return at::isFloatingType(dtype) || at::isComplexType(dtype);
}

inline c10::SmallVector<int64_t, 8> dims_of(const at::Tensor& x, OptDims dim) {
  return fixed::wrap_dims(x, dim);
}

}  // namespace ember::kernels::deterministic::detail
