// allocate_huge_pages(): blocks for buffers streamed whole on every use
// (packed weights) come from segments of their own, aligned to 2 MiB and
// advised as huge-page memory, never shared and never handed to ordinary
// requests; they count in the statistics and empty_cache() returns them.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "ember/runtime/caching_allocator.h"

namespace ember::runtime {
namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

// The kernel's THP mode ("always", "madvise" or "never"), "" if unknown.
std::string transparent_huge_page_mode() {
  std::ifstream file("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  std::getline(file, line);
  const auto open = line.find('['), close = line.find(']');
  if (open == std::string::npos || close == std::string::npos) return "";
  return line.substr(open + 1, close - open - 1);
}

// The "THPeligible" value of the mapping that holds `ptr` in
// /proc/self/smaps (1: the kernel may back it with huge pages), -1 if the
// mapping or the field is not found.
int huge_page_eligible(const void* ptr) {
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    std::uintptr_t start = 0, end = 0;
    char dash = 0;
    std::istringstream range(line);
    if (range >> std::hex >> start >> dash >> end && dash == '-') {
      inside = start <= address && address < end;
      continue;
    }
    if (inside && line.rfind("THPeligible:", 0) == 0) {
      return std::stoi(line.substr(std::strlen("THPeligible:")));
    }
  }
  return -1;
}

TEST(HugePages, LargeBlocksAreAlignedPrivateAndCounted) {
  CachingAllocator allocator(0);
  const Allocation a = allocator.allocate_huge_pages(12 * MiB);
  ASSERT_NE(a.ptr, nullptr);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a.ptr) % (2 * MiB), 0u);
  EXPECT_EQ(allocator.shared_span(a.ptr).fd, -1);  // never shared
  // Not an ordinary segment that failed to be shared.
  EXPECT_EQ(allocator.stats().num_unshareable_segments, 0);
  EXPECT_EQ(allocator.stats().allocated_bytes.current,
            static_cast<int64_t>(12 * MiB));
  EXPECT_EQ(allocator.stats().reserved_bytes.current,
            static_cast<int64_t>(12 * MiB));
  std::memset(a.ptr, 1, 12 * MiB);  // the whole block is usable memory
  allocator.free(a.block);
  allocator.empty_cache();
  EXPECT_EQ(allocator.stats().reserved_bytes.current, 0);
}

TEST(HugePages, AdvisedAsHugePageMemoryWhereTheKernelHasThem) {
  const std::string mode = transparent_huge_page_mode();
  if (mode != "always" && mode != "madvise") {
    GTEST_SKIP() << "transparent huge pages are '" << mode << "' here";
  }
  CachingAllocator allocator(0);
  const Allocation huge = allocator.allocate_huge_pages(4 * MiB);
  EXPECT_EQ(huge_page_eligible(huge.ptr), 1);
  if (mode == "madvise") {
    // Ordinary segments (shared memory files) are not advised: only the
    // huge-page ones are eligible.
    const Allocation plain = allocator.allocate(4 * MiB);
    EXPECT_EQ(huge_page_eligible(plain.ptr), 0);
    allocator.free(plain.block);
  }
  allocator.free(huge.block);
}

TEST(HugePages, OrdinaryRequestsNeverGetTheirBlocks) {
  CachingAllocator allocator(0);
  const Allocation huge = allocator.allocate_huge_pages(4 * MiB);
  void* huge_ptr = huge.ptr;
  allocator.free(huge.block);
  // The huge-page segment is free and big enough, yet an ordinary request
  // maps a shareable segment of its own.
  const Allocation plain = allocator.allocate(4 * MiB);
  EXPECT_NE(plain.ptr, huge_ptr);
  EXPECT_GE(allocator.shared_span(plain.ptr).fd, 0);
  // And the free huge-page block serves the next huge-page request.
  const Allocation again = allocator.allocate_huge_pages(4 * MiB);
  EXPECT_EQ(again.ptr, huge_ptr);
  allocator.free(plain.block);
  allocator.free(again.block);
}

TEST(HugePages, SmallRequestsAreOrdinaryBlocks) {
  // Below the small-block size a huge page would mostly hold other blocks:
  // such requests are served as allocate() serves them.
  CachingAllocator allocator(0);
  const Allocation small = allocator.allocate_huge_pages(64 * KiB);
  EXPECT_GE(allocator.shared_span(small.ptr).fd, 0);
  allocator.free(small.block);
}

TEST(HugePages, ThePrivatePoolRouteDoesNotCapture) {
  // A thread routed to a private pool (a MemPool, a graph capture) still
  // gets huge-page blocks: their lifetime is the buffer's owner's, not the
  // pool's.
  CachingAllocator allocator(0);
  constexpr PoolId kPool = 7;
  allocator.create_pool(kPool);
  allocator.begin_allocate_to_pool(kPool);
  const Allocation huge = allocator.allocate_huge_pages(4 * MiB);
  allocator.end_allocate_to_pool(kPool);
  int found = 0;
  for (const SegmentSnapshot& segment : allocator.snapshot()) {
    if (segment.address == reinterpret_cast<std::uintptr_t>(huge.ptr)) {
      EXPECT_EQ(segment.pool, kDefaultPool);
      ++found;
    }
  }
  EXPECT_EQ(found, 1);
  allocator.release_pool(kPool);
  allocator.free(huge.block);
  allocator.empty_cache();
  EXPECT_EQ(allocator.stats().reserved_bytes.current, 0);
}

}  // namespace
}  // namespace ember::runtime
