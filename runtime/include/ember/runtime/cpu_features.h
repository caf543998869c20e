// What the host CPU can do, read with CPUID (and XGETBV / arch_prctl for the
// state the OS has enabled). Plain C++, no torch headers.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace ember::runtime {

struct CpuFeatures {
  std::string vendor;
  std::string model_name;
  bool sse4_2 = false;
  bool avx = false;
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512_bf16 = false;
  bool avx512_vnni = false;
  bool avx512_fp16 = false;
  bool avx_vnni = false;
  // AMX is only reported when the OS lets this process use the tile state.
  bool amx_tile = false;
  bool amx_bf16 = false;
  bool amx_int8 = false;

  // "amx", "avx512", "avx2" or "default": the best kernel level available.
  std::string best_isa() const;
};

// `f` without the features above `max_isa`: "avx2" drops AVX-512 and AMX,
// "avx512" drops AMX. False (f unchanged) for any other value.
bool cap_to_isa(CpuFeatures& f, const std::string& max_isa);

// Detected once, on first use; capped by EMBER_MAX_ISA where it is set (as
// oneDNN's ONEDNN_MAX_CPU_ISA: runs ember's kernels of a lower level on a
// CPU that has a higher one, e.g. to test the AVX2 kernels on AVX-512 CPUs;
// an unknown value is reported on stderr and ignored).
const CpuFeatures& cpu_features();

// The cores (CPU ids) this process may run on: its affinity mask, read now.
std::vector<int> allowed_cpus();
// Cores this process may run on (its affinity mask).
int available_cores();
// NUMA node of the first core this process may run on (0 without NUMA).
int numa_node_of_process();
// Physical memory of the machine in bytes.
std::size_t physical_memory_bytes();
// Size of one core's L2 cache in bytes (0 where the system does not say).
std::size_t l2_cache_bytes();

}  // namespace ember::runtime
