#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "ember/runtime/caching_allocator.h"
#include "ember/runtime/cpu_features.h"

namespace ember::runtime {
namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

char* bytes(const Allocation& a) { return static_cast<char*>(a.ptr); }

// True if [ptr, ptr + size) is mapped in this process: mincore fails with
// ENOMEM on unmapped pages.
bool is_mapped(const void* ptr, std::size_t size) {
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGE_SIZE));
  const auto start = reinterpret_cast<std::uintptr_t>(ptr) / page * page;
  std::vector<unsigned char> residency((size + page - 1) / page + 1);
  return mincore(reinterpret_cast<void*>(start), size, residency.data()) == 0;
}

TEST(RoundAllocationSize, RoundsUpToMultiplesOf512) {
  EXPECT_EQ(round_allocation_size(1), 512u);
  EXPECT_EQ(round_allocation_size(512), 512u);
  EXPECT_EQ(round_allocation_size(513), 1024u);
  EXPECT_EQ(round_allocation_size(1000), 1024u);
  EXPECT_EQ(round_allocation_size(1 * MiB), 1 * MiB);
  EXPECT_EQ(round_allocation_size(1 * MiB + 1), 1 * MiB + 512);
  EXPECT_EQ(round_allocation_size(11 * MiB + 3), 11 * MiB + 512);
}

TEST(CachingAllocator, ZeroBytesAndNullFreeDoNothing) {
  CachingAllocator allocator(0);
  const Allocation empty = allocator.allocate(0);
  EXPECT_EQ(empty.ptr, nullptr);
  EXPECT_EQ(empty.block, nullptr);
  allocator.free(nullptr);
  const MemoryStats stats = allocator.stats();
  EXPECT_EQ(stats.allocation.allocated, 0);
  EXPECT_EQ(stats.segment.allocated, 0);
}

TEST(CachingAllocator, EveryPointerIs64ByteAligned) {
  CachingAllocator allocator(0);
  std::vector<Allocation> live;
  for (std::size_t size :
       {std::size_t{1}, std::size_t{63}, std::size_t{65}, std::size_t{1000},
        std::size_t{4097}, 300 * KiB, 1 * MiB + 7, 3 * MiB + 1, 11 * MiB + 5}) {
    live.push_back(allocator.allocate(size));
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(live.back().ptr) % kAlignment,
              0u)
        << "size " << size;
    std::memset(live.back().ptr, 0xab, size);  // the whole request is usable
  }
  for (const Allocation& a : live) allocator.free(a.block);
}

TEST(CachingAllocator, SmallAllocationsSplitOneSegment) {
  CachingAllocator allocator(0);
  const Allocation a = allocator.allocate(1000);
  const Allocation b = allocator.allocate(1000);
  const MemoryStats stats = allocator.stats();
  EXPECT_EQ(stats.segment.current, 1);
  EXPECT_EQ(stats.reserved_bytes.current, static_cast<int64_t>(2 * MiB));
  EXPECT_EQ(stats.num_device_alloc, 1);
  // b is carved right after a's rounded block.
  EXPECT_EQ(bytes(b), bytes(a) + 1024);
  EXPECT_EQ(stats.allocated_bytes.current, 2048);
  EXPECT_EQ(stats.requested_bytes.current, 2000);
  // The rest of the segment is one inactive split block.
  EXPECT_EQ(stats.inactive_split.current, 1);
  EXPECT_EQ(stats.inactive_split_bytes.current,
            static_cast<int64_t>(2 * MiB - 2048));
  EXPECT_TRUE(allocator.owns(a.ptr));
  EXPECT_TRUE(allocator.owns(bytes(b) + 999));
  allocator.free(a.block);
  allocator.free(b.block);
}

