// Pinned host memory: one locked mapping per allocation, found again by
// address for is_pinned() (a map ordered by base, behind a shared lock:
// is_pinned runs on every pin_memory()/is_pinned() call and every copy).
#include "ember/runtime/pinned_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <iterator>
#include <map>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <stdexcept>

namespace ember::runtime {
namespace {

struct Mapping {
  std::size_t size;
  bool locked;
};

struct Registry {
  std::shared_mutex mutex;
  std::map<std::uintptr_t, Mapping> mappings;  // by base address
  PinnedStats stats;
};

// Never destroyed: pinned tensors may be freed during static destruction.
Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

std::size_t page_size() {
  static const std::size_t size = [] {
    const long page = sysconf(_SC_PAGESIZE);
    return page > 0 ? static_cast<std::size_t>(page) : std::size_t{4096};
  }();
  return size;
}

}  // namespace

void* pinned_allocate(std::size_t nbytes) {
  if (nbytes == 0) return nullptr;
  const std::size_t page = page_size();
  const std::size_t size = (nbytes + page - 1) / page * page;
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) throw std::bad_alloc();
  const bool locked = mlock(base, size) == 0;
  Registry& r = registry();
  std::unique_lock<std::shared_mutex> lock(r.mutex);
  try {
    r.mappings.emplace(reinterpret_cast<std::uintptr_t>(base),
                       Mapping{size, locked});
  } catch (...) {
    lock.unlock();
    munmap(base, size);
    throw;
  }
  ++r.stats.allocations;
  r.stats.bytes += static_cast<int64_t>(size);
  if (locked) {
    r.stats.locked_bytes += static_cast<int64_t>(size);
  } else {
    ++r.stats.lock_failures;
  }
  return base;
}

void pinned_free(void* ptr) {
  if (ptr == nullptr) return;
  Registry& r = registry();
  Mapping mapping{};
  {
    std::unique_lock<std::shared_mutex> lock(r.mutex);
    const auto it = r.mappings.find(reinterpret_cast<std::uintptr_t>(ptr));
    if (it == r.mappings.end()) {
      throw std::invalid_argument(
          "ember: pinned_free() of a pointer that is not pinned memory");
    }
    mapping = it->second;
    r.mappings.erase(it);
    --r.stats.allocations;
    r.stats.bytes -= static_cast<int64_t>(mapping.size);
    if (mapping.locked)
      r.stats.locked_bytes -= static_cast<int64_t>(mapping.size);
  }
  munmap(ptr, mapping.size);  // also unlocks
}

bool is_pinned(const void* ptr) {
  Registry& r = registry();
  const auto address = reinterpret_cast<std::uintptr_t>(ptr);
  std::shared_lock<std::shared_mutex> lock(r.mutex);
  auto it = r.mappings.upper_bound(address);
  if (it == r.mappings.begin()) return false;
  it = std::prev(it);
  return address < it->first + it->second.size;
}

void pinned_lock_for_fork() {
  (void)page_size();  // a static: initialised before the fork, not during
  registry().mutex.lock();
}

void pinned_unlock_after_fork() { registry().mutex.unlock(); }

PinnedStats pinned_stats() {
  Registry& r = registry();
  std::shared_lock<std::shared_mutex> lock(r.mutex);
  return r.stats;
}

}  // namespace ember::runtime
