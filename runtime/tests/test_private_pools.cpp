// Private pools of the caching allocator (torch.ember.MemPool): routed
// allocations come from the pool's own segments, frees go back to the pool,
// and empty_cache() returns a pool's memory only once nobody holds it.
#include <gtest/gtest.h>

#include <stdexcept>
#include <thread>
#include <vector>

#include "ember/runtime/caching_allocator.h"

namespace ember::runtime {
namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

// The pool of the segment holding `ptr` in `allocator`'s snapshot.
PoolId pool_of(const CachingAllocator& allocator, const void* ptr) {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  for (const SegmentSnapshot& segment : allocator.snapshot()) {
    if (address - segment.address < segment.size) return segment.pool;
  }
  ADD_FAILURE() << "pointer in no segment";
  return kDefaultPool;
}

std::size_t segments_of(const CachingAllocator& allocator, PoolId pool) {
  std::size_t count = 0;
  for (const SegmentSnapshot& segment : allocator.snapshot()) {
    count += segment.pool == pool;
  }
  return count;
}

TEST(PrivatePools, RoutedAllocationsUseThePoolsOwnSegments) {
  CachingAllocator allocator(0);
  const Allocation outside = allocator.allocate(4 * KiB);
  allocator.create_pool(7);
  allocator.begin_allocate_to_pool(7);
  const Allocation small = allocator.allocate(4 * KiB);
  const Allocation large = allocator.allocate(3 * MiB);
  allocator.end_allocate_to_pool(7);
  const Allocation after = allocator.allocate(4 * KiB);

  EXPECT_EQ(pool_of(allocator, outside.ptr), kDefaultPool);
  EXPECT_EQ(pool_of(allocator, small.ptr), 7u);
  EXPECT_EQ(pool_of(allocator, large.ptr), 7u);
  // The default pool's segment had room, yet the pool got its own.
  EXPECT_EQ(pool_of(allocator, after.ptr), kDefaultPool);
  EXPECT_EQ(segments_of(allocator, 7), 2u);
  // Statistics stay per device: pool blocks count like any other.
  EXPECT_EQ(allocator.stats().allocation.current, 4);
  for (const Allocation& a : {outside, small, large, after}) {
    allocator.free(a.block);
  }
  allocator.release_pool(7);
}

TEST(PrivatePools, FreedBlocksGoBackToThePoolNotTheDefaultCache) {
  CachingAllocator allocator(0);
  allocator.create_pool(1);
  allocator.begin_allocate_to_pool(1);
  const Allocation first = allocator.allocate(64 * KiB);
  allocator.end_allocate_to_pool(1);
  allocator.free(first.block);  // freed outside the route: still the pool's
  // The default pool does not see the pool's free block...
  const Allocation outside = allocator.allocate(64 * KiB);
  EXPECT_EQ(pool_of(allocator, outside.ptr), kDefaultPool);
  // ...and the pool reuses it.
  allocator.begin_allocate_to_pool(1);
  const Allocation again = allocator.allocate(64 * KiB);
  allocator.end_allocate_to_pool(1);
  EXPECT_EQ(again.ptr, first.ptr);
  allocator.free(again.block);
  allocator.free(outside.block);
  allocator.release_pool(1);
}

TEST(PrivatePools, UseCountsFollowCudasRules) {
  CachingAllocator allocator(0);
  EXPECT_EQ(allocator.pool_use_count(3), 0);
  allocator.create_pool(3);
  EXPECT_EQ(allocator.pool_use_count(3), 1);
  allocator.begin_allocate_to_pool(3);
  EXPECT_EQ(allocator.pool_use_count(3), 2);
  allocator.end_allocate_to_pool(3);
  EXPECT_EQ(allocator.pool_use_count(3), 1);
  allocator.release_pool(3);
  EXPECT_EQ(allocator.pool_use_count(3), 0);
  EXPECT_THROW(allocator.release_pool(3), std::invalid_argument);
  EXPECT_THROW(allocator.end_allocate_to_pool(3), std::invalid_argument);
  EXPECT_THROW(allocator.create_pool(kDefaultPool), std::invalid_argument);
}

TEST(PrivatePools, EmptyCacheKeepsALivePoolsMemoryUntilItIsReleased) {
  CachingAllocator allocator(0);
  allocator.create_pool(2);
  allocator.begin_allocate_to_pool(2);
  const Allocation a = allocator.allocate(5 * MiB);
  allocator.end_allocate_to_pool(2);
  const std::int64_t reserved = allocator.stats().reserved_bytes.current;
  allocator.free(a.block);
  allocator.empty_cache();  // the pool is held: its cache stays
  EXPECT_EQ(allocator.stats().reserved_bytes.current, reserved);
  allocator.release_pool(2);  // nobody holds it now
  allocator.empty_cache();
  EXPECT_EQ(allocator.stats().reserved_bytes.current, 0);
  EXPECT_EQ(segments_of(allocator, 2), 0u);
}

TEST(PrivatePools, AReleasedPoolsBlocksReturnOnceFreed) {
  CachingAllocator allocator(0);
  allocator.create_pool(4);
  allocator.begin_allocate_to_pool(4);
  const Allocation a = allocator.allocate(1 * MiB);
  allocator.end_allocate_to_pool(4);
  allocator.release_pool(4);
  allocator.empty_cache();  // the block is still in use
  EXPECT_EQ(segments_of(allocator, 4), 1u);
  allocator.free(a.block);
  allocator.empty_cache();
  EXPECT_EQ(segments_of(allocator, 4), 0u);
  EXPECT_EQ(allocator.stats().reserved_bytes.current, 0);
}

TEST(PrivatePools, EmptyCacheOfOnePoolReturnsOnlyItsFreeSegments) {
  CachingAllocator allocator(0);
  allocator.free(allocator.allocate(4 * KiB).block);  // default cache
  allocator.create_pool(5);
  allocator.begin_allocate_to_pool(5);
  allocator.free(allocator.allocate(4 * KiB).block);
  allocator.end_allocate_to_pool(5);
  allocator.empty_cache(5);
  EXPECT_EQ(segments_of(allocator, 5), 0u);
  EXPECT_EQ(segments_of(allocator, kDefaultPool), 1u);
  EXPECT_EQ(allocator.pool_use_count(5), 1);  // still held
  allocator.release_pool(5);
}

TEST(PrivatePools, RoutesArePerThreadAndTheFirstBegunServes) {
  CachingAllocator allocator(0);
  allocator.create_pool(8);
  allocator.create_pool(9);
  allocator.begin_allocate_to_pool(8);
  Allocation from_other_thread;
  std::thread([&] { from_other_thread = allocator.allocate(4 * KiB); }).join();
  const Allocation outer = allocator.allocate(4 * KiB);
  allocator.begin_allocate_to_pool(9);
  const Allocation inner = allocator.allocate(4 * KiB);
  allocator.end_allocate_to_pool(9);
  const Allocation outer_again = allocator.allocate(4 * KiB);
  allocator.end_allocate_to_pool(8);

  EXPECT_EQ(pool_of(allocator, from_other_thread.ptr), kDefaultPool);
  EXPECT_EQ(pool_of(allocator, outer.ptr), 8u);
  EXPECT_EQ(pool_of(allocator, inner.ptr), 8u);  // CUDA: the outer route
  EXPECT_EQ(pool_of(allocator, outer_again.ptr), 8u);
  for (const Allocation& a : {from_other_thread, outer, inner, outer_again}) {
    allocator.free(a.block);
  }
  allocator.release_pool(8);
  allocator.release_pool(9);
}

TEST(PrivatePools, ARouteOnOneAllocatorLeavesAnotherAlone) {
  CachingAllocator first(0);
  CachingAllocator second(1);
  first.begin_allocate_to_pool(6);  // creates the pool, as CUDA does
  EXPECT_EQ(first.pool_use_count(6), 1);
  const Allocation a = second.allocate(4 * KiB);
  EXPECT_EQ(pool_of(second, a.ptr), kDefaultPool);
  second.free(a.block);
  first.end_allocate_to_pool(6);
  EXPECT_EQ(first.pool_use_count(6), 0);
}

TEST(PrivatePools, TheLimitFlushesTheDefaultCacheForAPoolRequest) {
  CachingAllocator allocator(0, 20 * MiB);
  allocator.free(allocator.allocate(12 * MiB).block);  // 12 MiB cached
  allocator.create_pool(10);
  allocator.begin_allocate_to_pool(10);
  const Allocation a = allocator.allocate(12 * MiB);  // needs the flush
  allocator.end_allocate_to_pool(10);
  EXPECT_EQ(pool_of(allocator, a.ptr), 10u);
  EXPECT_EQ(allocator.stats().num_alloc_retries, 1);
  allocator.free(a.block);
  allocator.release_pool(10);
}

}  // namespace
}  // namespace ember::runtime
