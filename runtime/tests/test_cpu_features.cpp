#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include "ember/runtime/cpu_features.h"

namespace ember::runtime {
namespace {

// The kernel's view of the CPU flags (it also hides features whose register
// state it does not enable), or an empty set off Linux.
std::set<std::string> proc_cpuinfo_flags() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> flags;
    for (std::string flag; words >> flag;) flags.insert(flag);
    return flags;
  }
  return {};
}

TEST(CpuFeatures, DetectedOnceAndShared) {
  EXPECT_EQ(&cpu_features(), &cpu_features());
}

TEST(CpuFeatures, FeatureHierarchyIsConsistent) {
  const CpuFeatures& f = cpu_features();
  if (f.avx2) {
    EXPECT_TRUE(f.avx);
  }
  if (f.fma || f.f16c) {
    EXPECT_TRUE(f.avx);
  }
  if (f.avx_vnni) {
    EXPECT_TRUE(f.avx2);
  }
  if (f.avx512f) {
    EXPECT_TRUE(f.avx2);
    EXPECT_TRUE(f.fma);
  }
  for (bool extension : {f.avx512bw, f.avx512vl, f.avx512dq, f.avx512_bf16,
                         f.avx512_vnni, f.avx512_fp16}) {
    if (extension) {
      EXPECT_TRUE(f.avx512f);
    }
  }
  if (f.amx_bf16 || f.amx_int8) {
    EXPECT_TRUE(f.amx_tile);
  }
}

TEST(CpuFeatures, BestIsaFollowsTheFlags) {
  const CpuFeatures& f = cpu_features();
  const std::string isa = f.best_isa();
  EXPECT_TRUE(isa == "amx" || isa == "avx512" || isa == "avx2" ||
              isa == "default")
      << isa;

  CpuFeatures synthetic;
  EXPECT_EQ(synthetic.best_isa(), "default");
  synthetic.avx2 = true;
  EXPECT_EQ(synthetic.best_isa(), "default");  // avx2 kernels also need fma
  synthetic.fma = true;
  EXPECT_EQ(synthetic.best_isa(), "avx2");
  synthetic.avx512f = synthetic.avx512bw = true;
  EXPECT_EQ(synthetic.best_isa(), "avx2");  // ... and avx512 needs vl too
  synthetic.avx512vl = true;
  EXPECT_EQ(synthetic.best_isa(), "avx512");
  synthetic.amx_tile = true;
  EXPECT_EQ(synthetic.best_isa(), "avx512");
  synthetic.amx_bf16 = true;
  EXPECT_EQ(synthetic.best_isa(), "amx");
}

#if defined(__x86_64__)
TEST(CpuFeatures, NamesTheX86Processor) {
  const CpuFeatures& f = cpu_features();
  EXPECT_FALSE(f.model_name.empty());
  EXPECT_NE(f.model_name.front(), ' ');
  EXPECT_NE(f.model_name.back(), ' ');
  EXPECT_EQ(f.vendor.size(), 12u) << f.vendor;  // e.g. "GenuineIntel"
  EXPECT_TRUE(f.sse4_2);  // every x86-64 CPU the backend targets has it
}

TEST(CpuFeatures, AgreesWithTheKernel) {
  const std::set<std::string> flags = proc_cpuinfo_flags();
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags";
  const CpuFeatures& f = cpu_features();
  const std::pair<const char*, bool> expected[] = {
      {"sse4_2", f.sse4_2},
      {"avx", f.avx},
      {"avx2", f.avx2},
      {"fma", f.fma},
      {"f16c", f.f16c},
      {"avx512f", f.avx512f},
      {"avx512bw", f.avx512bw},
      {"avx512vl", f.avx512vl},
      {"avx512dq", f.avx512dq},
      {"avx512_bf16", f.avx512_bf16},
      {"avx512_vnni", f.avx512_vnni},
      {"avx512_fp16", f.avx512_fp16},
      {"avx_vnni", f.avx_vnni},
  };
  for (const auto& [flag, detected] : expected) {
    EXPECT_EQ(flags.count(flag) == 1, detected) << flag;
  }
  // AMX additionally needs this process's permission, so only one way.
  if (f.amx_tile) {
    EXPECT_EQ(flags.count("amx_tile"), 1u);
  }
  if (f.amx_bf16) {
    EXPECT_EQ(flags.count("amx_bf16"), 1u);
  }
  if (f.amx_int8) {
    EXPECT_EQ(flags.count("amx_int8"), 1u);
  }
}
#endif

