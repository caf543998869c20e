#include "ops/LaunchStats.h"

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "core/ForkSafety.h"

namespace ember {
namespace {

struct Counters {
  std::atomic<int64_t> launched{0};
  std::atomic<int64_t> waited{0};
};

// Entries are never erased (a reset zeroes them), so a Counters pointer
// stays valid for the process's life.
ForkHeldMutex stats_mutex;
std::unordered_map<std::string, Counters>& stats() {
  static auto* counts = new std::unordered_map<std::string, Counters>();
  return *counts;
}

Counters& counters(const std::string& op) {
  std::lock_guard<std::mutex> lock(stats_mutex);
  return stats()[op];
}

// A launch counts on every launched op: a per-thread cache keyed by the
// name's address (op names are static strings) skips the lock and the
// string hash. The name is compared too, so a caller's temporary string
// that reuses an address still counts under its own name.
struct CachedCounter {
  const std::string* key = nullptr;
  std::string name;
  Counters* counters = nullptr;
};

Counters& launch_counters(const std::string& op) {
  constexpr std::size_t kSlots = 32;
  thread_local CachedCounter cache[kSlots];
  CachedCounter& slot =
      cache[(reinterpret_cast<std::uintptr_t>(&op) >> 4) % kSlots];
  if (slot.key != &op || slot.name != op) {
    slot.counters = &counters(op);
    slot.key = &op;
    slot.name = op;
  }
  return *slot.counters;
}

}  // namespace

void count_launch(const std::string& op) {
  launch_counters(op).launched.fetch_add(1, std::memory_order_relaxed);
}

void count_wait(const char* op) {
  counters(op != nullptr ? op : "(unnamed work)")
      .waited.fetch_add(1, std::memory_order_relaxed);
}

std::map<std::string, LaunchCounts> launch_stats() {
  std::lock_guard<std::mutex> lock(stats_mutex);
  std::map<std::string, LaunchCounts> listed;
  for (const auto& [op, c] : stats()) {
    const LaunchCounts counts{c.launched.load(std::memory_order_relaxed),
                              c.waited.load(std::memory_order_relaxed)};
    if (counts.launched != 0 || counts.waited != 0) listed.emplace(op, counts);
  }
  return listed;
}

void reset_launch_stats() {
  std::lock_guard<std::mutex> lock(stats_mutex);
  for (auto& [op, c] : stats()) {
    c.launched.store(0, std::memory_order_relaxed);
    c.waited.store(0, std::memory_order_relaxed);
  }
}

}  // namespace ember
