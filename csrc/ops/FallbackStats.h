// Copies the delegation layer could not avoid, counted per operator.
// "Never silently slow": every such copy is counted here, listed by
// torch_ember.fallback_stats(), and refused under EMBER_STRICT=1.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace ember {

// Records one copy made for `op`; throws (naming the op) in strict mode.
void record_fallback_copy(const std::string& op, int64_t bytes);

struct FallbackCount {
  int64_t copies = 0;
  int64_t bytes = 0;
};
std::map<std::string, FallbackCount> fallback_stats();
void reset_fallback_stats();

bool strict_mode();
void set_strict_mode(bool strict);

}  // namespace ember
