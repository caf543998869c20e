// Internals of the caching allocator, shared by its source files:
//   caching_allocator.cpp           allocation, free, segments, the limit
//   caching_allocator_streams.cpp   record_stream and the deferred frees
//   caching_allocator_snapshot.cpp  statistics and snapshots
// The size classes, the statistics helpers and the allocator's State (its
// segments, free lists and counters). Everything here is inline: the hot
// path (allocate + free of a small block) is inlined into one function even
// in PIC code, where calls to external symbols are not. Not thread safe;
// the allocator's mutex guards all of it.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "block_pool.h"
#include "ember/runtime/caching_allocator.h"
#include "ember/runtime/stream.h"
#include "ember/runtime/topology.h"
#include "segment_memory.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define EMBER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#include <sanitizer/asan_interface.h>
#define EMBER_ASAN 1
#endif
#endif

namespace ember::runtime::allocator_detail {

// AddressSanitizer build (make sanitize): ember memory is mmap'd, so ASan
// knows nothing of its blocks unless told. Every segment starts poisoned;
// allocate() unpoisons exactly the bytes the client asked for (the slack
// behind them, up to the block's rounded size, stays poisoned) and free()
// poisons the block again, so overruns, use after free and reads of free
// blocks are reported where they happen. No-ops in other builds.
inline void poison(const void* ptr, std::size_t size) {
#ifdef EMBER_ASAN
  ASAN_POISON_MEMORY_REGION(ptr, size);
#else
  (void)ptr;
  (void)size;
#endif
}

inline void unpoison(const void* ptr, std::size_t size) {
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

inline std::size_t round_up(std::size_t value, std::size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// The smallest segment that can hold a rounded request of `size` bytes.
inline std::size_t minimal_segment_size(std::size_t size, bool small) {
  return small ? kSmallSegmentSize : round_up(size, kRoundLarge);
}

// The allocator's own copies of Stat::increase/decrease and
// round_allocation_size: inline, so they are inlined even in PIC code, where
// calls to the public symbols are not.
inline void add(Stat& stat, int64_t amount) {
  stat.current += amount;
  stat.peak = std::max(stat.peak, stat.current);
  stat.allocated += amount;
}

inline void subtract(Stat& stat, int64_t amount) {
  stat.current -= amount;
  stat.freed += amount;
}

inline std::size_t round_size(std::size_t nbytes) {
  if (nbytes < kMinBlockSize) return kMinBlockSize;
  return round_up(nbytes, kMinBlockSize);
}

// Bin k holds sizes in (512 B << (k - 1), 512 B << k]: a whole 2 MiB
// segment shares its bin with what is left after a small split, so the
// hottest split and merge keep the free block where it is.
inline int bin_index(std::size_t size) {
  const int log2_ceil = std::bit_width(size - 1);
  return std::clamp(log2_ceil - std::countr_zero(kMinBlockSize), 0,
                    kNumBins - 1);
}

}  // namespace ember::runtime::allocator_detail

namespace ember::runtime {

// Only the allocator's own source files include this header.
using namespace allocator_detail;

// A private pool (torch.ember.MemPool): segments of its own, whose blocks
// serve only requests routed to the pool and go back to it when freed.
struct PrivatePool {
  PoolId id = kDefaultPool;
  FreeBins small_bins;
  FreeBins large_bins;
  // Holders: the MemPool object and each active use_mem_pool context. At 0
  // the pool is "freeable": empty_cache() returns its free segments, and it
  // is forgotten once it has none left.
  int use_count = 0;
  std::size_t segments = 0;

  FreeBins& bins(bool small) { return small ? small_bins : large_bins; }
};

struct CachingAllocator::State {
  BlockPool blocks;
  FreeBins small_pool;  // the default pool's free blocks
  FreeBins large_pool;
  std::map<std::uintptr_t, std::unique_ptr<Segment>> segments;  // by base
  std::map<PoolId, std::unique_ptr<PrivatePool>> private_pools;
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

  // New segments are memory files other processes can map (default).
  bool shared_segments = true;
  // After fork(), the child's inherited default-pool segments: they serve
  // no new request (the child's new blocks go to fresh, shareable segments)
  // and go back to the OS once free. Never routed to, so never held.
  PrivatePool inherited;
  // allocate_huge_pages()'s blocks: segments of 2 MiB pages, never shared.
  // Held by nobody, so empty_cache() returns its free segments.
  PrivatePool huge_pages;

  ~State() {
    for (auto& [base, segment] : segments) {
      unpoison(segment->base, segment->size);
      unmap_segment_memory({segment->base, segment->fd}, segment->size);
    }
  }

  FreeBins& default_bins(bool small) { return small ? small_pool : large_pool; }
  // The free lists of `pool` (nullptr: the default pool).
  FreeBins& bins(PrivatePool* pool, bool small) {
    return pool == nullptr ? default_bins(small) : pool->bins(small);
  }
  FreeBins& bins_of(const Segment* segment) {
    return bins(segment->pool, segment->small);
  }

  // Segments empty_cache() may return: the default pool's, and those of
  // private pools nobody holds any more (CUDA's rule). `only`: just that
  // pool's segments (empty_cache(pool), when a MemPool goes away).
  static bool releasable(const Segment& segment, const PrivatePool* only) {
    if (only != nullptr) return segment.pool == only;
    return segment.pool == nullptr || segment.pool->use_count == 0;
  }

  PrivatePool* find_pool(PoolId id) {
    auto it = private_pools.find(id);
    return it == private_pools.end() ? nullptr : it->second.get();
  }

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
    bins_of(block->segment).insert(block, bin_index(block->size));
    count_free(block);
  }

  void remove_free(Block* block) {
    bins_of(block->segment).erase(block, bin_index(block->size));
    uncount_free(block);
  }

  // Maps a segment for `pool` and puts its single block in the free lists.
  // Returns nullptr if the OS refuses. Needs one reserved Block.
  Block* map_segment(std::size_t size, bool small, PrivatePool* pool) {
    auto segment = std::make_unique<Segment>();
    const bool huge = pool == &huge_pages;
    const SegmentMemory memory =
        huge ? map_huge_page_memory(size)
             : map_segment_memory(size, shared_segments);
    void* base = memory.base;
    if (base == nullptr) return nullptr;
    if (memory.fd < 0 && !huge) ++stats.num_unshareable_segments;
    // Before the first touch, so every page lands on the device's node.
    if (numa_node >= 0) (void)topology().bind_memory(base, size, numa_node);
    poison(base, size);
    segment->base = static_cast<char*>(base);
    segment->size = size;
    segment->fd = memory.fd;
    segment->small = small;
    segment->pool = pool;
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
      unmap_segment_memory(memory, size);
      throw;
    }
    add(stats.segment, 1);
    add(stats.reserved_bytes, static_cast<int64_t>(size));
    ++stats.num_device_alloc;
    insert_free(head);
    return head;
  }

  // Bytes empty_cache() would return (releasable(), fully free).
  std::size_t fully_free_segment_bytes() const {
    std::size_t bytes = 0;
    for (const auto& [base, segment] : segments) {
      if (segment->fully_free() && releasable(*segment, nullptr)) {
        bytes += segment->size;
      }
    }
    return bytes;
  }

  // Unmaps every fully free segment that releasable(segment, only) allows,
  // then forgets the private pools nobody holds that have no segment left.
  void release_fully_free_segments(const PrivatePool* only = nullptr) {
    for (auto it = segments.begin(); it != segments.end();) {
      Segment& segment = *it->second;
      if (!segment.fully_free() || !releasable(segment, only)) {
        ++it;
        continue;
      }
      remove_free(segment.head);
      blocks.give(segment.head);
      // The address range may be mapped again by anyone: no stale poison.
      unpoison(segment.base, segment.size);
      unmap_segment_memory({segment.base, segment.fd}, segment.size);
      subtract(stats.segment, 1);
      subtract(stats.reserved_bytes, static_cast<int64_t>(segment.size));
      ++stats.num_device_free;
      if (segment.pool != nullptr) --segment.pool->segments;
      it = segments.erase(it);
    }
    std::erase_if(private_pools, [](const auto& entry) {
      return entry.second->use_count == 0 && entry.second->segments == 0;
    });
  }

  std::size_t reserved() const {
    return static_cast<std::size_t>(stats.reserved_bytes.current);
  }

  // Maps a segment able to hold `size` bytes within `limit`, preferring the
  // pool's usual segment size. nullptr if neither size fits or mmap fails.
  Block* try_new_segment(std::size_t size, bool small, PrivatePool* pool,
                         std::size_t limit) {
    const std::size_t minimal = minimal_segment_size(size, small);
    const std::size_t preferred =
        small ? kSmallSegmentSize
              : (size < kMinLargeAlloc ? kLargeSegmentSize : minimal);
    for (std::size_t candidate : {preferred, minimal}) {
      if (candidate > limit || reserved() > limit - candidate) continue;
      if (Block* block = map_segment(candidate, small, pool)) {
        if (pool != nullptr) ++pool->segments;
        return block;
      }
    }
    return nullptr;
  }

  // No cached block of `pool` fits: map a segment for it, flushing the
  // cache once if the limit is in the way and that can make room (the
  // default pool's and freeable pools' segments, never those of a live
  // private pool). nullptr if nothing helps.
  [[gnu::noinline]] Block* grow(std::size_t size, bool small, PrivatePool* pool,
                                std::size_t limit) {
    if (Block* block = try_new_segment(size, small, pool, limit)) return block;
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
    return try_new_segment(size, small, pool, limit);
  }

  // Takes `size` bytes from the front of the free `block`. The rest stays
  // free when it is worth keeping: any remainder in the small pool, only
  // remainders above 1 MiB in the large pool (smaller ones would fragment it
  // for little gain, as in CUDA). `small`: the block's segment is small.
  // Needs one reserved Block.
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
    bins_of(block->segment).rekeyed(block, old_bin, bin_index(remaining));
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
    FreeBins& pool = bins_of(block->segment);
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

}  // namespace ember::runtime
