#include "ops/LaunchStats.h"

#include <mutex>
#include <unordered_map>

#include "core/ForkSafety.h"

namespace ember {
namespace {

ForkHeldMutex stats_mutex;
std::unordered_map<std::string, LaunchCounts>& stats() {
  static auto* counts = new std::unordered_map<std::string, LaunchCounts>();
  return *counts;
}

}  // namespace

void count_launch(const std::string& op) {
  std::lock_guard<std::mutex> lock(stats_mutex);
  ++stats()[op].launched;
}

void count_wait(const char* op) {
  std::lock_guard<std::mutex> lock(stats_mutex);
  ++stats()[op != nullptr ? op : "(unnamed work)"].waited;
}

std::map<std::string, LaunchCounts> launch_stats() {
  std::lock_guard<std::mutex> lock(stats_mutex);
  return {stats().begin(), stats().end()};
}

void reset_launch_stats() {
  std::lock_guard<std::mutex> lock(stats_mutex);
  stats().clear();
}

}  // namespace ember
