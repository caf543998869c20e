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

#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <unordered_map>
#include <vector>

#include "block_pool.h"
#include "ember/runtime/cpu_features.h"
#include "ember/runtime/stream.h"
#include "ember/runtime/topology.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define EMBER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#include <sanitizer/asan_interface.h>
#define EMBER_ASAN 1
#endif
#endif

namespace ember::runtime {

namespace {

// AddressSanitizer build (make sanitize): ember memory is mmap'd, so ASan
// knows nothing of its blocks unless told. Every segment starts poisoned;
// allocate() unpoisons exactly the bytes the client asked for (the slack
// behind them, up to the block's rounded size, stays poisoned) and free()
// poisons the block again, so overruns, use after free and reads of free
// blocks are reported where they happen. No-ops in other builds.
void poison(const void* ptr, std::size_t size) {
#ifdef EMBER_ASAN
  ASAN_POISON_MEMORY_REGION(ptr, size);
#else
  (void)ptr;
  (void)size;
#endif
}

void unpoison(const void* ptr, std::size_t size) {
#ifdef EMBER_ASAN
  ASAN_UNPOISON_MEMORY_REGION(ptr, size);
#else
  (void)ptr;
  (void)size;
#endif
}

constexpr std::size_t kMinBlockSize = 512;
constexpr std::size_t kSmallSize = std::size_t{1} << 20;          // 1 MiB
constexpr std::size_t kSmallSegmentSize = std::size_t{2} << 20;   // 2 MiB
constexpr std::size_t kLargeSegmentSize = std::size_t{20} << 20;  // 20 MiB
constexpr std::size_t kMinLargeAlloc = std::size_t{10} << 20;     // 10 MiB
constexpr std::size_t kRoundLarge = std::size_t{2} << 20;         // 2 MiB
// Requests above this cannot be rounded without overflow; they can never be
// served anyway.
constexpr std::size_t kMaxRequest = std::numeric_limits<std::size_t>::max() / 2;

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

// The allocator's own copies of Stat::increase/decrease and
// round_allocation_size: internal linkage, so they are inlined even in PIC
// code, where calls to the public symbols are not.
void add(Stat& stat, int64_t amount) {
  stat.current += amount;
  stat.peak = std::max(stat.peak, stat.current);
  stat.allocated += amount;
}

void subtract(Stat& stat, int64_t amount) {
  stat.current -= amount;
  stat.freed += amount;
}

std::size_t round_size(std::size_t nbytes) {
  if (nbytes < kMinBlockSize) return kMinBlockSize;
  return round_up(nbytes, kMinBlockSize);
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

namespace {

// Bin k holds sizes in (512 B << (k - 1), 512 B << k]: a whole 2 MiB
// segment shares its bin with what is left after a small split, so the
// hottest split and merge keep the free block where it is.
int bin_index(std::size_t size) {
  const int log2_ceil = std::bit_width(size - 1);
  return std::clamp(log2_ceil - std::countr_zero(kMinBlockSize), 0,
                    kNumBins - 1);
}

}  // namespace

struct CachingAllocator::State {
  BlockPool blocks;
  FreeBins small_pool;
  FreeBins large_pool;
  std::map<std::uintptr_t, std::unique_ptr<Segment>> segments;  // by base
  // active / active_bytes always equal allocation / allocated_bytes here (no
  // deferred frees), so only the latter are kept; stats() copies them over.
  MemoryStats stats;
  std::size_t limit_setting = 0;  // 0 = capacity
  int numa_node = -1;             // node new segments prefer; -1: none
  // record_stream: streams that used a block besides the one it was
  // allocated for, and freed blocks waiting for those streams.
  std::unordered_map<Block*, std::vector<Stream*>> stream_uses;
  struct Deferred {
    Block* block;
    std::vector<Event> events;  // recorded on the using streams at free()
  };
  std::vector<Deferred> deferred;

  ~State() {
    for (auto& [base, segment] : segments) {
      unpoison(segment->base, segment->size);
      munmap(segment->base, segment->size);
    }
  }

  FreeBins& pool_of(bool small) { return small ? small_pool : large_pool; }

  // A free block inside a partly used segment is an inactive split.
  void count_free(const Block* block) {
    if (block->is_split()) {
      add(stats.inactive_split, 1);
      add(stats.inactive_split_bytes, static_cast<int64_t>(block->size));
    }
  }
  void uncount_free(const Block* block) {
    if (block->is_split()) {
      subtract(stats.inactive_split, 1);
      subtract(stats.inactive_split_bytes, static_cast<int64_t>(block->size));
    }
  }

  void insert_free(Block* block) {
    block->state = BlockState::kFree;
    pool_of(block->segment->small).insert(block, bin_index(block->size));
    count_free(block);
  }

  void remove_free(Block* block) {
    pool_of(block->segment->small).erase(block, bin_index(block->size));
    uncount_free(block);
  }

  // Maps a segment and puts its single block in the free lists. Returns
  // nullptr if the OS refuses. Needs one reserved Block.
  Block* map_segment(std::size_t size, bool small) {
    auto segment = std::make_unique<Segment>();
    void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return nullptr;
    // Before the first touch, so every page lands on the device's node.
    if (numa_node >= 0) (void)topology().bind_memory(base, size, numa_node);
    poison(base, size);
    segment->base = static_cast<char*>(base);
    segment->size = size;
    segment->small = small;
    Block* head = blocks.take();
    head->ptr = segment->base;
    head->size = size;
    head->segment = segment.get();
    head->prev = head->next = nullptr;
    segment->head = head;
    try {
      segments.emplace(reinterpret_cast<std::uintptr_t>(base),
                       std::move(segment));
    } catch (...) {
      blocks.give(head);
      unpoison(base, size);
      munmap(base, size);
      throw;
    }
    add(stats.segment, 1);
    add(stats.reserved_bytes, static_cast<int64_t>(size));
    ++stats.num_device_alloc;
    insert_free(head);
    return head;
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
      blocks.give(segment.head);
      // The address range may be mapped again by anyone: no stale poison.
      unpoison(segment.base, segment.size);
      munmap(segment.base, segment.size);
      subtract(stats.segment, 1);
      subtract(stats.reserved_bytes, static_cast<int64_t>(segment.size));
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

  // No cached block fits: map a segment, flushing the cache once if the
  // limit is in the way and that can make room. nullptr if nothing helps.
  [[gnu::noinline]] Block* grow(std::size_t size, bool small,
                                std::size_t limit) {
    if (Block* block = try_new_segment(size, small, limit)) return block;
    // Flush the cache only if that can make room: a hopeless request then
    // leaves the cache (and every stat but num_ooms) untouched.
    const std::size_t cached = fully_free_segment_bytes();
    const std::size_t minimal = minimal_segment_size(size, small);
    if (cached == 0 || minimal > limit ||
        reserved() - cached > limit - minimal) {
      return nullptr;
    }
    ++stats.num_alloc_retries;
    release_fully_free_segments();
    return try_new_segment(size, small, limit);
  }

  // Takes `size` bytes from the front of the free `block`. The rest stays
  // free when it is worth keeping: any remainder in the small pool, only
  // remainders above 1 MiB in the large pool (smaller ones would fragment it
  // for little gain, as in CUDA). `small` is the block's pool. Needs one
  // reserved Block.
  Block* carve(Block* block, std::size_t size, bool small) {
    const std::size_t remaining = block->size - size;
    const bool worth_it =
        small ? remaining >= kMinBlockSize : remaining > kSmallSize;
    if (!worth_it) {
      remove_free(block);
      return block;
    }
    uncount_free(block);
    // The front becomes a new record; the free record keeps the rest, so
    // it can usually stay where it is in its bin.
    Block* front = blocks.take();
    front->ptr = block->ptr;
    front->size = size;
    front->segment = block->segment;
    front->prev = block->prev;
    front->next = block;
    if (block->prev != nullptr) {
      block->prev->next = front;
    } else {
      block->segment->head = front;
    }
    const int old_bin = bin_index(block->size);
    block->prev = front;
    block->ptr += size;
    block->size = remaining;
    pool_of(small).rekeyed(block, old_bin, bin_index(remaining));
    count_free(block);
    return front;
  }

  // Merges block->next into `block` and recycles its record.
  void absorb_next(Block* block) {
    Block* next = block->next;
    block->size += next->size;
    block->next = next->next;
    if (next->next != nullptr) next->next->prev = block;
    blocks.give(next);
  }

  // Returns an allocated block to the free lists, merged with free
  // neighbours. A merged-away record is recycled; the surviving free record
  // grows in place.
  void release(Block* block) {
    FreeBins& pool = pool_of(block->segment->small);
    Block* prev = block->prev;
    Block* next = block->next;
    const bool prev_free = prev != nullptr && prev->state == BlockState::kFree;
    const bool next_free = next != nullptr && next->state == BlockState::kFree;
    if (!prev_free && !next_free) {
      insert_free(block);
      return;
    }
    Block* survivor = prev_free ? prev : next;
    uncount_free(survivor);
    const int old_bin = bin_index(survivor->size);
    if (prev_free) {
      absorb_next(prev);  // block
      if (next_free) {
        remove_free(next);
        absorb_next(prev);  // next
      }
    } else {
      next->ptr = block->ptr;
      next->size += block->size;
      next->prev = prev;
      if (prev != nullptr) {
        prev->next = next;
      } else {
        block->segment->head = next;
      }
      blocks.give(block);
    }
    pool.rekeyed(survivor, old_bin, bin_index(survivor->size));
    count_free(survivor);
  }
};

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

Allocation CachingAllocator::allocate(std::size_t nbytes) {
  if (nbytes == 0) return {};
  const bool servable = nbytes <= kMaxRequest;
  const std::size_t size = servable ? round_size(nbytes) : 0;
  const bool small = size <= kSmallSize;

  std::unique_lock<std::mutex> lock(mutex_);
  State& state = *state_;
  if (!state.deferred.empty()) [[unlikely]]
    process_deferred_locked();
  Block* block = nullptr;
  if (servable) {
    // Everything that may throw happens before the free lists change.
    state.blocks.reserve(2);  // a segment's head and a split's front
    block = state.pool_of(small).best_fit(size, bin_index(size));
    if (block == nullptr) {
      block = state.grow(size, small, memory_limit_locked());
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

// Caller holds mutex_: frees the deferred blocks whose streams have passed
// their free point.
void CachingAllocator::process_deferred_locked() {
  auto& deferred = state_->deferred;
  std::size_t kept = 0;
  for (std::size_t i = 0; i < deferred.size(); ++i) {
    bool done = true;
    for (const Event& event : deferred[i].events) done = done && event.query();
    if (done) {
      free_locked(deferred[i].block);
    } else {
      deferred[kept++] = std::move(deferred[i]);
    }
  }
  deferred.resize(kept);
}

void CachingAllocator::record_stream(Block* block, Stream& stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  State& state = *state_;
  if (!state.blocks.contains(block) || block->state != BlockState::kAllocated) {
    throw std::invalid_argument(
        "ember:" + std::to_string(device_index_) +
        " allocator: record_stream() of a block that is not allocated here");
  }
  auto& uses = state.stream_uses[block];
  for (Stream* used : uses) {
    if (used == &stream) return;
  }
  uses.push_back(&stream);
}

std::size_t CachingAllocator::deferred_frees() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return state_->deferred.size();
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
    // Events recorded outside the allocator's lock (recording takes the
    // stream's): the block is reused once every stream that used it has
    // passed this point.
    std::vector<Event> events;
    for (Stream* stream : uses) {
      Event event;
      event.record(*stream);
      if (!event.query()) events.push_back(std::move(event));
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (events.empty()) {
      free_locked(block);
    } else {
      state_->deferred.push_back({block, std::move(events)});
    }
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

MemoryStats CachingAllocator::stats() const {
  MemoryStats stats;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stats = state_->stats;
  }
  stats.active = stats.allocation;
  stats.active_bytes = stats.allocated_bytes;
  return stats;
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

std::vector<SegmentSnapshot> CachingAllocator::snapshot() const {
  std::vector<SegmentSnapshot> out;
  std::lock_guard<std::mutex> lock(mutex_);
  out.reserve(state_->segments.size());
  for (const auto& [base, segment] : state_->segments) {
    SegmentSnapshot& s = out.emplace_back();
    s.address = base;
    s.size = segment->size;
    s.small = segment->small;
    for (const Block* b = segment->head; b != nullptr; b = b->next) {
      const bool allocated = b->state == BlockState::kAllocated;
      s.blocks.push_back({reinterpret_cast<std::uintptr_t>(b->ptr), b->size,
                          allocated ? b->requested : 0, allocated});
    }
  }
  return out;
}

std::pair<void*, std::size_t> CachingAllocator::span(const Block* block) {
  return {block->ptr, block->size};
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
