// What the execution engine did, per operator: ops launched asynchronously,
// and synchronous ops that had to wait for queued work first (where the
// engine still waits: each such op drains its stream). Listed by
// torch.ember.engine_stats().
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace ember {

void count_launch(const std::string& op);
// A synchronous op (`op`: its name, or null) that found work queued on its
// stream and waited for it.
void count_wait(const char* op);

struct LaunchCounts {
  int64_t launched = 0;
  int64_t waited = 0;
};
std::map<std::string, LaunchCounts> launch_stats();
void reset_launch_stats();

}  // namespace ember
