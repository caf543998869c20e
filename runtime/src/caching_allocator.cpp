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
//   * Segments are anonymous private mmaps, unmapped by empty_cache(). Pages
//     are placed by the kernel's first-touch policy (no libnuma binding): the
//     worker that first writes a block decides its NUMA node.
#include "ember/runtime/caching_allocator.h"

#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdio>
#include <limits>
#include <map>
#include <set>
#include <unordered_set>

#include "ember/runtime/cpu_features.h"

namespace ember::runtime {

namespace {

constexpr std::size_t kMinBlockSize = 512;
constexpr std::size_t kSmallSize = std::size_t{1} << 20;          // 1 MiB
constexpr std::size_t kSmallSegmentSize = std::size_t{2} << 20;   // 2 MiB
constexpr std::size_t kLargeSegmentSize = std::size_t{20} << 20;  // 20 MiB
constexpr std::size_t kMinLargeAlloc = std::size_t{10} << 20;     // 10 MiB
constexpr std::size_t kRoundLarge = std::size_t{2} << 20;         // 2 MiB
// Requests above this cannot be rounded without overflow; they can never be
// served anyway.
constexpr std::size_t kMaxRequest = std::numeric_limits<std::size_t>::max() / 2;
constexpr int kNumBins = 64;

static_assert(kMinBlockSize % kAlignment == 0,
              "block offsets must keep every pointer kAlignment-aligned");

std::size_t round_up(std::size_t value, std::size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// The smallest segment that can hold a rounded request of `size` bytes.
std::size_t minimal_segment_size(std::size_t size, bool small) {
  return small ? kSmallSegmentSize : round_up(size, kRoundLarge);
}

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

template <class Fn>
void for_each_stat(MemoryStats& stats, Fn&& fn) {
  for (Stat* stat :
       {&stats.allocation, &stats.segment, &stats.active, &stats.inactive_split,
        &stats.allocated_bytes, &stats.reserved_bytes, &stats.active_bytes,
        &stats.inactive_split_bytes, &stats.requested_bytes}) {
    fn(*stat);
  }
}

}  // namespace

void Stat::increase(int64_t amount) {
  current += amount;
  peak = std::max(peak, current);
  allocated += amount;
}

void Stat::decrease(int64_t amount) {
  current -= amount;
  freed += amount;
}

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
  if (nbytes < kMinBlockSize) return kMinBlockSize;
  return round_up(nbytes, kMinBlockSize);
}

struct Segment;

// A span of a segment. Blocks of one segment form a doubly linked list in
// address order, so neighbours are found in O(1) for coalescing.
struct Block {
  char* ptr = nullptr;
  std::size_t size = 0;
  std::size_t requested = 0;  // what the client asked for, while allocated
  Segment* segment = nullptr;
  Block* prev = nullptr;
  Block* next = nullptr;
  bool allocated = false;

  // A block that does not cover its whole segment.
  bool is_split() const { return prev != nullptr || next != nullptr; }
};

struct Segment {
  char* base = nullptr;
  std::size_t size = 0;
  bool small = false;
  // The first block. Coalescing always keeps the lower block, so the head
  // lives as long as the segment.
  Block* head = nullptr;

  bool fully_free() const { return !head->allocated && head->next == nullptr; }
};

namespace {

struct BlockLess {
  bool operator()(const Block* a, const Block* b) const {
    if (a->size != b->size) return a->size < b->size;
    return a->ptr < b->ptr;
  }
};

int bin_index(std::size_t size) {
  const int log2 = std::bit_width(size) - 1;
  return std::clamp(log2 - std::countr_zero(kMinBlockSize), 0, kNumBins - 1);
}

struct Pool {
  std::array<std::set<Block*, BlockLess>, kNumBins> bins;

  // Smallest free block of at least `size` bytes, or nullptr.
  Block* best_fit(std::size_t size) const {
    Block key;
    key.size = size;
    int bin = bin_index(size);
    if (auto it = bins[bin].lower_bound(&key); it != bins[bin].end()) {
      return *it;
    }
    for (++bin; bin < kNumBins; ++bin) {
      if (!bins[bin].empty()) return *bins[bin].begin();
    }
    return nullptr;
  }
};

}  // namespace

struct CachingAllocator::State {
  Pool small_pool;
  Pool large_pool;
  std::map<std::uintptr_t, std::unique_ptr<Segment>> segments;  // by base
  std::unordered_set<Block*> active;  // validates free() arguments
  MemoryStats stats;
  std::size_t limit_setting = 0;  // 0 = capacity

