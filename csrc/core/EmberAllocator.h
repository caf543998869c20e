// The c10 allocator for ember device memory: a thin adapter over the
// runtime's per-device CachingAllocator (runtime/caching_allocator.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/CachingDeviceAllocator.h>

#include <cstdint>
#include <optional>

namespace ember {

class EmberDeviceAllocator final : public c10::DeviceAllocator {
 public:
  // Allocates on the current ember device.
  c10::DataPtr allocate(size_t nbytes) override;
  // Allocates on `device`; the DataPtr reports `tag_device_type` (PrivateUse1
  // normally, CPU when a delegated CPU kernel is allocating on our behalf).
  c10::DataPtr allocate_on(c10::DeviceIndex device, size_t nbytes,
                           c10::DeviceType tag_device_type);
  // Memory on `device` for a long-lived buffer that kernels stream whole
  // on every use (packed weights): 2 MiB pages, never shared with other
  // processes (runtime CachingAllocator::allocate_huge_pages).
  c10::DataPtr allocate_huge_pages_on(c10::DeviceIndex device, size_t nbytes);
  // Memory for a CPU kernel running on behalf of an ember op (see
  // CpuAllocationCapture): CPU-tagged, and shaped like plain CPU memory
  // (context == pointer) so raw_allocate/raw_deallocate users such as
  // oneDNN's scratch allocator work on it.
  c10::DataPtr allocate_for_cpu_kernel(c10::DeviceIndex device, size_t nbytes);
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t mempool_id = {0, 0}) override;
  // The block is not reused until `stream` has passed the point where it
  // is freed (runtime CachingAllocator::record_stream).
  void recordStream(const c10::DataPtr& data_ptr, c10::Stream stream) override;
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(
      c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override;
};

EmberDeviceAllocator* device_allocator();

// Tensor.record_stream for ember tensors (aten::record_stream).
void record_stream(const at::Tensor& tensor, c10::Stream stream);

// The ember device whose pool owns this DataPtr's memory (recognised by its
// deleter), or nullopt for memory from anywhere else.
std::optional<c10::DeviceIndex> pool_device_of(const c10::DataPtr& data_ptr);

// Frees memory from allocate_for_cpu_kernel given only its pointer; returns
// false (and does nothing) for a pointer that is not ember memory.
bool free_cpu_kernel_memory(void* data);

// A fresh private-pool number (MemPool and graph pools share the sequence:
// the id (0, n) names one pool whoever made it).
uint64_t new_pool_number();

// Memory limit of a device as a fraction of its capacity (CUDA's
// set_per_process_memory_fraction).
void set_memory_fraction(double fraction, c10::DeviceIndex device);

}  // namespace ember
