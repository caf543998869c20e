// The machine as the devices see it: which cores the process may use and
// which NUMA node each core (and so each device's memory) belongs to. An
// interface so tests can fake a multi-node machine. Plain C++, no torch.
#pragma once

#include <cstddef>
#include <vector>

namespace ember::runtime {

class Topology {
 public:
  virtual ~Topology() = default;
  // CPU ids this process may run on (its affinity mask), ascending.
  virtual std::vector<int> allowed_cores() const = 0;
  // NUMA nodes of the machine (1 without NUMA).
  virtual int node_count() const = 0;
  virtual int node_of_core(int core) const = 0;
  // Prefers `node` for the pages of [ptr, ptr + bytes) (mbind); returns
  // false if the OS refused.
  virtual bool bind_memory(void* ptr, std::size_t bytes, int node) const = 0;
};

// The real machine (sched_getaffinity, libnuma, mbind).
const Topology& system_topology();
// What devices and allocators use: the real machine unless a test
// installed a fake. set_topology(nullptr) restores the real one; the fake
// must outlive its use.
const Topology& topology();
void set_topology(const Topology* fake);

}  // namespace ember::runtime
