// The EMBER_* environment variables: read once when the extension loads,
// each validated by the rule of the torch.backends.ember setter it stands
// for, with that setter's message. An invalid value never fails the load
// (so `import torch` keeps working for CPU-only programs): the setting keeps
// its default, the error is recorded, and Module.cpp's initialize() reports
// it to the runtime, which raises it at the first use of an ember device.
//
//   variable            rule                       Python counterpart
//   EMBER_CPU_PARITY    0 or 1                     cpu_parity = False/True
//   EMBER_STRICT        0 or 1                     torch_ember.set_strict
//   EMBER_FALLBACK      allow, warn or error       fallback = ...
//   EMBER_VERBOSE       0, 1 or 2                  verbose(level)
//   EMBER_DEBUG_HEAP    0 or 1                     (none: start-up only)
//   EMBER_DEVICES       integer in 1..64           (runtime/device.cpp)
//   EMBER_DEVICE_CORES  core sets, e.g. "0-7,8-15" (runtime/device.cpp)
// Unset or empty means "not set" (EMBER_DEVICES: unset only).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ember::flags {

// A 0/1 switch; nullopt when unset, empty or invalid (invalid is recorded).
// `setting` names it in the message, as the Python setter does.
std::optional<bool> env_switch(const char* name, std::string_view setting);
// EMBER_VERBOSE; nullopt when unset, empty or invalid.
std::optional<int> env_verbose_level();
// EMBER_FALLBACK's value ("allow", "warn", "error"); nullopt likewise.
std::optional<std::string> env_fallback_policy();

// The setters' messages, shared by Python bindings and the variables above.
// `got` is the offending value as Python's repr writes it.
std::string switch_message(std::string_view setting, const std::string& got);
std::string verbose_level_message(const std::string& got);
std::string fallback_message(const std::string& got);

// Python's repr of a value read from the environment: an integer as a
// number, anything else as a quoted string.
std::string python_repr(std::string_view value);

// Every invalid EMBER_* value seen so far, one message each (EMBER_DEVICES
// included: checked here too, so one message names every bad variable).
std::vector<std::string> environment_errors();

}  // namespace ember::flags
