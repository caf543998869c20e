#include "ops/FallbackStats.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace ember {
namespace {

std::mutex& stats_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::map<std::string, FallbackCount>& counts() {
  static std::map<std::string, FallbackCount> counts;
  return counts;
}

std::atomic<bool>& strict_flag() {
  static std::atomic<bool> flag{[] {
    const char* value = std::getenv("EMBER_STRICT");
    return value != nullptr && std::strcmp(value, "0") != 0 && *value != '\0';
  }()};
  return flag;
}

}  // namespace

void record_fallback_copy(const std::string& op, int64_t bytes) {
  TORCH_CHECK(!strict_mode(), "ember strict mode: ", op,
              " would copy its result (", bytes,
              " bytes) instead of running in place on ember memory. "
              "Unset EMBER_STRICT to allow it.");
  std::lock_guard<std::mutex> lock(stats_mutex());
  auto& count = counts()[op];
  count.copies += 1;
  count.bytes += bytes;
}

std::map<std::string, FallbackCount> fallback_stats() {
  std::lock_guard<std::mutex> lock(stats_mutex());
  return counts();
}

void reset_fallback_stats() {
  std::lock_guard<std::mutex> lock(stats_mutex());
  counts().clear();
}

bool strict_mode() { return strict_flag().load(std::memory_order_relaxed); }
void set_strict_mode(bool strict) { strict_flag().store(strict); }

}  // namespace ember
