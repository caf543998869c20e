// Segment memory: see segment_memory.h.
#include "segment_memory.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

namespace ember::runtime {

namespace {

// Segment files open in this process (every device's allocator).
std::atomic<long> open_segment_files{0};

// Segment files may take at most half of the process's descriptor limit,
// so ember never starves the program of descriptors (files, sockets, the
// pipes of DataLoader workers); beyond it, segments are anonymous memory.
// Read at every new segment: the program may raise the limit meanwhile.
bool within_descriptor_budget() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return false;
  if (limit.rlim_cur == RLIM_INFINITY) return true;
  return open_segment_files.load(std::memory_order_relaxed) <
         static_cast<long>(limit.rlim_cur / 2);
}

}  // namespace

SegmentMemory map_segment_memory(std::size_t size, bool shared) {
  if (shared && within_descriptor_budget()) {
    const int fd = memfd_create("ember-segment", MFD_CLOEXEC);
    if (fd >= 0) {
      if (ftruncate(fd, static_cast<off_t>(size)) == 0) {
        void* base =
            mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (base != MAP_FAILED) {
          open_segment_files.fetch_add(1, std::memory_order_relaxed);
          return {base, fd};
        }
      }
      close(fd);
    }
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return {base == MAP_FAILED ? nullptr : base, -1};
}

SegmentMemory map_huge_page_memory(std::size_t size) {
  constexpr std::size_t kHugePage = std::size_t{2} << 20;
  // Over-map by one huge page and trim, so the kept range starts on a huge
  // page boundary (mmap itself only aligns to 4 KiB).
  void* raw = mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return {};
  const auto start = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t aligned = (start + kHugePage - 1) & ~(kHugePage - 1);
  if (aligned > start) munmap(raw, aligned - start);
  const std::uintptr_t tail = start + size + kHugePage - (aligned + size);
  if (tail > 0) munmap(reinterpret_cast<void*>(aligned + size), tail);
  void* base = reinterpret_cast<void*>(aligned);
  (void)madvise(base, size, MADV_HUGEPAGE);  // a hint: failure costs speed
  return {base, -1};
}

void unmap_segment_memory(const SegmentMemory& memory, std::size_t size) {
  munmap(memory.base, size);
  if (memory.fd >= 0) {
    close(memory.fd);
    open_segment_files.fetch_sub(1, std::memory_order_relaxed);
  }
}

bool make_private_in_child(const SegmentMemory& memory, std::size_t size) {
  if (memory.fd < 0) return true;
  const bool ok = mmap(memory.base, size, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_FIXED, memory.fd, 0) != MAP_FAILED;
  close(memory.fd);
  open_segment_files.fetch_sub(1, std::memory_order_relaxed);
  return ok;
}

}  // namespace ember::runtime