TEST(HostTopology, CoresNodeAndMemoryAreSensible) {
  const int cores = available_cores();
  EXPECT_GE(cores, 1);
  EXPECT_LE(cores, sysconf(_SC_NPROCESSORS_CONF));
  EXPECT_GE(numa_node_of_process(), 0);
  const std::size_t memory = physical_memory_bytes();
  EXPECT_GT(memory, std::size_t{64} << 20);
  EXPECT_EQ(memory % static_cast<std::size_t>(sysconf(_SC_PAGE_SIZE)), 0u);
}

// The L2 size the tall GEMM sizes its panel groups by agrees with what the
// kernel reports for cpu0's unified level-2 cache, where it reports one.
TEST(HostTopology, L2CacheSizeMatchesSysfs) {
  const std::size_t l2 = l2_cache_bytes();
  const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index2/";
  std::ifstream level(dir + "level");
  int level_number = 0;
  if (!(level >> level_number) || level_number != 2) {
    GTEST_SKIP() << "no sysfs description of a level-2 cache at index2";
  }
  std::FILE* file = std::fopen((dir + "size").c_str(), "r");
  if (file == nullptr) GTEST_SKIP() << "no sysfs cache size";
  unsigned long kib = 0;
  const int read = std::fscanf(file, "%luK", &kib);
  std::fclose(file);
  if (read != 1) GTEST_SKIP() << "sysfs cache size not in KiB";
  if (l2 == 0) GTEST_SKIP() << "sysconf does not report the L2 size";
  EXPECT_EQ(l2, static_cast<std::size_t>(kib) * 1024);
}

TEST(HostTopology, CoresFollowTheAffinityMask) {
  cpu_set_t original;
  ASSERT_EQ(sched_getaffinity(0, sizeof(original), &original), 0);
  cpu_set_t one;
  CPU_ZERO(&one);
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &original)) {
      CPU_SET(cpu, &one);
      break;
    }
  }
  ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
  const int restricted = available_cores();
  ASSERT_EQ(sched_setaffinity(0, sizeof(original), &original), 0);
  EXPECT_EQ(restricted, 1);
  EXPECT_EQ(available_cores(), CPU_COUNT(&original));
}

}  // namespace
TEST(CpuFeatures, CappingToAvx2DropsAvx512AndAmxOnly) {
  CpuFeatures f;
  f.avx2 = f.fma = f.avx512f = f.avx512bw = f.avx512_bf16 = true;
  f.amx_tile = f.amx_bf16 = true;
  CpuFeatures avx512 = f;
  EXPECT_TRUE(cap_to_isa(avx512, "avx512"));
  EXPECT_TRUE(avx512.avx512f && avx512.avx512_bf16);
  EXPECT_FALSE(avx512.amx_tile || avx512.amx_bf16);
  EXPECT_TRUE(cap_to_isa(f, "avx2"));
  EXPECT_TRUE(f.avx2 && f.fma);
  EXPECT_FALSE(f.avx512f || f.avx512bw || f.avx512_bf16 || f.amx_tile);
  EXPECT_EQ(f.best_isa(), "avx2");
}

TEST(CpuFeatures, AnUnknownCapLeavesTheFeatures) {
  CpuFeatures f;
  f.avx512f = true;
  EXPECT_FALSE(cap_to_isa(f, "sse"));
  EXPECT_FALSE(cap_to_isa(f, "AVX2"));
  EXPECT_TRUE(f.avx512f);
}

}  // namespace ember::runtime
