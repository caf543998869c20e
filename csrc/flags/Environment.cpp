#include "flags/Environment.h"

#include <charconv>
#include <cstdlib>
#include <mutex>

#include "core/ForkSafety.h"
#include "ember/runtime/device.h"

namespace ember::flags {
namespace {

// Errors are recorded during static initialization (the flags' initial
// values) and read later; a function-local static has no order problem.
std::vector<std::string>& recorded() {
  static std::vector<std::string> errors;
  return errors;
}

std::mutex& recorded_mutex() {
  static ForkHeldMutex mutex;
  return mutex;
}

void record(const char* name, std::string_view value,
            const std::string& message) {
  std::lock_guard<std::mutex> lock(recorded_mutex());
  recorded().push_back(std::string(name) + "='" + std::string(value) +
                       "' is invalid: " + message);
}

// The variable's value, or nullopt when it is unset or empty.
std::optional<std::string_view> read(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string_view(value);
}

std::optional<long long> as_integer(std::string_view value) {
  long long number = 0;
  const auto [end, error] =
      std::from_chars(value.data(), value.data() + value.size(), number);
  if (error != std::errc() || end != value.data() + value.size()) {
    return std::nullopt;
  }
  return number;
}

}  // namespace

std::string python_repr(std::string_view value) {
  if (as_integer(value)) return std::string(value);
  return "'" + std::string(value) + "'";
}

std::string switch_message(std::string_view setting, const std::string& got) {
  // The Python setter's "cpu_parity must be True or False; got 'yes'", in
  // the environment's spelling of True and False.
  return std::string(setting) + " must be 1 or 0 (True or False); got " + got;
}

std::string verbose_level_message(const std::string& got) {
  return "verbose level must be 0, 1 or 2; got " + got;
}

std::string fallback_message(const std::string& got) {
  return "fallback must be one of 'allow', 'warn', 'error'; got " + got;
}

std::optional<bool> env_switch(const char* name, std::string_view setting) {
  const auto value = read(name);
  if (!value) return std::nullopt;
  if (*value == "0") return false;
  if (*value == "1") return true;
  record(name, *value, switch_message(setting, python_repr(*value)));
  return std::nullopt;
}

std::optional<int> env_verbose_level() {
  const auto value = read("EMBER_VERBOSE");
  if (!value) return std::nullopt;
  const auto level = as_integer(*value);
  if (level && *level >= 0 && *level <= 2) return static_cast<int>(*level);
  record("EMBER_VERBOSE", *value, verbose_level_message(python_repr(*value)));
  return std::nullopt;
}

std::optional<std::string> env_fallback_policy() {
  const auto value = read("EMBER_FALLBACK");
  if (!value) return std::nullopt;
  if (*value == "allow" || *value == "warn" || *value == "error") {
    return std::string(*value);
  }
  record("EMBER_FALLBACK", *value, fallback_message(python_repr(*value)));
  return std::nullopt;
}

std::vector<std::string> environment_errors() {
  std::vector<std::string> errors;
  try {
    runtime::check_device_configuration();  // EMBER_DEVICES, _DEVICE_CORES
  } catch (const runtime::InvalidConfiguration& error) {
    errors.emplace_back(error.what());
  }
  std::lock_guard<std::mutex> lock(recorded_mutex());
  errors.insert(errors.end(), recorded().begin(), recorded().end());
  return errors;
}

}  // namespace ember::flags
