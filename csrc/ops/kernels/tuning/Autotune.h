// torch.backends.ember.benchmark: time the algorithms that can run a call,
// once per signature (op, shapes, strides, dtype, mode), and reuse the
// fastest. The cache is bounded by benchmark_limit (oldest entry evicted)
// and cleared by torch.ember.empty_cache().
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ember::tuning {

struct Candidate {
  const char* name;
  std::function<void()> run;  // writes scratch outputs, never the result
};

struct Choice {
  std::string op;
  std::string signature;
  std::string algorithm;
  std::vector<std::pair<std::string, double>> timings_us;
};

// Index into `candidates` of the fastest for this signature: timed now on
// the first call, from the cache afterwards.
size_t choose(const std::string& op, const std::string& signature,
              const std::vector<Candidate>& candidates);

std::vector<Choice> cache_entries();
void clear_cache();

}  // namespace ember::tuning