  Pool& pool_of(bool small) { return small ? small_pool : large_pool; }

  void insert_free(Block* block) {
    pool_of(block->segment->small).bins[bin_index(block->size)].insert(block);
    if (block->is_split()) {
      stats.inactive_split.increase(1);
      stats.inactive_split_bytes.increase(static_cast<int64_t>(block->size));
    }
  }

  void remove_free(Block* block) {
    pool_of(block->segment->small).bins[bin_index(block->size)].erase(block);
    if (block->is_split()) {
      stats.inactive_split.decrease(1);
      stats.inactive_split_bytes.decrease(static_cast<int64_t>(block->size));
    }
  }

  // Maps a segment and puts its single block in the free lists. Returns
  // nullptr if the OS refuses.
  Block* map_segment(std::size_t size, bool small) {
    auto segment = std::make_unique<Segment>();
    auto head = std::make_unique<Block>();
    void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return nullptr;
    segment->base = static_cast<char*>(base);
    segment->size = size;
    segment->small = small;
    segment->head = head.get();
    head->ptr = segment->base;
    head->size = size;
    head->segment = segment.get();
    try {
      segments.emplace(reinterpret_cast<std::uintptr_t>(base),
                       std::move(segment));
    } catch (...) {
      munmap(base, size);
      throw;
    }
    stats.segment.increase(1);
    stats.reserved_bytes.increase(static_cast<int64_t>(size));
    ++stats.num_device_alloc;
    Block* block = head.release();
    insert_free(block);
    return block;
  }

  std::size_t fully_free_segment_bytes() const {
    std::size_t bytes = 0;
    for (const auto& [base, segment] : segments) {
      if (segment->fully_free()) bytes += segment->size;
    }
    return bytes;
  }

  void release_fully_free_segments() {
    for (auto it = segments.begin(); it != segments.end();) {
      Segment& segment = *it->second;
      if (!segment.fully_free()) {
        ++it;
        continue;
      }
      remove_free(segment.head);
      delete segment.head;
      munmap(segment.base, segment.size);
      stats.segment.decrease(1);
      stats.reserved_bytes.decrease(static_cast<int64_t>(segment.size));
      ++stats.num_device_free;
      it = segments.erase(it);
    }
  }

  std::size_t reserved() const {
    return static_cast<std::size_t>(stats.reserved_bytes.current);
  }

  // Maps a segment able to hold `size` bytes within `limit`, preferring the
  // pool's usual segment size. nullptr if neither size fits or mmap fails.
  Block* try_new_segment(std::size_t size, bool small, std::size_t limit) {
    const std::size_t minimal = minimal_segment_size(size, small);
    const std::size_t preferred =
        small ? kSmallSegmentSize
              : (size < kMinLargeAlloc ? kLargeSegmentSize : minimal);
    for (std::size_t candidate : {preferred, minimal}) {
      if (candidate > limit || reserved() > limit - candidate) continue;
      if (Block* block = map_segment(candidate, small)) return block;
    }
    return nullptr;
  }

  // Splits `block` so it is `size` bytes when the rest is worth keeping: any
  // remainder in the small pool, only remainders above 1 MiB in the large
  // pool (smaller ones would fragment it for little gain, as in CUDA).
  // `spare` is preallocated by the caller so splitting cannot throw.
  void split(Block* block, std::size_t size, std::unique_ptr<Block>& spare) {
    const std::size_t remaining = block->size - size;
    const bool worth_it = block->segment->small ? remaining >= kMinBlockSize
                                                : remaining > kSmallSize;
    if (!worth_it) return;
    Block* rest = spare.release();
    rest->ptr = block->ptr + size;
    rest->size = remaining;
    rest->segment = block->segment;
    rest->prev = block;
    rest->next = block->next;
    if (block->next != nullptr) block->next->prev = rest;
    block->next = rest;
    block->size = size;
    insert_free(rest);
  }

  // Merges a newly freed block with free neighbours; returns the result.
  Block* coalesce(Block* block) {
    if (Block* prev = block->prev; prev != nullptr && !prev->allocated) {
      remove_free(prev);
      prev->size += block->size;
      prev->next = block->next;
      if (block->next != nullptr) block->next->prev = prev;
      delete block;
      block = prev;
    }
    if (Block* next = block->next; next != nullptr && !next->allocated) {
      remove_free(next);
      block->size += next->size;
      block->next = next->next;
      if (next->next != nullptr) next->next->prev = block;
      delete next;
    }
    return block;
  }