TEST(CachingAllocator, FreedNeighboursCoalesceAndAreReused) {
  CachingAllocator allocator(0);
  const Allocation a = allocator.allocate(100 * KiB);
  const Allocation b = allocator.allocate(100 * KiB);
  const Allocation c = allocator.allocate(100 * KiB);
  ASSERT_EQ(bytes(b), bytes(a) + 100 * KiB);
  ASSERT_EQ(bytes(c), bytes(b) + 100 * KiB);

  allocator.free(a.block);
  allocator.free(b.block);
  MemoryStats stats = allocator.stats();
  // a and b merged into one free block; the tail after c is the other.
  EXPECT_EQ(stats.inactive_split.current, 2);
  EXPECT_EQ(stats.inactive_split_bytes.current,
            static_cast<int64_t>(2 * MiB - 100 * KiB));

  // Best fit: the merged 200 KiB hole, not the larger tail.
  const Allocation merged = allocator.allocate(200 * KiB);
  EXPECT_EQ(merged.ptr, a.ptr);
  stats = allocator.stats();
  EXPECT_EQ(stats.num_device_alloc, 1);
  EXPECT_EQ(stats.segment.current, 1);
  EXPECT_EQ(stats.inactive_split.current, 1);

  // Freeing everything leaves one whole free segment, reused from its start.
  allocator.free(merged.block);
  allocator.free(c.block);
  stats = allocator.stats();
  EXPECT_EQ(stats.inactive_split.current, 0);
  EXPECT_EQ(stats.inactive_split_bytes.current, 0);
  const Allocation whole = allocator.allocate(1 * MiB);
  EXPECT_EQ(whole.ptr, a.ptr);
  EXPECT_EQ(allocator.stats().num_device_alloc, 1);
  allocator.free(whole.block);
}

TEST(CachingAllocator, LargeRequestsUseLargeSegments) {
  CachingAllocator allocator(0);
  // 1-10 MiB: carved from a 20 MiB segment.
  const Allocation medium = allocator.allocate(3 * MiB);
  EXPECT_EQ(allocator.stats().reserved_bytes.current,
            static_cast<int64_t>(20 * MiB));
  // A second medium request fits the same segment's remainder.
  const Allocation medium2 = allocator.allocate(5 * MiB);
  EXPECT_EQ(allocator.stats().segment.current, 1);
  EXPECT_EQ(bytes(medium2), bytes(medium) + 3 * MiB);
  // Over 10 MiB: its own segment, rounded up to 2 MiB.
  const Allocation big = allocator.allocate(13 * MiB);
  MemoryStats stats = allocator.stats();
  EXPECT_EQ(stats.segment.current, 2);
  EXPECT_EQ(stats.reserved_bytes.current, static_cast<int64_t>(34 * MiB));
  // The 1 MiB left in the 14 MiB segment is too small to split off in the
  // large pool, so the block (and allocated_bytes) keeps it, as in CUDA.
  EXPECT_EQ(stats.allocated_bytes.current, static_cast<int64_t>(22 * MiB));
  EXPECT_EQ(stats.requested_bytes.current, static_cast<int64_t>(21 * MiB));
  // Small requests never come from the large pool.
  const Allocation small = allocator.allocate(4 * KiB);
  EXPECT_EQ(allocator.stats().segment.current, 3);
  for (const Allocation& a : {medium, medium2, big, small}) {
    allocator.free(a.block);
  }
}

