// Caching allocator: see caching_allocator.h for the contract.
//
// Layout, following CUDA's caching allocator:
//   * Every request is rounded up to a multiple of kMinBlockSize (512 B).
//   * Small pool: rounded requests <= 1 MiB are carved from 2 MiB segments.
//   * Large pool: requests of 1-10 MiB are carved from 20 MiB segments,
//     larger ones get a segment of their size rounded up to 2 MiB. When the
//     preferred segment would break the memory limit, the smallest segment
//     that can hold the request is tried before giving up.
//   * Free blocks live in per-pool bins by log2 size class; each bin is
//     ordered by (size, address), so a lower_bound in the request's bin and
//     the first block of any higher bin is the best fit.
//   * Segments are memory files mapped MAP_SHARED, so other processes can
//     map their blocks (segment_memory.h; anonymous private memory where no
//     file can be had), unmapped by empty_cache(). Pages are placed by the
//     kernel's first-touch policy unless the allocator is bound to a NUMA
//     node (bind_to_numa_node: mbind before the first touch).
//   * Private pools (MemPool) have their own bins and segments; a thread's
//     route (caching_allocator_pools.cpp) picks the bins a request uses.
//   * allocate_huge_pages() requests use a pool of their own too, whose
//     segments are 2 MiB pages of private memory (map_huge_page_memory).
//
// The allocate + free pair of a small block is on every op's critical path,
// so it touches the heap nowhere (block_pool.cpp):
//   * Block records come from slabs owned by the allocator and are recycled
//     through a free list, never deleted before the allocator dies. That
//     also validates free(): a Block* must lie in a slab and be allocated.
//   * Each bin is an intrusive treap threaded through the free Blocks; a
//     bitmap of non-empty bins finds the next bin in O(1).
//   * Splitting shrinks the free block in place and gives the front part a
//     recycled record; coalescing grows a free neighbour in place. The
//     block's key only moves past no other key in the common case, so it
//     keeps its place in the tree.
//   * Size rounding and bin lookup happen before the lock; the memory limit
//     is only read when a segment must be mapped.
#include "ember/runtime/caching_allocator.h"

#include <cstdio>
#include <string>

#include "caching_allocator_state.h"
#include "ember/runtime/cpu_features.h"

namespace ember::runtime {

namespace {

std::string format_size(std::size_t bytes) {
  if (bytes < 1024) return std::to_string(bytes) + " bytes";
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes) / 1024.0;
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.2f %s", value, kUnits[unit]);
  return buffer;
}

std::string out_of_memory_message(int device, std::size_t requested,
                                  std::size_t allocated, std::size_t reserved,
                                  std::size_t limit) {
  return "ember:" + std::to_string(device) +
         " out of memory: tried to allocate " + format_size(requested) + "; " +
         format_size(allocated) + " allocated, " + format_size(reserved) +
         " reserved, limit " + format_size(limit);
}

}  // namespace

void Stat::increase(int64_t amount) { add(*this, amount); }

void Stat::decrease(int64_t amount) { subtract(*this, amount); }

OutOfMemory::OutOfMemory(int device, std::size_t requested,
                         std::size_t allocated, std::size_t reserved,
                         std::size_t limit)
    : std::runtime_error(
          out_of_memory_message(device, requested, allocated, reserved, limit)),
      device(device),
      requested(requested),
      allocated(allocated),
      reserved(reserved),
      limit(limit) {}

std::size_t round_allocation_size(std::size_t nbytes) {
  return round_size(nbytes);
}

CachingAllocator::CachingAllocator(int device_index, std::size_t limit_bytes)
    : device_index_(device_index),
      capacity_(physical_memory_bytes()),
      state_(std::make_unique<State>()) {
  state_->limit_setting = limit_bytes;
}

CachingAllocator::~CachingAllocator() = default;

void CachingAllocator::bind_to_numa_node(int node) {
  std::lock_guard<std::mutex> lock(mutex_);
  state_->numa_node = node;
}

int CachingAllocator::numa_node() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return state_->numa_node;
}

