#include "ops/FallbackStats.h"

#include <c10/util/Exception.h>

#include <mutex>

#include "core/ForkSafety.h"
#include "flags/BackendFlags.h"
#include "observe/ExecutionPath.h"

namespace ember {
namespace {

std::mutex& stats_mutex() {
  static ForkHeldMutex mutex;
  return mutex;
}

std::map<std::string, FallbackCount>& counts() {
  static std::map<std::string, FallbackCount> counts;
  return counts;
}

}  // namespace

void record_fallback_copy(const std::string& op, int64_t bytes) {
  observe::mark_path(observe::ExecutionPath::kCopied);
  const auto policy = flags::fallback_policy();
  TORCH_CHECK(policy != flags::FallbackPolicy::kError,
              "ember fallback policy 'error': ", op, " would copy its result (",
              bytes,
              " bytes) instead of running in place on ember memory. Set "
              "torch.backends.ember.fallback = 'allow' (or unset "
              "EMBER_STRICT) to allow it.");
  if (policy == flags::FallbackPolicy::kWarn) {
    TORCH_WARN("ember: ", op, " copied its result (", bytes,
               " bytes) instead of running in place on ember memory");
  }
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

// The older strict switch is the fallback policy's "error" setting.
bool strict_mode() {
  return flags::fallback_policy() == flags::FallbackPolicy::kError;
}
void set_strict_mode(bool strict) {
  flags::set_fallback_policy(strict ? flags::FallbackPolicy::kError
                                    : flags::FallbackPolicy::kAllow);
}

}  // namespace ember
