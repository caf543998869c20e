// Where the caching allocator's segments come from: shared memory files
// (memfd_create + mmap MAP_SHARED), so a block can be mapped by another
// process without a copy (torch.multiprocessing, DataLoader workers), or
// anonymous private memory where no memory file can be had.
#pragma once

#include <cstddef>

namespace ember::runtime {

struct SegmentMemory {
  void* base = nullptr;  // nullptr: the OS refused
  int fd = -1;           // the segment's memory file; -1: anonymous private
};

// Maps `size` bytes, read-write. With `shared`, from a new memory file
// (close-on-exec, so exec'd programs do not inherit it), else (or when the
// file cannot be made: no memfd_create, out of file descriptors, or segment
// files already hold half of RLIMIT_NOFILE) anonymous private memory.
SegmentMemory map_segment_memory(std::size_t size, bool shared);
// Maps `size` bytes (a multiple of 2 MiB), read-write, of anonymous private
// memory aligned to 2 MiB and advised to the kernel as huge-page memory
// (MADV_HUGEPAGE): one TLB entry covers 2 MiB, so a buffer read start to end
// on every use streams faster (transparent huge pages only exist for
// anonymous memory here; memory files would need hugetlbfs reservations).
// Where THP is off the advice is ignored and the pages are 4 KiB ones.
SegmentMemory map_huge_page_memory(std::size_t size);
// Unmaps a segment from map_segment_memory or map_huge_page_memory and
// closes its file.
void unmap_segment_memory(const SegmentMemory& memory, std::size_t size);
// In a forked child: turns the inherited shared mapping into a private
// mapping of the same file at the same address, so the child's writes stay
// in the child (as fork's copy-on-write would), and closes the child's copy
// of the file. Async-signal-safe (mmap, close). Returns false if mmap
// failed (the mapping is then still shared).
bool make_private_in_child(const SegmentMemory& memory, std::size_t size);

}  // namespace ember::runtime