// allocate() and allocate_huge_pages(): inlined into each, so the hot path
// (allocate of a small block) pays no call and no test of the placement.
[[gnu::always_inline]] inline Allocation CachingAllocator::allocate_from(
    std::size_t nbytes, bool huge_pages) {
  if (nbytes == 0) return {};
  const bool servable = nbytes <= kMaxRequest;
  const std::size_t size = servable ? round_size(nbytes) : 0;
  const bool small = size <= kSmallSize;
  huge_pages = huge_pages && !small;
  const PoolId routed = routing_threads_.load(std::memory_order_relaxed) == 0
                            ? kDefaultPool
                            : routed_pool();

  std::unique_lock<std::mutex> lock(mutex_);
  State& state = *state_;
  if (!state.deferred.empty()) [[unlikely]]
    process_deferred_locked();
  Block* block = nullptr;
  if (servable) {
    // Everything that may throw happens before the free lists change.
    state.blocks.reserve(2);  // a segment's head and a split's front
    // A route keeps its pool alive (one use), so it is found.
    PrivatePool* pool = huge_pages               ? &state.huge_pages
                        : routed == kDefaultPool ? nullptr
                                                 : state.find_pool(routed);
    block = state.bins(pool, small).best_fit(size, bin_index(size));
    if (block == nullptr) {
      block = state.grow(size, small, pool, memory_limit_locked());
    }
  }
  if (block == nullptr) {
    ++state.stats.num_ooms;
    const auto allocated =
        static_cast<std::size_t>(state.stats.allocated_bytes.current);
    const std::size_t reserved = state.reserved();
    const std::size_t limit = memory_limit_locked();
    lock.unlock();
    throw OutOfMemory(device_index_, nbytes, allocated, reserved, limit);
  }

  block = state.carve(block, size, small);
  block->state = BlockState::kAllocated;
  block->requested = nbytes;
  const auto bytes = static_cast<int64_t>(block->size);
  add(state.stats.allocation, 1);
  add(state.stats.allocated_bytes, bytes);
  add(state.stats.requested_bytes, static_cast<int64_t>(nbytes));
  unpoison(block->ptr, nbytes);
  return {block->ptr, block};
}

Allocation CachingAllocator::allocate(std::size_t nbytes) {
  return allocate_from(nbytes, false);
}

Allocation CachingAllocator::allocate_huge_pages(std::size_t nbytes) {
  return allocate_from(nbytes, true);
}

// Caller holds mutex_; `block` is allocated.
void CachingAllocator::free_locked(Block* block) {
  State& state = *state_;
  const auto bytes = static_cast<int64_t>(block->size);
  subtract(state.stats.allocation, 1);
  subtract(state.stats.allocated_bytes, bytes);
  subtract(state.stats.requested_bytes, static_cast<int64_t>(block->requested));
  poison(block->ptr, block->size);
  state.release(block);
}

void CachingAllocator::set_memory_limit(std::size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  state_->limit_setting = bytes;
}

std::size_t CachingAllocator::memory_limit() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return memory_limit_locked();
}

std::size_t CachingAllocator::memory_limit_locked() const {
  return state_->limit_setting == 0 ? capacity_ : state_->limit_setting;
}

void CachingAllocator::free(Block* block) {
  if (block == nullptr) return;
  std::vector<Stream*> uses;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    State& state = *state_;
    // Only records of this allocator's slabs are ever dereferenced.
    if (state.blocks.contains(block) &&
        block->state == BlockState::kAllocated) {
      if (!state.stream_uses.empty()) [[unlikely]] {
        if (auto it = state.stream_uses.find(block);
            it != state.stream_uses.end()) {
          uses = std::move(it->second);
          state.stream_uses.erase(it);
        }
      }
      if (uses.empty()) {
        free_locked(block);
        return;
      }
    }
  }
  if (!uses.empty()) {
    free_after_streams(block, uses);
    return;
  }
  throw std::invalid_argument(
      "ember:" + std::to_string(device_index_) +
      " allocator: free() of a block that is not allocated here "
      "(double free, or a block of another device)");
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  process_deferred_locked();
  state_->release_fully_free_segments();
}

}  // namespace ember::runtime
