#include "core/EmberAllocator.h"

#include <c10/util/Exception.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "core/RuntimeErrors.h"
#include "ember/runtime/device.h"
#include "flags/BackendFlags.h"
#include "flags/Environment.h"
#include "observe/ExecutionPath.h"
#include "observe/MemoryEvents.h"
#include "observe/OpLog.h"

namespace ember {
namespace {

namespace rt = ember::runtime;

// A DataPtr deleter is a plain function pointer, so each device gets its own
// deleter; the deleter then also tells which pool a pointer came from.
template <int Index>
void free_on_device(void* block) {
  if (flags::verbose_level() >= 2) observe::log_free(Index, block);
  if (observe::memory_observed()) {
    const auto [ptr, size] =
        rt::CachingAllocator::span(static_cast<const rt::Block*>(block));
    observe::on_free(Index, ptr, size);
  }
  rt::device(Index).allocator().free(static_cast<rt::Block*>(block));
}

template <std::size_t... I>
constexpr auto make_deleters(std::index_sequence<I...>) {
  return std::array<c10::DeleterFnPtr, sizeof...(I)>{
      &free_on_device<static_cast<int>(I)>...};
}

constexpr auto kDeleters =
    make_deleters(std::make_index_sequence<rt::kMaxDevices>());

// allocate_for_cpu_kernel puts this in front of the bytes it hands out, so
// the block can be found from the pointer alone.
struct alignas(64) CpuKernelHeader {
  static constexpr uint64_t kMagic = 0x656d6265722d6870;  // "ember-hp"
  uint64_t magic;
  int64_t device;
  rt::Block* block;
  uint64_t nbytes;
  const char* op;  // the delegated op that allocated it (heap checks)
};

// EMBER_DEBUG_HEAP=1: kCanaryBytes canary bytes after every CPU-kernel
// allocation, checked (with the header) when it is freed; a mismatch names the
// op.
constexpr size_t kCanaryBytes = 256;
constexpr unsigned char kCanary = 0xEB;
const bool kHeapChecks =
    flags::env_switch("EMBER_DEBUG_HEAP", "heap checks").value_or(false);

void check_heap_block(const CpuKernelHeader* header, const void* data) {
  if (header->magic != CpuKernelHeader::kMagic) {
    std::fprintf(stderr, "[ember] heap check: corrupt header before %p\n",
                 data);
    return;
  }
  const auto* canary = static_cast<const unsigned char*>(data) + header->nbytes;
  size_t reach = 0;  // how far past the end the furthest write went
  for (size_t i = 0; i < kCanaryBytes; ++i) {
    if (canary[i] != kCanary) reach = i + 1;
  }
  if (reach > 0) {
    std::fprintf(stderr,
                 "[ember] heap check: %zu-byte block from %s written up to "
                 "%zu bytes past its end\n",
                 static_cast<size_t>(header->nbytes),
                 header->op != nullptr ? header->op : "?", reach);
  }
}
static_assert(sizeof(CpuKernelHeader) == rt::kAlignment);

CpuKernelHeader* header_of(void* data) {
  return reinterpret_cast<CpuKernelHeader*>(static_cast<char*>(data) -
                                            sizeof(CpuKernelHeader));
}

void free_cpu_kernel_block(void* data) {
  CpuKernelHeader* header = header_of(data);
  if (kHeapChecks) check_heap_block(header, data);
  header->magic = 0;
  if (flags::verbose_level() >= 2) {
    observe::log_free(static_cast<int>(header->device), data);
  }
  if (observe::memory_observed()) {
    observe::on_free(static_cast<int>(header->device), data,
                     rt::CachingAllocator::span(header->block).second);
  }
  rt::device(static_cast<int>(header->device)).allocator().free(header->block);
}

void copy_stat(const rt::Stat& from, c10::CachingAllocator::StatArray& to) {
  auto& aggregate =
      to[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
  aggregate.current = from.current;
  aggregate.peak = from.peak;
  aggregate.allocated = from.allocated;
  aggregate.freed = from.freed;
}

// A block from `device`'s pool. When the pool is exhausted while launched
// work still holds memory (results and operands of queued ops, released as
// the work completes), the submitting thread waits for the device's queues
// and, if that released memory, tries once more before reporting
// out-of-memory. `huge_pages`: from the allocator's huge-page segments
// (CachingAllocator::allocate_huge_pages).
rt::Allocation allocate_block(c10::DeviceIndex device, size_t bytes,
                              bool huge_pages = false) {
  return translate_runtime_errors([&] {
    rt::CachingAllocator& allocator = rt::device(device).allocator();
    const auto attempt = [&] {
      return huge_pages ? allocator.allocate_huge_pages(bytes)
                        : allocator.allocate(bytes);
    };
    try {
      return attempt();
    } catch (const rt::OutOfMemory&) {
      if (rt::in_stream_worker()) throw;
      const int64_t held = allocator.stats().allocated_bytes.current;
      rt::device(device).synchronize();  // also releases finished work
      if (allocator.stats().allocated_bytes.current == held) throw;
      return attempt();
    }
  });
}

// The DataPtr of `allocation`, a block of `device` (an empty one for none).
c10::DataPtr device_data(c10::DeviceIndex device, rt::Allocation allocation,
                         size_t nbytes, c10::DeviceType tag) {
  const c10::Device tag_device = tag == c10::DeviceType::CPU
                                     ? c10::Device(c10::DeviceType::CPU)
                                     : c10::Device(tag, device);
  if (allocation.block == nullptr) {
    return c10::DataPtr(nullptr, tag_device);
  }
  if (flags::verbose_level() >= 2) {
    observe::log_allocation(device, nbytes, allocation.ptr);
  }
  if (observe::memory_observed()) {
    observe::on_allocate(device, allocation.ptr,
                         rt::CachingAllocator::span(allocation.block).second);
  }
  return c10::DataPtr(allocation.ptr, allocation.block, kDeleters[device],
                      tag_device);
}

}  // namespace

c10::DataPtr EmberDeviceAllocator::allocate(size_t nbytes) {
  return allocate_on(static_cast<c10::DeviceIndex>(rt::current_device()),
                     nbytes, c10::DeviceType::PrivateUse1);
}

c10::DataPtr EmberDeviceAllocator::allocate_on(c10::DeviceIndex device,
                                               size_t nbytes,
                                               c10::DeviceType tag) {
  return device_data(device, allocate_block(device, nbytes), nbytes, tag);
}

c10::DataPtr EmberDeviceAllocator::allocate_huge_pages_on(
    c10::DeviceIndex device, size_t nbytes) {
  return device_data(device, allocate_block(device, nbytes, true), nbytes,
                     c10::DeviceType::PrivateUse1);
}

c10::DataPtr EmberDeviceAllocator::allocate_for_cpu_kernel(
    c10::DeviceIndex device, size_t nbytes) {
  const c10::Device cpu(c10::DeviceType::CPU);
  if (nbytes == 0) return c10::DataPtr(nullptr, cpu);
  rt::Allocation allocation =
      allocate_block(device, nbytes + sizeof(CpuKernelHeader) +
                                 (kHeapChecks ? kCanaryBytes : 0));
  auto* header = new (allocation.ptr)
      CpuKernelHeader{CpuKernelHeader::kMagic, device, allocation.block, nbytes,
                      observe::t_current_op};
  void* data = header + 1;
  if (kHeapChecks) {
    std::memset(static_cast<char*>(data) + nbytes, kCanary, kCanaryBytes);
  }
  if (flags::verbose_level() >= 2)
    observe::log_allocation(device, nbytes, data);
  if (observe::memory_observed()) {
    observe::on_allocate(device, data,
                         rt::CachingAllocator::span(allocation.block).second);
  }
  return c10::DataPtr(data, data, &free_cpu_kernel_block, cpu);
}

bool free_cpu_kernel_memory(void* data) {
  if (data == nullptr) return false;
  for (int i = 0; i < rt::device_count(); ++i) {
    if (rt::device(i).allocator().owns(data)) {
      free_cpu_kernel_block(data);
      return true;
    }
  }
  return false;
}

uint64_t new_pool_number() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}

void EmberDeviceAllocator::copy_data(void* dest, const void* src,
                                     std::size_t count) const {
  std::memcpy(dest, src, count);
}

void EmberDeviceAllocator::emptyCache(c10::MempoolId_t mempool_id) {
  // {0, 0}: every device's default cache and the pools nobody holds; a
  // MemPool's id (0, n): that pool's free segments (its destructor).
  for (int i = 0; i < rt::device_count(); ++i) {
    // Finished launched work may still hold the last reference to blocks.
    rt::device(i).streams().collect_finished();
    if (mempool_id == c10::MempoolId_t{0, 0}) {
      rt::device(i).allocator().empty_cache();
    } else {
      rt::device(i).allocator().empty_cache(mempool_id.second);
    }
  }
}

c10::CachingDeviceAllocator::DeviceStats EmberDeviceAllocator::getDeviceStats(
    c10::DeviceIndex device) {
  const rt::MemoryStats s = translate_runtime_errors([&] {
    // Read as after synchronous execution: memory that work launched on the
    // current stream still holds (operands freed by the caller) is released
    // first. (Other streams keep CUDA's semantics: record_stream.)
    rt::device(device).streams().current().wait_quietly();
    return rt::device(device).allocator().stats();
  });
  c10::CachingDeviceAllocator::DeviceStats out;
  copy_stat(s.allocation, out.allocation);
  copy_stat(s.segment, out.segment);
  copy_stat(s.active, out.active);
  copy_stat(s.inactive_split, out.inactive_split);
  copy_stat(s.allocated_bytes, out.allocated_bytes);
  copy_stat(s.reserved_bytes, out.reserved_bytes);
  copy_stat(s.active_bytes, out.active_bytes);
  copy_stat(s.inactive_split_bytes, out.inactive_split_bytes);
  copy_stat(s.requested_bytes, out.requested_bytes);
  out.num_alloc_retries = s.num_alloc_retries;
  out.num_ooms = s.num_ooms;
  out.num_device_alloc = s.num_device_alloc;
  out.num_device_free = s.num_device_free;
  return out;
}

void EmberDeviceAllocator::resetAccumulatedStats(c10::DeviceIndex device) {
  translate_runtime_errors(
      [&] { rt::device(device).allocator().reset_accumulated_stats(); });
}

void EmberDeviceAllocator::resetPeakStats(c10::DeviceIndex device) {
  translate_runtime_errors(
      [&] { rt::device(device).allocator().reset_peak_stats(); });
}

std::pair<size_t, size_t> EmberDeviceAllocator::getMemoryInfo(
    c10::DeviceIndex device) {
  return translate_runtime_errors([&] {
    auto& allocator = rt::device(device).allocator();
    const size_t limit = allocator.memory_limit();
    const auto reserved =
        static_cast<size_t>(allocator.stats().reserved_bytes.current);
    return std::make_pair(limit > reserved ? limit - reserved : 0, limit);
  });
}

void EmberDeviceAllocator::recordStream(const c10::DataPtr& data_ptr,
                                        c10::Stream stream) {
  if (!data_ptr) return;
  const std::optional<c10::DeviceIndex> device = pool_device_of(data_ptr);
  if (!device) return;  // not from an ember pool: nothing is reused
  TORCH_CHECK(stream.device_type() == c10::DeviceType::PrivateUse1,
              "record_stream: expected an ember stream, got one of ",
              stream.device());
  rt::Block* block = data_ptr.get_deleter() == &free_cpu_kernel_block
                         ? header_of(data_ptr.get())->block
                         : static_cast<rt::Block*>(data_ptr.get_context());
  translate_runtime_errors([&] {
    rt::Stream* target = nullptr;
    try {
      target = &rt::device(stream.device_index()).streams().get(stream.id());
    } catch (const std::out_of_range&) {
      TORCH_CHECK(false, "unknown ember stream id ", stream.id(), " on ",
                  stream.device());
    }
    rt::device(*device).allocator().record_stream(block, *target);
  });
}

void record_stream(const at::Tensor& tensor, c10::Stream stream) {
  device_allocator()->recordStream(tensor.storage().data_ptr(), stream);
}

EmberDeviceAllocator* device_allocator() {
  static EmberDeviceAllocator allocator;
  return &allocator;
}

std::optional<c10::DeviceIndex> pool_device_of(const c10::DataPtr& data_ptr) {
  const c10::DeleterFnPtr deleter = data_ptr.get_deleter();
  if (deleter == &free_cpu_kernel_block) {
    return static_cast<c10::DeviceIndex>(header_of(data_ptr.get())->device);
  }
  for (size_t i = 0; i < kDeleters.size(); ++i) {
    if (kDeleters[i] == deleter) return static_cast<c10::DeviceIndex>(i);
  }
  return std::nullopt;
}

void set_memory_fraction(double fraction, c10::DeviceIndex device) {
  TORCH_CHECK_VALUE(fraction > 0.0 && fraction <= 1.0,
                    "Invalid fraction value: ", fraction,
                    ". Allowed range: 0 < fraction <= 1");
  translate_runtime_errors([&] {
    auto& allocator = rt::device(device).allocator();
    allocator.set_memory_limit(static_cast<size_t>(
        fraction * static_cast<double>(allocator.capacity())));
  });
}

// Registered at load time: c10::GetAllocator(PrivateUse1) is how ATen's
// generic empty() reaches us.
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, device_allocator())

}  // namespace ember