TEST(CachingAllocator, StatsTrackCurrentPeakAllocatedFreed) {
  CachingAllocator allocator(0);
  const Allocation a = allocator.allocate(1000);
  const Allocation b = allocator.allocate(3000);
  allocator.free(a.block);

  MemoryStats stats = allocator.stats();
  EXPECT_EQ(stats.allocated_bytes.current, 3072);
  EXPECT_EQ(stats.allocated_bytes.peak, 4096);
  EXPECT_EQ(stats.allocated_bytes.allocated, 4096);
  EXPECT_EQ(stats.allocated_bytes.freed, 1024);

  EXPECT_EQ(stats.requested_bytes.current, 3000);
  EXPECT_EQ(stats.requested_bytes.peak, 4000);
  EXPECT_EQ(stats.requested_bytes.allocated, 4000);
  EXPECT_EQ(stats.requested_bytes.freed, 1000);

  EXPECT_EQ(stats.allocation.current, 1);
  EXPECT_EQ(stats.allocation.peak, 2);
  EXPECT_EQ(stats.allocation.allocated, 2);
  EXPECT_EQ(stats.allocation.freed, 1);
  EXPECT_EQ(stats.active.current, 1);
  EXPECT_EQ(stats.active_bytes.current, 3072);

  EXPECT_EQ(stats.segment.current, 1);
  EXPECT_EQ(stats.segment.peak, 1);
  EXPECT_EQ(stats.segment.allocated, 1);
  EXPECT_EQ(stats.segment.freed, 0);
  EXPECT_EQ(stats.reserved_bytes.current, static_cast<int64_t>(2 * MiB));
  EXPECT_EQ(stats.reserved_bytes.peak, static_cast<int64_t>(2 * MiB));

  allocator.reset_peak_stats();
  stats = allocator.stats();
  EXPECT_EQ(stats.allocated_bytes.peak, 3072);
  EXPECT_EQ(stats.requested_bytes.peak, 3000);
  EXPECT_EQ(stats.allocation.peak, 1);
  EXPECT_EQ(stats.allocated_bytes.allocated, 4096);  // untouched

  allocator.reset_accumulated_stats();
  stats = allocator.stats();
  EXPECT_EQ(stats.allocated_bytes.allocated, 0);
  EXPECT_EQ(stats.allocated_bytes.freed, 0);
  EXPECT_EQ(stats.segment.allocated, 0);
  EXPECT_EQ(stats.num_device_alloc, 0);
  EXPECT_EQ(stats.allocated_bytes.current, 3072);  // untouched

  allocator.free(b.block);
  stats = allocator.stats();
  EXPECT_EQ(stats.allocated_bytes.current, 0);
  EXPECT_EQ(stats.requested_bytes.current, 0);
  EXPECT_EQ(stats.allocation.current, 0);
}

TEST(CachingAllocator, EmptyCacheUnmapsOnlyFullyFreeSegments) {
  CachingAllocator allocator(0);
  const Allocation small = allocator.allocate(4 * KiB);
  const Allocation large = allocator.allocate(16 * MiB);
  ASSERT_EQ(allocator.stats().reserved_bytes.current,
            static_cast<int64_t>(18 * MiB));
  allocator.free(large.block);
  // Freed memory stays cached until empty_cache().
  EXPECT_EQ(allocator.stats().reserved_bytes.current,
            static_cast<int64_t>(18 * MiB));
  EXPECT_TRUE(is_mapped(large.ptr, 16 * MiB));

  allocator.empty_cache();
  MemoryStats stats = allocator.stats();
  EXPECT_EQ(stats.reserved_bytes.current, static_cast<int64_t>(2 * MiB));
  EXPECT_EQ(stats.segment.current, 1);
  EXPECT_EQ(stats.num_device_free, 1);
  EXPECT_FALSE(is_mapped(large.ptr, 16 * MiB));  // back with the OS
  EXPECT_FALSE(allocator.owns(large.ptr));
  EXPECT_TRUE(allocator.owns(small.ptr));

  allocator.free(small.block);
  allocator.empty_cache();
  stats = allocator.stats();
  EXPECT_EQ(stats.reserved_bytes.current, 0);
  EXPECT_EQ(stats.reserved_bytes.current, stats.allocated_bytes.current);
  EXPECT_EQ(stats.segment.current, 0);
  EXPECT_EQ(stats.num_device_free, 2);
  EXPECT_EQ(stats.inactive_split.current, 0);
  EXPECT_FALSE(allocator.owns(small.ptr));
}

TEST(CachingAllocator, OwnsOnlyItsSegments) {
  CachingAllocator allocator(0);
  int on_stack = 0;
  EXPECT_FALSE(allocator.owns(&on_stack));
  EXPECT_FALSE(allocator.owns(nullptr));
  const Allocation a = allocator.allocate(100);
  EXPECT_TRUE(allocator.owns(a.ptr));
  EXPECT_TRUE(allocator.owns(bytes(a) + 2 * MiB - 1));  // segment's last byte
  EXPECT_FALSE(allocator.owns(bytes(a) + 2 * MiB));
  CachingAllocator other(1);
  EXPECT_FALSE(other.owns(a.ptr));
  allocator.free(a.block);
}

