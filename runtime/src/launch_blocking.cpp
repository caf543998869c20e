// EMBER_LAUNCH_BLOCKING (stream.h): every launch runs at its call, as
// CUDA_LAUNCH_BLOCKING makes kernel launches synchronous.
#include <cstdlib>
#include <string>

#include "ember/runtime/device.h"
#include "ember/runtime/stream.h"

namespace ember::runtime {

bool parse_launch_blocking(const char* value) {
  if (value == nullptr || *value == '\0') return false;
  const std::string text(value);
  if (text == "0") return false;
  if (text == "1") return true;
  throw InvalidConfiguration("EMBER_LAUNCH_BLOCKING='" + text +
                             "' is invalid: expected 0 or 1");
}

bool launch_blocking() {
  static const bool blocking = [] {
    try {
      return parse_launch_blocking(std::getenv("EMBER_LAUNCH_BLOCKING"));
    } catch (const InvalidConfiguration&) {
      return false;  // reported by device_count() (device.cpp)
    }
  }();
  return blocking;
}

}  // namespace ember::runtime
