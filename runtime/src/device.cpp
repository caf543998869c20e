// The ember devices: counted once from EMBER_DEVICES, created on first use,
// alive until the process ends.
#include "ember/runtime/device.h"

#include <array>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "ember/runtime/cpu_features.h"

namespace ember::runtime {

namespace {

std::string invalid_device_message(int index, int count) {
  return "invalid device index " + std::to_string(index) + ": ember has " +
         std::to_string(count) + " device(s) (valid indices 0.." +
         std::to_string(count - 1) + ")";
}

DeviceProperties make_properties(int index) {
  const CpuFeatures& cpu = cpu_features();
  DeviceProperties properties;
  properties.name =
      "ember (" +
      (cpu.model_name.empty() ? std::string("unknown CPU") : cpu.model_name) +
      ")";
  properties.index = index;
  properties.cores = available_cores();
  properties.numa_node = numa_node_of_process();
  properties.total_memory = physical_memory_bytes();
  properties.isa = cpu.best_isa();
  return properties;
}

thread_local int current_device_index = 0;

}  // namespace

InvalidDevice::InvalidDevice(int index, int count)
    : std::out_of_range(invalid_device_message(index, count)),
      index(index),
      count(count) {}

Device::Device(int index)
    : index_(index),
      properties_(make_properties(index)),
      allocator_(index),
      streams_(index) {}

void Device::synchronize() { streams_.synchronize_all(); }

int parse_device_count(const char* value) {
  if (value == nullptr) return 1;  // EMBER_DEVICES unset
  const char* end = value + std::strlen(value);
  int count = 0;
  // from_chars takes no sign but '-', no spaces and no base prefix; a
  // leading '-' is caught by the range check.
  const auto [stop, error] = std::from_chars(value, end, count);
  if (value == end || error != std::errc() || stop != end || count < 1 ||
      count > kMaxDevices) {
    throw InvalidConfiguration(
        "EMBER_DEVICES='" + std::string(value) +
        "' is invalid: expected an integer between 1 and " +
        std::to_string(kMaxDevices));
  }
  return count;
}

int device_count() {
  // A throwing initializer leaves the static uninitialized, so a bad value
  // keeps raising on every call instead of being half-applied.
  static const int count = parse_device_count(std::getenv("EMBER_DEVICES"));
  return count;
}

void check_device_index(int index) {
  const int count = device_count();
  if (index < 0 || index >= count) throw InvalidDevice(index, count);
}

Device& device(int index) {
  check_device_index(index);
  // Deliberately never destroyed: tensors released during static
  // destruction (or by other libraries' exit handlers) still free into a
  // live allocator; the OS reclaims the segments at exit.
  static auto& devices =
      *new std::vector<std::unique_ptr<Device>>(device_count());
  static std::array<std::once_flag, kMaxDevices> created;
  std::call_once(created[index],
                 [index] { devices[index] = std::make_unique<Device>(index); });
  return *devices[index];
}

int current_device() { return current_device_index; }

void set_current_device(int index) {
  check_device_index(index);
  current_device_index = index;
}

}  // namespace ember::runtime