TEST(CachingAllocator, DoubleFreeIsRejected) {
  CachingAllocator allocator(0);
  const Allocation a = allocator.allocate(100);
  allocator.free(a.block);
  EXPECT_THROW(allocator.free(a.block), std::invalid_argument);
  EXPECT_EQ(allocator.stats().allocation.current, 0);
}

TEST(CachingAllocator, FreeRejectsForeignAndStaleBlocks) {
  CachingAllocator allocator(0);
  CachingAllocator other(1);
  const Allocation a = allocator.allocate(1000);
  const Allocation b = allocator.allocate(1000);
  const Allocation c = allocator.allocate(1000);
  const Allocation foreign = other.allocate(1000);
  const auto rejected = [&](Block* block) {
    try {
      allocator.free(block);
    } catch (const std::invalid_argument& error) {
      EXPECT_NE(std::string(error.what()).find("ember:0"), std::string::npos);
      return true;
    }
    return false;
  };

  // Another allocator's block, and pointers that are no block at all, are
  // rejected without being dereferenced.
  EXPECT_TRUE(rejected(foreign.block));
  alignas(64) char not_a_block[256] = {};
  EXPECT_TRUE(rejected(reinterpret_cast<Block*>(not_a_block)));
  EXPECT_TRUE(rejected(reinterpret_cast<Block*>(a.ptr)));
  EXPECT_TRUE(rejected(reinterpret_cast<Block*>(
      reinterpret_cast<char*>(a.block) + 8)));  // inside a real record

  // b's neighbours are allocated, so it stays a free block of its own: a
  // second free is still rejected.
  allocator.free(b.block);
  EXPECT_TRUE(rejected(b.block));
  // c merges into the free tail, its record is recycled: rejected as well.
  allocator.free(c.block);
  EXPECT_TRUE(rejected(c.block));

  MemoryStats stats = allocator.stats();
  EXPECT_EQ(stats.allocation.current, 1);
  EXPECT_EQ(stats.allocated_bytes.current, 1024);
  EXPECT_EQ(stats.requested_bytes.current, 1000);
  EXPECT_EQ(stats.inactive_split.current, 1);  // b, c and the tail merged
  EXPECT_EQ(other.stats().allocation.current, 1);

  // Nothing was corrupted: the space after a is handed out again.
  const Allocation again = allocator.allocate(3000);
  EXPECT_EQ(again.ptr, b.ptr);
  allocator.free(again.block);
  allocator.free(a.block);
  EXPECT_TRUE(rejected(a.block));
  other.free(foreign.block);
  stats = allocator.stats();
  EXPECT_EQ(stats.allocation.current, 0);
  EXPECT_EQ(stats.inactive_split.current, 0);
  EXPECT_EQ(stats.allocation.freed, 4);
}

