#include "ops/kernels/tuning/Autotune.h"

#include <algorithm>
#include <chrono>
#include <list>
#include <mutex>
#include <unordered_map>

#include "flags/BackendFlags.h"

namespace ember::tuning {
namespace {

struct Cache {
  std::mutex mutex;
  std::list<Choice> entries;  // insertion order: front is the oldest
  std::unordered_map<std::string, std::list<Choice>::iterator> index;
};

Cache& cache() {
  static Cache instance;
  return instance;
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

size_t choose(const std::string& op, const std::string& signature,
              const std::vector<Candidate>& candidates) {
  const std::string key = op + "|" + signature;
  Cache& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    auto found = c.index.find(key);
    if (found != c.index.end()) {
      const std::string& algorithm = found->second->algorithm;
      for (size_t i = 0; i < candidates.size(); ++i) {
        if (algorithm == candidates[i].name) return i;
      }
    }
  }
  Choice choice{op, signature, "", {}};
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
  std::lock_guard<std::mutex> lock(c.mutex);
  if (c.index.count(key) == 0) {
    c.entries.push_back(std::move(choice));
    c.index[key] = std::prev(c.entries.end());
    const int64_t limit = flags::benchmark_limit();
    while (limit > 0 && static_cast<int64_t>(c.entries.size()) > limit) {
      c.index.erase(c.entries.front().op + "|" + c.entries.front().signature);
      c.entries.pop_front();
    }
  }
  return best;
}

std::vector<Choice> cache_entries() {
  std::lock_guard<std::mutex> lock(cache().mutex);
  return {cache().entries.begin(), cache().entries.end()};
}

void clear_cache() {
  std::lock_guard<std::mutex> lock(cache().mutex);
  cache().entries.clear();
  cache().index.clear();
}

}  // namespace ember::tuning
