// Segments as memory files (zero-copy sharing across processes): a block's
// bytes can be mapped again from shared_span()'s file, writes through either
// mapping are seen by both; a forked child's writes stay in the child.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "ember/runtime/caching_allocator.h"
#include "ember/runtime/device.h"

namespace ember::runtime {
namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * KiB;

// Maps `span`'s file whole and returns the block's address in the mapping.
char* map_again(const SharedSpan& span, void** mapping) {
  *mapping = mmap(nullptr, span.segment_size, PROT_READ | PROT_WRITE,
                  MAP_SHARED, span.fd, 0);
  EXPECT_NE(*mapping, MAP_FAILED);
  return static_cast<char*>(*mapping) + span.offset;
}

TEST(SharedSegments, ABlocksBytesAreSharedThroughItsSegmentFile) {
  CachingAllocator allocator(0);
  EXPECT_TRUE(allocator.shared_segments());
  allocator.free(allocator.allocate(4 * KiB).block);  // offset != 0 next
  const Allocation first = allocator.allocate(4 * KiB);
  const Allocation a = allocator.allocate(64 * KiB);
  const SharedSpan span = allocator.shared_span(a.ptr);
  ASSERT_GE(span.fd, 0);
  EXPECT_EQ(span.segment_size, 2 * MiB);
  // Both blocks are in one 2 MiB segment; `first` is at its base.
  EXPECT_EQ(span.offset,
            static_cast<std::size_t>(static_cast<char*>(a.ptr) -
                                     static_cast<char*>(first.ptr)));
  void* mapping = nullptr;
  char* other = map_again(span, &mapping);
  std::memset(a.ptr, 7, 64 * KiB);
  EXPECT_EQ(other[100], 7);
  other[200] = 9;  // the other way round
  EXPECT_EQ(static_cast<char*>(a.ptr)[200], 9);
  munmap(mapping, span.segment_size);
  close(span.fd);
  EXPECT_EQ(allocator.stats().num_unshareable_segments, 0);
  allocator.free(a.block);
  allocator.free(first.block);
}

TEST(SharedSegments, NotSharedWhenTurnedOffOrForeign) {
  CachingAllocator allocator(0);
  allocator.set_shared_segments(false);
  const Allocation a = allocator.allocate(4 * KiB);
  EXPECT_EQ(allocator.shared_span(a.ptr).fd, -1);
  EXPECT_EQ(allocator.stats().num_unshareable_segments, 1);
  int local = 0;
  EXPECT_EQ(allocator.shared_span(&local).fd, -1);
  allocator.free(a.block);
  allocator.empty_cache();  // the anonymous segment unmaps as before
  EXPECT_EQ(allocator.stats().reserved_bytes.current, 0);
}

TEST(SharedSegments, SegmentFilesTakeAtMostHalfTheDescriptorLimit) {
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  // Count the descriptors open now; allow segment files half of a limit a
  // little above them.
  long open_now = 0;
  for (int fd = 0; fd < 4096; ++fd) open_now += fcntl(fd, F_GETFD) != -1;
  rlimit tight = saved;
  tight.rlim_cur = static_cast<rlim_t>(2 * (open_now + 8));
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &tight), 0);
  CachingAllocator allocator(0);
  std::vector<Allocation> blocks;
  for (int i = 0; i < static_cast<int>(tight.rlim_cur); ++i) {
    blocks.push_back(allocator.allocate(12 * MiB));  // a segment each
  }
  EXPECT_GT(allocator.stats().num_unshareable_segments, 0);
  EXPECT_LT(allocator.stats().num_unshareable_segments,
            static_cast<int64_t>(blocks.size()));
  // Descriptors are left for the program.
  const int fd = dup(0);
  EXPECT_GE(fd, 0);
  if (fd >= 0) close(fd);
  for (const Allocation& a : blocks) allocator.free(a.block);
  allocator.empty_cache();
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
}

TEST(SharedSegments, AForkedChildsWritesStayInTheChild) {
  CachingAllocator& allocator = device(0).allocator();
  const Allocation a = allocator.allocate(64 * KiB);
  std::memset(a.ptr, 1, 64 * KiB);
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    char* bytes = static_cast<char*>(a.ptr);
    bool ok = bytes[10] == 1;  // the parent's data
    std::memset(a.ptr, 2, 64 * KiB);
    // The inherited segment is no longer shareable; a new block comes from
    // a fresh segment that is.
    ok = ok && allocator.shared_span(a.ptr).fd == -1;
    const Allocation b = allocator.allocate(64 * KiB);
    const SharedSpan span = allocator.shared_span(b.ptr);
    ok = ok && span.fd >= 0 && span.offset == 0;
    const char result = ok ? 'y' : 'n';
    (void)!write(pipe_fds[1], &result, 1);
    _exit(0);
  }
  char result = 0;
  ASSERT_EQ(read(pipe_fds[0], &result, 1), 1);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_EQ(result, 'y');
  EXPECT_EQ(static_cast<char*>(a.ptr)[10], 1);  // not the child's 2
  close(pipe_fds[0]);
  close(pipe_fds[1]);
  allocator.free(a.block);
}

}  // namespace
}  // namespace ember::runtime