// Drives one small segment with random requests and frees and checks every
// placement against a model: best fit by size, then lowest address; splits
// keep the front; frees merge with free neighbours. Exercises the free-block
// trees with many entries, moved in place and re-inserted.
TEST(CachingAllocator, BestFitMatchesModelUnderChurn) {
  CachingAllocator allocator(0);
  std::mt19937 rng(7);
  const Allocation first = allocator.allocate(512);
  char* const base = bytes(first);
  std::map<char*, std::size_t> holes = {{base + 512, 2 * MiB - 512}};
  std::map<char*, Allocation> live = {{base, first}};
  std::map<char*, std::size_t> live_size = {{base, 512}};

  for (int step = 0; step < 20000; ++step) {
    const bool grow = live.size() < 40 || rng() % 2 == 0;
    if (grow) {
      const std::size_t size = 512 * (1 + rng() % (rng() % 8 == 0 ? 64 : 8));
      auto best = holes.end();
      for (auto it = holes.begin(); it != holes.end(); ++it) {
        if (it->second >= size &&
            (best == holes.end() || it->second < best->second)) {
          best = it;  // ties keep the lower address, found first
        }
      }
      if (best == holes.end()) continue;  // would need a second segment
      const Allocation a = allocator.allocate(size);
      ASSERT_EQ(bytes(a), best->first) << "step " << step << " size " << size;
      if (best->second > size) holes[best->first + size] = best->second - size;
      holes.erase(best);
      live[bytes(a)] = a;
      live_size[bytes(a)] = size;
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      char* ptr = it->first;
      std::size_t size = live_size[ptr];
      allocator.free(it->second.block);
      live.erase(it);
      live_size.erase(ptr);
      if (auto next = holes.find(ptr + size); next != holes.end()) {
        size += next->second;
        holes.erase(next);
      }
      auto prev = holes.lower_bound(ptr);
      if (prev != holes.begin() &&
          std::prev(prev)->first + std::prev(prev)->second == ptr) {
        std::prev(prev)->second += size;
      } else {
        holes[ptr] = size;
      }
    }
    if (step % 97 == 0) {
      const MemoryStats stats = allocator.stats();
      std::size_t hole_bytes = 0;
      for (const auto& [ptr, size] : holes) hole_bytes += size;
      ASSERT_EQ(stats.inactive_split.current,
                static_cast<int64_t>(holes.size()));
      ASSERT_EQ(stats.inactive_split_bytes.current,
                static_cast<int64_t>(hole_bytes));
      ASSERT_EQ(stats.allocation.current, static_cast<int64_t>(live.size()));
      ASSERT_EQ(stats.segment.current, 1);
    }
  }
  for (const auto& [ptr, a] : live) allocator.free(a.block);
  const MemoryStats stats = allocator.stats();
  EXPECT_EQ(stats.inactive_split.current, 0);
  EXPECT_EQ(stats.allocated_bytes.current, 0);
  EXPECT_EQ(stats.num_device_alloc, 1);
  // Fully coalesced: the whole segment is one block again.
  const Allocation whole = allocator.allocate(1 * MiB);
  EXPECT_EQ(bytes(whole), base);
  allocator.free(whole.block);
}

TEST(CachingAllocator, LimitDefaultsToCapacity) {
  CachingAllocator allocator(0);
  EXPECT_EQ(allocator.capacity(), physical_memory_bytes());
  EXPECT_EQ(allocator.memory_limit(), allocator.capacity());
  allocator.set_memory_limit(123 * MiB);
  EXPECT_EQ(allocator.memory_limit(), 123 * MiB);
  allocator.set_memory_limit(0);
  EXPECT_EQ(allocator.memory_limit(), allocator.capacity());
  EXPECT_EQ(CachingAllocator(0, 5 * MiB).memory_limit(), 5 * MiB);
}

TEST(CachingAllocator, OverLimitThrowsOutOfMemoryAndChangesNothing) {
  CachingAllocator allocator(3, 8 * MiB);
  // 20 MiB would break the limit, so the 4 MiB request gets a 4 MiB segment.
  const Allocation a = allocator.allocate(4 * MiB);
  const MemoryStats before = allocator.stats();
  ASSERT_EQ(before.reserved_bytes.current, static_cast<int64_t>(4 * MiB));

  try {
    allocator.allocate(6 * MiB);
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& error) {
    EXPECT_EQ(error.device, 3);
    EXPECT_EQ(error.requested, 6 * MiB);
    EXPECT_EQ(error.allocated, 4 * MiB);
    EXPECT_EQ(error.reserved, 4 * MiB);
    EXPECT_EQ(error.limit, 8 * MiB);
    EXPECT_STREQ(error.what(),
                 "ember:3 out of memory: tried to allocate 6.00 MiB; "
                 "4.00 MiB allocated, 4.00 MiB reserved, limit 8.00 MiB");
  }

  const MemoryStats after = allocator.stats();
  EXPECT_EQ(after.num_ooms, 1);
  EXPECT_EQ(after.num_alloc_retries, 0);  // nothing cached to flush
  EXPECT_EQ(after.allocated_bytes.allocated, before.allocated_bytes.allocated);
  EXPECT_EQ(after.allocated_bytes.current, before.allocated_bytes.current);
  EXPECT_EQ(after.reserved_bytes.current, before.reserved_bytes.current);
  EXPECT_EQ(after.reserved_bytes.peak, before.reserved_bytes.peak);
  EXPECT_EQ(after.requested_bytes.allocated, before.requested_bytes.allocated);
  EXPECT_EQ(after.allocation.allocated, before.allocation.allocated);
  EXPECT_EQ(after.segment.allocated, before.segment.allocated);
  EXPECT_EQ(after.inactive_split.current, before.inactive_split.current);
  EXPECT_EQ(after.num_device_alloc, before.num_device_alloc);
  EXPECT_EQ(after.num_device_free, before.num_device_free);

  // The allocator still works within the limit after the failure.
  const Allocation b = allocator.allocate(3 * MiB);
  EXPECT_EQ(allocator.stats().reserved_bytes.current,
            static_cast<int64_t>(8 * MiB));
  allocator.free(a.block);
  allocator.free(b.block);
}

