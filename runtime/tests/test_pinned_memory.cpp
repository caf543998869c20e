// Pinned host memory: locked mappings, found by address, freed exactly once.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstring>
#include <stdexcept>

#include "ember/runtime/pinned_memory.h"

namespace ember::runtime {
namespace {

TEST(PinnedMemory, AllocationsArePinnedAndLockedWithinTheLimit) {
  const PinnedStats before = pinned_stats();
  void* p = pinned_allocate(10000);
  ASSERT_NE(p, nullptr);
  char* bytes = static_cast<char*>(p);
  std::memset(bytes, 7, 10000);
  EXPECT_TRUE(is_pinned(p));
  EXPECT_TRUE(is_pinned(bytes + 9999));
  EXPECT_FALSE(is_pinned(bytes - 1));
  const PinnedStats during = pinned_stats();
  EXPECT_EQ(during.allocations, before.allocations + 1);
  EXPECT_GE(during.bytes - before.bytes, 10000);
  rlimit limit{};
  getrlimit(RLIMIT_MEMLOCK, &limit);
  if (limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= 1 << 20) {
    EXPECT_EQ(during.locked_bytes - before.locked_bytes,
              during.bytes - before.bytes);  // 12 KiB fit any usual limit
  }
  pinned_free(p);
  EXPECT_FALSE(is_pinned(p));
  EXPECT_EQ(pinned_stats().allocations, before.allocations);
  EXPECT_EQ(pinned_stats().bytes, before.bytes);
}

TEST(PinnedMemory, OrdinaryMemoryIsNotPinned) {
  int on_stack = 0;
  auto heap = std::make_unique<char[]>(64);
  EXPECT_FALSE(is_pinned(&on_stack));
  EXPECT_FALSE(is_pinned(heap.get()));
  EXPECT_FALSE(is_pinned(nullptr));
  EXPECT_EQ(pinned_allocate(0), nullptr);
}

TEST(PinnedMemory, FreeingForeignOrFreedMemoryThrows) {
  int on_stack = 0;
  EXPECT_THROW(pinned_free(&on_stack), std::invalid_argument);
  void* p = pinned_allocate(100);
  pinned_free(p);
  EXPECT_THROW(pinned_free(p), std::invalid_argument);
  EXPECT_NO_THROW(pinned_free(nullptr));
}

TEST(PinnedMemory, BeyondTheLockLimitMemoryIsStillPinnedButNotLocked) {
  rlimit saved{};
  getrlimit(RLIMIT_MEMLOCK, &saved);
  rlimit low = saved;
  low.rlim_cur = 64 << 10;  // lowering the soft limit is always allowed
  ASSERT_EQ(setrlimit(RLIMIT_MEMLOCK, &low), 0);
  const PinnedStats before = pinned_stats();
  void* p = pinned_allocate(1 << 20);
  const PinnedStats during = pinned_stats();
  const bool pinned = is_pinned(p);
  pinned_free(p);
  setrlimit(RLIMIT_MEMLOCK, &saved);
  if (during.lock_failures == before.lock_failures) {
    GTEST_SKIP() << "this process may lock past RLIMIT_MEMLOCK (CAP_IPC_LOCK)";
  }
  EXPECT_TRUE(pinned);
  EXPECT_EQ(during.lock_failures, before.lock_failures + 1);
  EXPECT_EQ(during.locked_bytes, before.locked_bytes);
  EXPECT_EQ(during.bytes, before.bytes + (1 << 20));
}

}  // namespace
}  // namespace ember::runtime
