// The ember devices: how many there are, which one is current on this
// thread, and what each one owns (its allocator and its streams).
// Plain C++, no torch headers.
#pragma once

#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "ember/runtime/caching_allocator.h"
#include "ember/runtime/stream.h"

namespace ember::runtime {

// Raised for a device index outside [0, device_count()).
class InvalidDevice final : public std::out_of_range {
 public:
  InvalidDevice(int index, int count);
  int index;
  int count;
};

// Raised when EMBER_DEVICES does not hold an integer in [1, kMaxDevices].
class InvalidConfiguration final : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

inline constexpr int kMaxDevices = 64;

struct DeviceProperties {
  std::string name;  // "ember (<cpu model>)"
  int index = 0;
  int cores = 0;              // cores this device's workers may use
  std::vector<int> core_ids;  // their CPU ids, ascending
  int numa_node = 0;          // NUMA node its memory comes from
  std::size_t total_memory = 0;
  std::string isa;  // best vector ISA, e.g. "avx512"
};

class Device final {
 public:
  explicit Device(int index);
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  int index() const { return index_; }
  CachingAllocator& allocator() { return allocator_; }
  const DeviceProperties& properties() const { return properties_; }
  StreamPool& streams() { return streams_; }

  // Waits for all work on every stream of this device.
  void synchronize();

 private:
  const int index_;
  DeviceProperties properties_;
  CachingAllocator allocator_;
  StreamPool streams_;
};

// Parses EMBER_DEVICES and EMBER_DEVICE_CORES once (default: 1 device).
// Throws InvalidConfiguration for an invalid value, or while a configuration
// error is reported (below).
int device_count();
// Validates EMBER_DEVICES and EMBER_DEVICE_CORES as device_count() would
// (ignoring a reported error); throws InvalidConfiguration.
void check_device_configuration();
// Parses a value of EMBER_DEVICES; exposed for tests. Throws
// InvalidConfiguration naming the value and the allowed range.
int parse_device_count(const char* value);

// Devices own cores. EMBER_DEVICES=N splits the process's allowed cores
// (its affinity mask) into N disjoint contiguous sets, the first ones one
// core larger when N does not divide them; with more devices than cores,
// device i gets core i mod count (devices then share cores).
// EMBER_DEVICE_CORES sets them explicitly: one entry per device, separated
// by ',', each a core or a range "a-b", several joined by '+'
// ("0-7,8-15", "0+2,1+3"); it also gives the device count (EMBER_DEVICES,
// when set too, must agree). Exposed for tests; throw InvalidConfiguration.
std::vector<std::vector<int>> partition_cores(const std::vector<int>& allowed,
                                              int devices);
std::vector<std::vector<int>> parse_device_cores(
    const std::string& value, const std::vector<int>& allowed);
// The cores of device `index` (throws InvalidDevice).
const std::vector<int>& device_cores(int index);
// True when some device owns fewer than all of the process's cores (the
// configuration, as information: tests, _C._engine_cores_partitioned).
// Nothing depends on it: stream workers always run on their device's cores
// with that many OpenMP threads, and ops run inline follow the calling
// thread's settings either way (unless the thread binds itself to a
// device, torch.ember.use_device_cores).
bool cores_partitioned();

// Makes every later device_count() -- so every use of a device -- throw
// InvalidConfiguration(message): how a layer above reports an invalid
// setting (an EMBER_* environment variable) without failing at load. The
// first report stays; there is no way back (settings are read once).
void report_invalid_configuration(const std::string& message);
// The reported message, or nullptr while the configuration is valid.
const std::string* invalid_configuration();

// Throws InvalidDevice. Creates the device on first use.
Device& device(int index);
void check_device_index(int index);

// Registers the runtime's pthread_atfork handlers once (idempotent; done
// when the library is loaded). Before fork() they take every runtime lock
// (device creation, then each device's allocator and stream pool), afterwards
// they release them in parent and child, so a child forked while other threads
// allocate never starts with a lock held by a thread it does not have. A layer
// above whose own locks are taken before runtime locks calls this first and
// then registers its handlers: their prepare step then runs before this one.
void install_fork_handlers();

// Drains every stream of every created device and stops their workers
// (registered with atexit when the first device is created). Work
// submitted afterwards runs inline.
void shutdown_engine();

// The current device is per thread, as in CUDA.
int current_device();
void set_current_device(int index);  // throws InvalidDevice

}  // namespace ember::runtime