TEST(CachingAllocator, OutOfMemoryMessageUsesHumanReadableSizes) {
  const OutOfMemory error(0, std::size_t{1} << 30, 512 * MiB, 514 * MiB,
                          std::size_t{1} << 30);
  EXPECT_STREQ(error.what(),
               "ember:0 out of memory: tried to allocate 1.00 GiB; 512.00 MiB "
               "allocated, 514.00 MiB reserved, limit 1.00 GiB");
  const OutOfMemory tiny(1, 100, 0, 1536, 2 * MiB);
  EXPECT_STREQ(tiny.what(),
               "ember:1 out of memory: tried to allocate 100 bytes; 0 bytes "
               "allocated, 1.50 KiB reserved, limit 2.00 MiB");
}

TEST(CachingAllocator, LimitFlushesCachedSegmentsBeforeFailing) {
  CachingAllocator allocator(0, 8 * MiB);
  const Allocation cached = allocator.allocate(4 * MiB);
  allocator.free(cached.block);  // 4 MiB segment, fully free, still reserved
  ASSERT_EQ(allocator.stats().reserved_bytes.current,
            static_cast<int64_t>(4 * MiB));

  // 4 cached + 6 new > 8: the cache is flushed and the retry fits.
  const Allocation a = allocator.allocate(6 * MiB);
  MemoryStats stats = allocator.stats();
  EXPECT_EQ(stats.num_alloc_retries, 1);
  EXPECT_EQ(stats.num_ooms, 0);
  EXPECT_EQ(stats.num_device_free, 1);
  EXPECT_EQ(stats.reserved_bytes.current, static_cast<int64_t>(6 * MiB));
  EXPECT_EQ(stats.allocated_bytes.current, static_cast<int64_t>(6 * MiB));
  allocator.free(a.block);
}

TEST(CachingAllocator, HopelessRequestKeepsTheCache) {
  CachingAllocator allocator(0, 8 * MiB);
  const Allocation cached = allocator.allocate(4 * MiB);
  allocator.free(cached.block);
  // Even an empty cache could not make room for 9 MiB: fail without flushing.
  EXPECT_THROW(allocator.allocate(9 * MiB), OutOfMemory);
  const MemoryStats stats = allocator.stats();
  EXPECT_EQ(stats.num_ooms, 1);
  EXPECT_EQ(stats.num_alloc_retries, 0);
  EXPECT_EQ(stats.reserved_bytes.current, static_cast<int64_t>(4 * MiB));
  EXPECT_EQ(stats.num_device_free, 0);
  // The cached segment still serves requests without a new mapping.
  const Allocation again = allocator.allocate(4 * MiB);
  EXPECT_EQ(again.ptr, cached.ptr);
  EXPECT_EQ(allocator.stats().num_device_alloc, 1);
  allocator.free(again.block);
}

TEST(CachingAllocator, AbsurdRequestIsOutOfMemory) {
  CachingAllocator allocator(0);
  EXPECT_THROW(allocator.allocate(std::numeric_limits<std::size_t>::max()),
               OutOfMemory);
  EXPECT_THROW(allocator.allocate(allocator.capacity() + 1), OutOfMemory);
  const MemoryStats stats = allocator.stats();
  EXPECT_EQ(stats.num_ooms, 2);
  EXPECT_EQ(stats.reserved_bytes.current, 0);
}

