// Segment memory: see segment_memory.h.
#include "segment_memory.h"

#include <sys/mman.h>
#include <unistd.h>

namespace ember::runtime {

SegmentMemory map_segment_memory(std::size_t size, bool shared) {
  if (shared) {
    const int fd = memfd_create("ember-segment", MFD_CLOEXEC);
    if (fd >= 0) {
      if (ftruncate(fd, static_cast<off_t>(size)) == 0) {
        void* base =
            mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (base != MAP_FAILED) return {base, fd};
      }
      close(fd);
    }
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return {base == MAP_FAILED ? nullptr : base, -1};
}

void unmap_segment_memory(const SegmentMemory& memory, std::size_t size) {
  munmap(memory.base, size);
  if (memory.fd >= 0) close(memory.fd);
}

bool make_private_in_child(const SegmentMemory& memory, std::size_t size) {
  if (memory.fd < 0) return true;
  const bool ok = mmap(memory.base, size, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_FIXED, memory.fd, 0) != MAP_FAILED;
  close(memory.fd);
  return ok;
}

}  // namespace ember::runtime
