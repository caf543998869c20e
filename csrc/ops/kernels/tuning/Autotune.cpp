#include "ops/kernels/tuning/Autotune.h"

#include <algorithm>
#include <chrono>
#include <list>
#include <mutex>
#include <unordered_map>

#include "core/ForkSafety.h"
#include "flags/BackendFlags.h"

namespace ember::tuning {
namespace {

struct KeyHash {
  size_t operator()(const Key& key) const {
    size_t h = std::hash<const void*>()(key.op());
    for (int64_t v : key.values()) {
      h ^=
          std::hash<int64_t>()(v) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    }
    return h;
  }
};

struct Entry {
  Key key;
  size_t index;
  Choice choice;
};

struct Cache {
  ForkHeldMutex mutex;       // a leaf: candidates are timed outside it
  std::list<Entry> entries;  // insertion order: front is the oldest
  std::unordered_map<Key, std::list<Entry>::iterator, KeyHash> index;
};

Cache& cache() {
  static auto* instance = new Cache();  // never destroyed: held across fork()
  return *instance;
}

double time_us(const std::function<void()>& run) {
  // One warm-up (first-touch, primitive creation), then the best of three:
  // the minimum is the estimate least disturbed by other load.
  run();
  double best = 1e300;
  for (int rep = 0; rep < 3; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    run();
    const auto stop = std::chrono::steady_clock::now();
    best = std::min(
        best, std::chrono::duration<double, std::micro>(stop - start).count());
  }
  return best;
}

}  // namespace

std::optional<size_t> lookup(const Key& key) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  const auto found = c.index.find(key);
  if (found == c.index.end()) return std::nullopt;
  return found->second->index;
}

size_t tune(const Key& key, const std::string& describe,
            const std::vector<Candidate>& candidates) {
  Choice choice{key.op(), describe, "", {}};
  size_t best = 0;
  double best_us = 1e300;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const double us = time_us(candidates[i].run);
    choice.timings_us.emplace_back(candidates[i].name, us);
    if (us < best_us) {
      best_us = us;
      best = i;
    }
  }
  choice.algorithm = candidates[best].name;
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  if (c.index.count(key) == 0) {
    c.entries.push_back(Entry{key, best, std::move(choice)});
    c.index.emplace(key, std::prev(c.entries.end()));
    const int64_t limit = flags::benchmark_limit();
    while (limit > 0 && static_cast<int64_t>(c.entries.size()) > limit) {
      c.index.erase(c.entries.front().key);
      c.entries.pop_front();
    }
  }
  return best;
}

std::vector<Choice> cache_entries() {
  std::lock_guard<std::mutex> lock(cache().mutex);
  std::vector<Choice> out;
  for (const Entry& entry : cache().entries) out.push_back(entry.choice);
  return out;
}

void clear_cache() {
  std::lock_guard<std::mutex> lock(cache().mutex);
  cache().entries.clear();
  cache().index.clear();
}

}  // namespace ember::tuning