  void release_everything() {
    for (auto& [base, segment] : segments) {
      for (Block* block = segment->head; block != nullptr;) {
        Block* next = block->next;
        delete block;
        block = next;
      }
      munmap(segment->base, segment->size);
    }
    segments.clear();
  }
};

CachingAllocator::CachingAllocator(int device_index, std::size_t limit_bytes)
    : device_index_(device_index),
      capacity_(physical_memory_bytes()),
      state_(std::make_unique<State>()) {
  state_->limit_setting = limit_bytes;
}

CachingAllocator::~CachingAllocator() { state_->release_everything(); }

Allocation CachingAllocator::allocate(std::size_t nbytes) {
  if (nbytes == 0) return {};
  std::lock_guard<std::mutex> lock(mutex_);
  State& state = *state_;
  const std::size_t limit = memory_limit_locked();

  Block* block = nullptr;
  if (nbytes <= kMaxRequest) {
    const std::size_t size = round_allocation_size(nbytes);
    const bool small = size <= kSmallSize;
    block = state.pool_of(small).best_fit(size);
    if (block == nullptr) block = state.try_new_segment(size, small, limit);
    if (block == nullptr) {
      // Flush the cache only if that can make room: a hopeless request then
      // leaves the cache (and every stat but num_ooms) untouched.
      const std::size_t cached = state.fully_free_segment_bytes();
      const std::size_t minimal = minimal_segment_size(size, small);
      if (cached > 0 && minimal <= limit &&
          state.reserved() - cached <= limit - minimal) {
        ++state.stats.num_alloc_retries;
        state.release_fully_free_segments();
        block = state.try_new_segment(size, small, limit);
      }
    }
    if (block != nullptr) {
      // Everything that may throw happens before the free lists change.
      auto spare = std::make_unique<Block>();
      state.active.insert(block);
      state.remove_free(block);
      state.split(block, size, spare);
    }
  }
  if (block == nullptr) {
    ++state.stats.num_ooms;
    throw OutOfMemory(
        device_index_, nbytes,
        static_cast<std::size_t>(state.stats.allocated_bytes.current),
        state.reserved(), limit);
  }

  block->allocated = true;
  block->requested = nbytes;
  const auto size = static_cast<int64_t>(block->size);
  state.stats.allocation.increase(1);
  state.stats.active.increase(1);
  state.stats.allocated_bytes.increase(size);
  state.stats.active_bytes.increase(size);
  state.stats.requested_bytes.increase(static_cast<int64_t>(nbytes));
  return {block->ptr, block};
}

void CachingAllocator::free(Block* block) {
  if (block == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  State& state = *state_;
  if (state.active.erase(block) == 0) {
    throw std::invalid_argument(
        "ember:" + std::to_string(device_index_) +
        " allocator: free() of a block that is not allocated here "
        "(double free, or a block of another device)");
  }
  const auto size = static_cast<int64_t>(block->size);
  state.stats.allocation.decrease(1);
  state.stats.active.decrease(1);
  state.stats.allocated_bytes.decrease(size);
  state.stats.active_bytes.decrease(size);
  state.stats.requested_bytes.decrease(static_cast<int64_t>(block->requested));
  block->allocated = false;
  block->requested = 0;
  state.insert_free(state.coalesce(block));
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  state_->release_fully_free_segments();
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return state_->stats;
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  for_each_stat(state_->stats, [](Stat& stat) { stat.reset_peak(); });
}

void CachingAllocator::reset_accumulated_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  MemoryStats& stats = state_->stats;
  for_each_stat(stats, [](Stat& stat) { stat.reset_accumulated(); });
  stats.num_alloc_retries = 0;
  stats.num_ooms = 0;
  stats.num_device_alloc = 0;
  stats.num_device_free = 0;
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

bool CachingAllocator::owns(const void* ptr) const {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  std::lock_guard<std::mutex> lock(mutex_);
  const auto& segments = state_->segments;
  auto it = segments.upper_bound(address);
  if (it == segments.begin()) return false;
  --it;
  return address - it->first < it->second->size;
}

}  // namespace ember::runtime
