// The ember devices: counted once from EMBER_DEVICES, created on first use,
// alive until the process ends; and the fork handlers that keep their locks
// consistent across fork().
#include "ember/runtime/device.h"

#include <pthread.h>

#include <array>
#include <atomic>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <system_error>

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

// Set once by report_invalid_configuration; never freed.
std::atomic<const std::string*> configuration_error{nullptr};

// Devices created so far. Deliberately never destroyed: tensors released
// during static destruction (or by other libraries' exit handlers) still
// free into a live allocator; the OS reclaims the segments at exit. Both
// are constant-initialized, so no static-initialization guard is involved.
std::array<std::atomic<Device*>, kMaxDevices> created_devices{};
std::mutex creation_mutex;  // serializes creation; held across fork()

// pthread_atfork handlers. Lock order: creation, then per device (in index
// order) its allocator, then its stream pool. No runtime code holds one of
// these while taking another, so the order cannot deadlock; with creation
// held the set of devices cannot change under the loop.
void lock_before_fork() {
  creation_mutex.lock();
  for (auto& slot : created_devices) {
    if (Device* dev = slot.load(std::memory_order_acquire)) {
      dev->allocator().lock_for_fork();
      dev->streams().lock_for_fork();
    }
  }
}

// The same in parent and child: in the child the forking thread (the only
// one left) is the thread that took the locks.
void unlock_after_fork() {
  for (auto it = created_devices.rbegin(); it != created_devices.rend(); ++it) {
    if (Device* dev = it->load(std::memory_order_acquire)) {
      dev->streams().unlock_after_fork();
      dev->allocator().unlock_after_fork();
    }
  }
  creation_mutex.unlock();
}

[[gnu::noinline]] Device& create_device(int index) {
  std::lock_guard<std::mutex> lock(creation_mutex);
  Device* dev = created_devices[index].load(std::memory_order_relaxed);
  if (dev == nullptr) {
    dev = new Device(index);
    created_devices[index].store(dev, std::memory_order_release);
  }
  return *dev;
}

}  // namespace

void install_fork_handlers() {
  static const int registered =
      pthread_atfork(lock_before_fork, unlock_after_fork, unlock_after_fork);
  if (registered != 0) {
    throw std::system_error(registered, std::generic_category(),
                            "ember: pthread_atfork");
  }
}

namespace {
// Installed when the library is loaded, before any thread can be inside
// the runtime: installing on first use would leave a window where one
// thread creates a device (holding its lock) while another forks.
const bool fork_handlers_installed = (install_fork_handlers(), true);
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

void report_invalid_configuration(const std::string& message) {
  const std::string* expected = nullptr;
  auto* reported = new std::string(message);  // lives as long as the process
  if (!configuration_error.compare_exchange_strong(expected, reported)) {
    delete reported;
  }
}

const std::string* invalid_configuration() {
  return configuration_error.load(std::memory_order_acquire);
}

int device_count() {
  if (const std::string* error =
          configuration_error.load(std::memory_order_acquire)) [[unlikely]] {
    throw InvalidConfiguration(*error);
  }
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
  if (Device* dev = created_devices[index].load(std::memory_order_acquire)) {
    return *dev;
  }
  return create_device(index);
}

int current_device() { return current_device_index; }

void set_current_device(int index) {
  check_device_index(index);
  current_device_index = index;
}

}  // namespace ember::runtime
