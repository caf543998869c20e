// Zero-copy bridging between ember tensors and CPU kernels.
//
// ember memory is host memory, so a CPU kernel can run directly on it. A
// "CPU alias" is a CPU tensor that shares the ember tensor's StorageImpl:
// same bytes, same sizes/strides/offset. Because the StorageImpl is shared
// (not just the pointer), a CPU kernel that resizes an out= argument grows
// the ember storage itself, through the storage's own (ember) allocator.
#pragma once

#include <ATen/core/Tensor.h>

#include <string_view>

namespace ember {

// The CPU view of an ember tensor's bytes. Undefined stays undefined.
at::Tensor cpu_alias(const at::Tensor& ember_tensor);

// An ember tensor over `storage` (which must be an ember storage) with the
// metadata (dtype, sizes, strides, offset, conj/neg bits) of `like`.
at::Tensor ember_tensor_over(c10::Storage storage, const at::Tensor& like,
                             bool is_view);

// Turns a CPU kernel's result into an ember tensor on `device`:
//  - a view of an ember storage becomes an ember view of that storage;
//  - memory the kernel allocated from an ember pool (see
//    CpuAllocationCapture) is adopted in place;
//  - anything else is copied, counted under `op` (refused in strict mode).
at::Tensor adopt_cpu_result(const at::Tensor& cpu_result,
                            c10::DeviceIndex device, std::string_view op);

// Makes `storage` (a CPU storage) an ember storage without moving its bytes,
// if its memory came from an ember pool (or it holds no memory, in which
// case it lands on `device_if_empty`). Returns false otherwise.
bool adopt_storage(c10::StorageImpl* storage, c10::DeviceIndex device_if_empty);

}  // namespace ember
