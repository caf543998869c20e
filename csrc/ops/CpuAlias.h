// Zero-copy bridging between ember tensors and CPU kernels.
//
// ember memory is host memory, so a CPU kernel can run directly on it. A
// "CPU alias" is an ordinary CPU tensor over the ember tensor's bytes: its
// own CPU StorageImpl whose DataPtr points into the ember storage and keeps
// it alive. Everything a CPU kernel derives from an alias (views, options)
// is then plainly CPU.
//
// The alias storage is resizable and allocates through the CPU allocator,
// which CpuAllocationCapture routes to the ember pool while an op runs. So a
// CPU kernel that grows an out= argument allocates ember memory, and
// AliasScope::sync_back() moves that memory into the ember storage.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <optional>
#include <string_view>

namespace ember {

// The aliases made for one op call. Several tensors over one ember storage
// share one alias storage, so CPU kernels see them as aliasing each other.
class AliasScope final {
 public:
  explicit AliasScope(c10::DeviceIndex device) : device_(device) {}

  // The CPU alias of an ember tensor. Undefined stays undefined.
  at::Tensor alias(const at::Tensor& ember_tensor);

  // The ember storage behind `cpu_storage` if it is one of our aliases.
  const c10::Storage* ember_storage_of(const c10::Storage& cpu_storage) const;

  // Moves memory that a CPU kernel reallocated for an alias storage (resize
  // of an out= argument) into the ember storage it stands for.
  void sync_back(std::string_view op);

  void set_device(c10::DeviceIndex device) { device_ = device; }
  c10::DeviceIndex device() const { return device_; }

 private:
  struct Entry {
    c10::Storage ember;
    c10::Storage alias;
  };
  c10::DeviceIndex device_;
  c10::SmallVector<Entry, 4> storages_;
};

// Alias of a single tensor, for kernels that need no scope.
at::Tensor cpu_alias(const at::Tensor& ember_tensor);

// An ember tensor over `storage` (an ember storage) with the dtype, sizes,
// strides, offset and conj/neg bits of `like`.
at::Tensor ember_tensor_over(c10::Storage storage, const at::Tensor& like);

// Makes a CPU storage an ember storage without moving its bytes, if its
// memory came from an ember pool (or it holds none, in which case it lands
// on `device_if_empty`). Returns false otherwise.
bool adopt_storage(c10::StorageImpl* storage, c10::DeviceIndex device_if_empty);

// Turns a CPU kernel's result into an ember tensor on scope.device():
//  - a view of an alias becomes an ember view of the aliased storage;
//  - memory the kernel allocated from an ember pool is adopted in place;
//  - anything else is copied, counted under `op` (refused in strict mode).
at::Tensor adopt_cpu_result(const at::Tensor& cpu_result,
                            const AliasScope& scope, std::string_view op);

}  // namespace ember
