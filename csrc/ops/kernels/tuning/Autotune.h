// torch.backends.ember.benchmark: time the algorithms that can run a call,
// once per signature (op, shapes, strides, dtype, mode), and reuse the
// fastest. The cache is bounded by benchmark_limit (oldest entry evicted)
// and cleared by torch.ember.empty_cache().
#pragma once

#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace ember::tuning {

// A call's signature as numbers: cheap to build and hash on every call.
class Key {
 public:
  explicit Key(const char* op) : op_(op) {}
  Key& add(int64_t value) {
    values_.push_back(value);
    return *this;
  }
  Key& add(c10::IntArrayRef values) {
    values_.push_back(static_cast<int64_t>(values.size()));
    values_.insert(values_.end(), values.begin(), values.end());
    return *this;
  }
  const char* op() const { return op_; }
  const std::vector<int64_t>& values() const { return values_; }
  bool operator==(const Key& other) const {
    return op_ == other.op_ && values_ == other.values_;
  }

 private:
  const char* op_;  // a string literal: compared by address
  std::vector<int64_t> values_;
};

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

// The cached choice (index into the candidates, in the order tune() got
// them) for this key, if any.
std::optional<size_t> lookup(const Key& key);

// Times every candidate, caches and returns the fastest. `describe` gives
// the readable signature for benchmark_cache_info().
size_t tune(const Key& key, const std::string& describe,
            const std::vector<Candidate>& candidates);

std::vector<Choice> cache_entries();
void clear_cache();

}  // namespace ember::tuning
