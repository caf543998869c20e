// The real machine's topology: affinity mask, libnuma's node map, mbind.
#include "ember/runtime/topology.h"

#include <numa.h>
#include <numaif.h>

#include <atomic>
#include <cstdint>

#include "ember/runtime/cpu_features.h"

namespace ember::runtime {
namespace {

class SystemTopology final : public Topology {
 public:
  std::vector<int> allowed_cores() const override { return allowed_cpus(); }

  int node_count() const override {
    if (numa_available() < 0) return 1;
    const int nodes = numa_num_configured_nodes();
    return nodes > 0 ? nodes : 1;
  }

  int node_of_core(int core) const override {
    if (numa_available() < 0) return 0;
    const int node = numa_node_of_cpu(core);
    return node >= 0 ? node : 0;
  }

  bool bind_memory(void* ptr, std::size_t bytes, int node) const override {
    if (node < 0 || node >= 64) return false;
    const unsigned long mask = 1UL << node;
    // Preferred, not strict: a full node spills to the others instead of
    // failing the allocation.
    return mbind(ptr, bytes, MPOL_PREFERRED, &mask, sizeof(mask) * 8, 0) == 0;
  }
};

std::atomic<const Topology*> installed{nullptr};

}  // namespace

const Topology& system_topology() {
  static const SystemTopology topology;
  return topology;
}

const Topology& topology() {
  const Topology* fake = installed.load(std::memory_order_acquire);
  return fake != nullptr ? *fake : system_topology();
}

void set_topology(const Topology* fake) {
  installed.store(fake, std::memory_order_release);
}

}  // namespace ember::runtime