TEST(CachingAllocator, ConcurrentAllocFreeNeverOverlaps) {
  CachingAllocator allocator(0);
  constexpr int kThreads = 8;
  constexpr int kIterations = 1500;
  constexpr std::size_t kMaxLive = 12;
  std::atomic<int> corrupted{0};

  auto worker = [&](int thread_index) {
    std::mt19937 rng(1234 + thread_index);
    std::uniform_int_distribution<std::size_t> small_size(1, 64 * KiB);
    std::uniform_int_distribution<std::size_t> large_size(64 * KiB, 3 * MiB);
    struct Live {
      Allocation allocation;
      std::size_t size;
      unsigned char tag;
    };
    std::vector<Live> live;
    auto release = [&](std::size_t index) {
      const Live& entry = live[index];
      const auto* p = static_cast<const unsigned char*>(entry.allocation.ptr);
      if (std::any_of(p, p + entry.size,
                      [&](unsigned char c) { return c != entry.tag; })) {
        ++corrupted;
      }
      allocator.free(entry.allocation.block);
      live[index] = live.back();
      live.pop_back();
    };
    for (int i = 0; i < kIterations; ++i) {
      if (live.size() == kMaxLive || (!live.empty() && rng() % 3 == 0)) {
        release(rng() % live.size());
        continue;
      }
      const std::size_t size =
          rng() % 5 == 0 ? large_size(rng) : small_size(rng);
      // Tags vary from block to block, so an overlap shows as a wrong tag.
      const auto tag = static_cast<unsigned char>(thread_index * 31 + i);
      const Allocation allocation = allocator.allocate(size);
      std::memset(allocation.ptr, tag, size);
      live.push_back({allocation, size, tag});
    }
    while (!live.empty()) release(live.size() - 1);
  };

  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (std::thread& thread : threads) thread.join();

  EXPECT_EQ(corrupted.load(), 0);
  MemoryStats stats = allocator.stats();
  EXPECT_EQ(stats.allocated_bytes.current, 0);
  EXPECT_EQ(stats.requested_bytes.current, 0);
  EXPECT_EQ(stats.allocation.current, 0);
  EXPECT_EQ(stats.active_bytes.current, 0);
  EXPECT_EQ(stats.inactive_split.current, 0);  // everything coalesced back
  EXPECT_GT(stats.allocation.allocated, kThreads * kIterations / 2);
  allocator.empty_cache();
  stats = allocator.stats();
  EXPECT_EQ(stats.reserved_bytes.current, 0);
  EXPECT_EQ(stats.num_device_free, stats.num_device_alloc);
}

}  // namespace
}  // namespace ember::runtime

#if defined(__SANITIZE_ADDRESS__)
namespace ember::runtime {
namespace {

// make sanitize: ASan sees inside ember memory (caching_allocator.cpp).
void write_byte(void* ptr) { *static_cast<volatile char*>(ptr) = 1; }

TEST(CachingAllocatorAsan, OverrunIntoSlackIsReported) {
  CachingAllocator allocator(0);
  Allocation a = allocator.allocate(100);  // a 512-byte block
  write_byte(bytes(a) + 99);               // the last requested byte: fine
  EXPECT_DEATH(write_byte(bytes(a) + 100), "use-after-poison");
  EXPECT_DEATH(write_byte(bytes(a) + 100 + 64), "use-after-poison");
  allocator.free(a.block);
}

TEST(CachingAllocatorAsan, UseAfterFreeIsReported) {
  CachingAllocator allocator(0);
  Allocation a = allocator.allocate(4096);
  allocator.free(a.block);
  EXPECT_DEATH(write_byte(bytes(a)), "use-after-poison");
  Allocation b = allocator.allocate(4096);  // the same block, usable again
  EXPECT_EQ(b.ptr, a.ptr);
  write_byte(bytes(b) + 4095);
  allocator.free(b.block);
  allocator.empty_cache();  // unmapped unpoisoned: no stale poison left behind
}

}  // namespace
}  // namespace ember::runtime
#endif
