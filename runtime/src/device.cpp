// The ember devices: counted once from EMBER_DEVICES, created on first use,
// alive until the process ends; and the fork handlers that keep their locks
// consistent across fork().
#include "ember/runtime/device.h"

#include <pthread.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <system_error>

#include "ember/runtime/cpu_features.h"
#include "ember/runtime/pinned_memory.h"
#include "ember/runtime/topology.h"

namespace ember::runtime {

namespace {

std::string invalid_device_message(int index, int count) {
  return "invalid device index " + std::to_string(index) + ": ember has " +
         std::to_string(count) + " device(s) (valid indices 0.." +
         std::to_string(count - 1) + ")";
}

struct Configuration {
  int count = 1;
  std::vector<std::vector<int>> cores;  // per device
  bool partitioned = false;
};

Configuration read_configuration() {
  const char* devices_value = std::getenv("EMBER_DEVICES");
  const char* cores_value = std::getenv("EMBER_DEVICE_CORES");
  if (cores_value != nullptr && *cores_value == '\0') cores_value = nullptr;
  Configuration config;
  (void)parse_launch_blocking(std::getenv("EMBER_LAUNCH_BLOCKING"));
  const int requested = parse_device_count(devices_value);
  std::vector<int> allowed = topology().allowed_cores();
  if (allowed.empty()) allowed.push_back(0);
  if (cores_value != nullptr) {
    config.cores = parse_device_cores(cores_value, allowed);
    if (devices_value != nullptr &&
        requested != static_cast<int>(config.cores.size())) {
      throw InvalidConfiguration(
          "EMBER_DEVICE_CORES='" + std::string(cores_value) + "' gives " +
          std::to_string(config.cores.size()) +
          " device(s) but EMBER_DEVICES=" + std::string(devices_value));
    }
    config.count = static_cast<int>(config.cores.size());
  } else {
    config.count = requested;
    config.cores = partition_cores(allowed, requested);
  }
  for (const auto& cores : config.cores) {
    if (cores != allowed) config.partitioned = true;
  }
  return config;
}

// Parsed once; a throwing initializer leaves the static uninitialized, so
// a bad value keeps raising on every call instead of being half-applied.
const Configuration& configuration() {
  static const Configuration config = read_configuration();
  return config;
}

DeviceProperties make_properties(int index) {
  const CpuFeatures& cpu = cpu_features();
  DeviceProperties properties;
  properties.name =
      "ember (" +
      (cpu.model_name.empty() ? std::string("unknown CPU") : cpu.model_name) +
      ")";
  properties.index = index;
  properties.core_ids = device_cores(index);
  properties.cores = static_cast<int>(properties.core_ids.size());
  properties.numa_node = topology().node_of_core(properties.core_ids.front());
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
  // Function-local statics another thread may be initialising right now: a
  // child forked mid-initialisation would wait for that thread forever at
  // its first use. Initialised here (waiting for such a thread) first.
  try {
    (void)configuration();
  } catch (const InvalidConfiguration&) {
    // Not initialised, and nobody is initialising it: nothing to wait for.
  }
  (void)launch_blocking();
  (void)cpu_features();
  // Held work (HeldWork) is submitted, as by any other stream operation:
  // the child then finds it finished (or in flight, as queued work).
  for (auto& slot : created_devices) {
    if (Device* dev = slot.load(std::memory_order_acquire)) {
      dev->streams().submit_all_held();
    }
  }
  creation_mutex.lock();
  for (auto& slot : created_devices) {
    if (Device* dev = slot.load(std::memory_order_acquire)) {
      dev->allocator().lock_for_fork();
      dev->streams().lock_for_fork();
    }
  }
  pinned_lock_for_fork();
}

// In the parent and (first) in the child: in the child the forking thread
// (the only one left) is the thread that took the locks.
void unlock_after_fork() {
  pinned_unlock_after_fork();
  for (auto it = created_devices.rbegin(); it != created_devices.rend(); ++it) {
    if (Device* dev = it->load(std::memory_order_acquire)) {
      dev->streams().unlock_after_fork();
      dev->allocator().unlock_after_fork();
    }
  }
  creation_mutex.unlock();
}

// The child has no worker threads: each stream starts a fresh one on its
// next queued work, unless queued work was in flight at fork(); that work
// is lost with its threads, so the child refuses every stream operation
// (ForkedWithWorkInFlight) instead of computing with half-written memory.
void child_after_fork() {
  // First of all, while the fork still holds the allocator locks: the
  // child's ember memory stops being shared with the parent.
  for (auto& slot : created_devices) {
    if (Device* dev = slot.load(std::memory_order_acquire)) {
      dev->allocator().after_fork_in_child();
    }
  }
  unlock_after_fork();
  bool in_flight = false;
  for (auto& slot : created_devices) {
    if (Device* dev = slot.load(std::memory_order_acquire)) {
      in_flight |= dev->streams().reset_in_child();
    }
  }
  if (!in_flight) return;
  mark_forked_with_work_in_flight();
  for (auto& slot : created_devices) {
    if (Device* dev = slot.load(std::memory_order_acquire)) {
      dev->streams().refuse_after_fork();
    }
  }
}

void shutdown_at_exit() { shutdown_engine(); }

[[gnu::noinline]] Device& create_device(int index) {
  std::lock_guard<std::mutex> lock(creation_mutex);
  Device* dev = created_devices[index].load(std::memory_order_relaxed);
  if (dev == nullptr) {
    static const bool exit_handler = (std::atexit(shutdown_at_exit), true);
    (void)exit_handler;
    dev = new Device(index);
    created_devices[index].store(dev, std::memory_order_release);
  }
  return *dev;
}

}  // namespace

void install_fork_handlers() {
  static const int registered =
      pthread_atfork(lock_before_fork, unlock_after_fork, child_after_fork);
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

namespace {
std::shared_ptr<const WorkerConfig> worker_config(int index) {
  auto config = std::make_shared<WorkerConfig>();
  config->device_index = index;
  config->cores = device_cores(index);
  return config;
}
}  // namespace

Device::Device(int index)
    : index_(index),
      properties_(make_properties(index)),
      allocator_(index),
      streams_(index, worker_config(index)) {
  if (topology().node_count() > 1) {
    allocator_.bind_to_numa_node(properties_.numa_node);
  }
}

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

void check_device_configuration() { (void)read_configuration(); }

int device_count() {
  if (const std::string* error =
          configuration_error.load(std::memory_order_acquire)) [[unlikely]] {
    throw InvalidConfiguration(*error);
  }
  return configuration().count;
}

namespace {

std::string describe_cores(const std::vector<int>& cores) {
  std::string text;
  for (std::size_t i = 0; i < cores.size();) {
    std::size_t j = i;
    while (j + 1 < cores.size() && cores[j + 1] == cores[j] + 1) ++j;
    if (!text.empty()) text += ',';
    text += std::to_string(cores[i]);
    if (j > i) text += '-' + std::to_string(cores[j]);
    i = j + 1;
  }
  return text;
}

int parse_core(const std::string& whole, const std::string& text) {
  int core = -1;
  const char* begin = text.data();
  const char* end = begin + text.size();
  const auto [stop, error] = std::from_chars(begin, end, core);
  if (text.empty() || error != std::errc() || stop != end || core < 0) {
    throw InvalidConfiguration("EMBER_DEVICE_CORES='" + whole +
                               "' is invalid: '" + text +
                               "' is not a core number");
  }
  return core;
}

}  // namespace

std::vector<std::vector<int>> partition_cores(const std::vector<int>& allowed,
                                              int devices) {
  std::vector<std::vector<int>> sets(static_cast<std::size_t>(devices));
  const int count = static_cast<int>(allowed.size());
  if (devices > count) {
    for (int i = 0; i < devices; ++i) sets[i].push_back(allowed[i % count]);
    return sets;
  }
  int next = 0;
  for (int i = 0; i < devices; ++i) {
    const int size = count / devices + (i < count % devices ? 1 : 0);
    sets[i].assign(allowed.begin() + next, allowed.begin() + next + size);
    next += size;
  }
  return sets;
}

std::vector<std::vector<int>> parse_device_cores(
    const std::string& value, const std::vector<int>& allowed) {
  auto invalid = [&](const std::string& why) {
    return InvalidConfiguration("EMBER_DEVICE_CORES='" + value +
                                "' is invalid: " + why);
  };
  std::vector<std::vector<int>> sets;
  std::vector<int> owner;  // owner[core] = device + 1
  std::size_t start = 0;
  while (start <= value.size()) {
    std::size_t comma = value.find(',', start);
    if (comma == std::string::npos) comma = value.size();
    const std::string entry = value.substr(start, comma - start);
    const int device = static_cast<int>(sets.size());
    if (device >= kMaxDevices) {
      throw invalid("more than " + std::to_string(kMaxDevices) + " devices");
    }
    if (entry.empty()) {
      throw invalid("device " + std::to_string(device) + " has no cores");
    }
    std::vector<int> cores;
    std::size_t part_start = 0;
    while (part_start <= entry.size()) {
      std::size_t plus = entry.find('+', part_start);
      if (plus == std::string::npos) plus = entry.size();
      const std::string part = entry.substr(part_start, plus - part_start);
      const std::size_t dash = part.find('-');
      const int first = parse_core(value, part.substr(0, dash));
      const int last = dash == std::string::npos
                           ? first
                           : parse_core(value, part.substr(dash + 1));
      if (last < first) {
        throw invalid("range '" + part + "' runs backwards");
      }
      for (int core = first; core <= last; ++core) {
        if (!std::binary_search(allowed.begin(), allowed.end(), core)) {
          throw invalid("core " + std::to_string(core) +
                        " is not available to this process (allowed: " +
                        describe_cores(allowed) + ")");
        }
        if (owner.size() <= static_cast<std::size_t>(core)) {
          owner.resize(static_cast<std::size_t>(core) + 1, 0);
        }
        if (owner[core] != 0) {
          throw invalid("core " + std::to_string(core) + " is given to ember:" +
                        std::to_string(owner[core] - 1) +
                        " and ember:" + std::to_string(device));
        }
        owner[core] = device + 1;
        cores.push_back(core);
      }
      part_start = plus + 1;
    }
    std::sort(cores.begin(), cores.end());
    sets.push_back(std::move(cores));
    start = comma + 1;
  }
  return sets;
}

const std::vector<int>& device_cores(int index) {
  check_device_index(index);
  return configuration().cores[static_cast<std::size_t>(index)];
}

bool cores_partitioned() {
  device_count();  // raises a reported configuration error
  return configuration().partitioned;
}

void shutdown_engine() {
  for (auto& slot : created_devices) {
    if (Device* dev = slot.load(std::memory_order_acquire)) {
      dev->streams().shutdown_all();
    }
  }
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
