// The bookkeeping of one delegated op call, shared by the boxed fallback
// (ops/CpuDelegation.cpp) and the unboxed hot-op path
// (ops/UnboxedDelegation.h): which ember tensors were swapped for which CPU
// aliases, which device the op runs on, the device checks, and turning CPU
// results back into ember tensors.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <optional>
#include <string_view>

#include "observe/ExecutionPath.h"
#include "ops/CpuAlias.h"

namespace ember {

class DelegationCall final {
 public:
  DelegationCall(std::string_view op_name, bool accepts_cpu_tensors)
      : op_name_(op_name),
        accepts_cpu_tensors_(accepts_cpu_tensors),
        // Op names come from static strings or registered schemas (stable
        // and null-terminated): safe to keep for EMBER_DEBUG_HEAP reports.
        current_op_(op_name.data()),
        scope_(-1) {
    observe::mark_path(observe::ExecutionPath::kDelegated);
  }

  // An argument on its way to the CPU kernel: ember tensors become aliases,
  // CPU tensors pass if CUDA would accept them here. The argument must
  // outlive the call (it is referenced, not copied: copying a tensor that
  // Python owns takes the GIL in torch 2.13).
  at::Tensor to_cpu(const at::Tensor& tensor, bool written);
  // Same, taking ownership (the boxed path, whose stack slot is reused).
  at::Tensor to_cpu(at::Tensor&& tensor, bool written);

  // Records an ember device named by a Device argument (validated).
  void note_device(c10::Device device);

  // After all arguments: fixes the op's device (the current device when
  // nothing named one) and raises for a CPU tensor CUDA would reject.
  void settle();
  c10::DeviceIndex device() const { return device_; }
  // True once an ember tensor or an ember Device argument was seen.
  bool saw_ember() const { return device_ >= 0; }
  // The first argument on a device CUDA would reject beside ember tensors.
  const std::optional<c10::Device>& foreign_device() const { return foreign_; }

  // A CPU kernel result, as the ember tensor it stands for.
  at::Tensor from_cpu(const at::Tensor& result);

  // Makes the ember arguments reflect what the kernel did to their aliases
  // (storage reallocated by a resize, new sizes/strides, set_).
  void write_back();

  std::string_view op_name() const { return op_name_; }

  // The CPU dispatch keys the kernel runs under: CPU, plus the sparse
  // keys when a sparse argument was swapped in (ops/SparseBridge.h).
  c10::DispatchKeySet cpu_keys() const { return cpu_keys_; }

 private:
  struct Swap {
    at::Tensor alias;
    const at::Tensor* borrowed;  // the caller's argument, or null
    at::Tensor owned;            // set when the argument was handed over
    bool written;
    const at::Tensor& original() const { return borrowed ? *borrowed : owned; }
  };
  at::Tensor alias_for(const at::Tensor& tensor);
  at::Tensor swap_in(const at::Tensor& tensor, const at::Tensor* borrowed,
                     at::Tensor&& owned, bool written);
  [[noreturn]] void throw_device_mismatch(c10::Device a, c10::Device b) const;

  std::string_view op_name_;
  bool accepts_cpu_tensors_;
  observe::CurrentOpScope current_op_;
  c10::DeviceIndex device_ = -1;
  std::optional<c10::Device> foreign_;
  AliasScope scope_;
  c10::SmallVector<Swap, 4> swapped_;
  c10::DispatchKeySet cpu_keys_{c10::DispatchKey::CPU};
};

}  // namespace ember
