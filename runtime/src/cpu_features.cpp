// CPU feature detection: CPUID says what the silicon has, XGETBV says which
// register state the OS saves on context switch (a feature whose state is not
// saved is unusable), and for AMX the process must also ask the kernel for
// permission to use the tile data state.
#include "ember/runtime/cpu_features.h"

#include <numa.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <vector>

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#endif

namespace ember::runtime {

namespace {

#if defined(__x86_64__)

struct CpuidRegisters {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
};

// All zero when the leaf is not supported.
CpuidRegisters cpuid(unsigned leaf, unsigned subleaf = 0) {
  CpuidRegisters r;
  if (__get_cpuid_count(leaf, subleaf, &r.eax, &r.ebx, &r.ecx, &r.edx) == 0) {
    return {};
  }
  return r;
}

bool bit(unsigned value, int index) { return ((value >> index) & 1u) != 0; }

// XCR0: the register state components the OS has enabled.
uint64_t read_xcr0() {
  unsigned eax = 0, edx = 0;
  // Raw opcode form avoids needing -mxsave for the _xgetbv intrinsic.
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

bool xcr0_has(uint64_t xcr0, std::initializer_list<int> bits) {
  return std::all_of(bits.begin(), bits.end(),
                     [&](int index) { return ((xcr0 >> index) & 1u) != 0; });
}

std::string trimmed(std::string text) {
  const auto is_space = [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\0';
  };
  while (!text.empty() && is_space(text.back())) text.pop_back();
  const auto first = std::find_if_not(text.begin(), text.end(), is_space);
  text.erase(text.begin(), first);
  return text;
}

std::string read_vendor() {
  const CpuidRegisters r = cpuid(0);
  char vendor[13] = {};
  std::memcpy(vendor + 0, &r.ebx, 4);
  std::memcpy(vendor + 4, &r.edx, 4);
  std::memcpy(vendor + 8, &r.ecx, 4);
  return trimmed(vendor);
}

std::string read_brand_string() {
  if (cpuid(0x80000000).eax < 0x80000004) return {};
  char brand[49] = {};
  for (unsigned i = 0; i < 3; ++i) {
    const CpuidRegisters r = cpuid(0x80000002 + i);
    std::memcpy(brand + 16 * i + 0, &r.eax, 4);
    std::memcpy(brand + 16 * i + 4, &r.ebx, 4);
    std::memcpy(brand + 16 * i + 8, &r.ecx, 4);
    std::memcpy(brand + 16 * i + 12, &r.edx, 4);
  }
  return trimmed(brand);
}

// Linux refuses AMX instructions (SIGILL) until the process asks for the
// dynamically enabled XTILEDATA state.
bool request_amx_permission() {
#if defined(__linux__)
  constexpr int kArchReqXcompPerm = 0x1023;
  constexpr int kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

CpuFeatures detect() {
  CpuFeatures f;
  f.vendor = read_vendor();
  f.model_name = read_brand_string();

  const CpuidRegisters leaf1 = cpuid(1);
  const CpuidRegisters leaf7 = cpuid(7, 0);
  // Subleaf 1 exists only if subleaf 0 reports it in EAX.
  const CpuidRegisters leaf7_1 =
      leaf7.eax >= 1 ? cpuid(7, 1) : CpuidRegisters{};

  f.sse4_2 = bit(leaf1.ecx, 20);

  const bool osxsave = bit(leaf1.ecx, 27);
  const uint64_t xcr0 = osxsave ? read_xcr0() : 0;
  const bool ymm_enabled = xcr0_has(xcr0, {1, 2});  // SSE, AVX
  const bool zmm_enabled = ymm_enabled && xcr0_has(xcr0, {5, 6, 7});  // k, ZMM
  const bool tiles_enabled = xcr0_has(xcr0, {17, 18});  // XTILECFG, XTILEDATA

  if (ymm_enabled) {
    f.avx = bit(leaf1.ecx, 28);
    f.fma = bit(leaf1.ecx, 12);
    f.f16c = bit(leaf1.ecx, 29);
    f.avx2 = bit(leaf7.ebx, 5);
    f.avx_vnni = bit(leaf7_1.eax, 4);
  }
  if (zmm_enabled) {
    f.avx512f = bit(leaf7.ebx, 16);
    f.avx512dq = bit(leaf7.ebx, 17);
    f.avx512bw = bit(leaf7.ebx, 30);
    f.avx512vl = bit(leaf7.ebx, 31);
    f.avx512_vnni = bit(leaf7.ecx, 11);
    f.avx512_fp16 = bit(leaf7.edx, 23);
    f.avx512_bf16 = bit(leaf7_1.eax, 5);
  }
  const bool amx_tile = bit(leaf7.edx, 24);
  if (tiles_enabled && amx_tile && request_amx_permission()) {
    f.amx_tile = true;
    f.amx_bf16 = bit(leaf7.edx, 22);
    f.amx_int8 = bit(leaf7.edx, 25);
  }
  return f;
}

#else  // !__x86_64__: no detection, every feature stays false.

CpuFeatures detect() { return {}; }

#endif

// The affinity mask of this process; grows the set for machines with more
// CPUs than a default cpu_set_t holds.
std::vector<int> read_allowed_cpus() {
  for (int ncpus = 1024; ncpus <= (1 << 20); ncpus *= 2) {
    cpu_set_t* set = CPU_ALLOC(ncpus);
    if (set == nullptr) break;
    const std::size_t bytes = CPU_ALLOC_SIZE(ncpus);
    CPU_ZERO_S(bytes, set);
    if (sched_getaffinity(0, bytes, set) == 0) {
      std::vector<int> cpus;
      for (int cpu = 0; cpu < ncpus; ++cpu) {
        if (CPU_ISSET_S(cpu, bytes, set)) cpus.push_back(cpu);
      }
      CPU_FREE(set);
      return cpus;
    }
    CPU_FREE(set);
    if (errno != EINVAL) break;  // EINVAL: mask too small, try a larger one
  }
  return {};
}

}  // namespace

std::string CpuFeatures::best_isa() const {
  if (amx_bf16) return "amx";
  if (avx512f && avx512bw && avx512vl) return "avx512";
  if (avx2 && fma) return "avx2";
  return "default";
}

bool cap_to_isa(CpuFeatures& f, const std::string& max_isa) {
  if (max_isa != "avx2" && max_isa != "avx512") return false;
  if (max_isa == "avx2") {
    f.avx512f = f.avx512bw = f.avx512vl = f.avx512dq = false;
    f.avx512_bf16 = f.avx512_vnni = f.avx512_fp16 = false;
  }
  f.amx_tile = f.amx_bf16 = f.amx_int8 = false;
  return true;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = [] {
    CpuFeatures f = detect();
    const char* max_isa = std::getenv("EMBER_MAX_ISA");
    if (max_isa != nullptr && *max_isa != '\0' && !cap_to_isa(f, max_isa)) {
      std::fprintf(stderr,
                   "ember: EMBER_MAX_ISA=%s ignored (expected avx2 or "
                   "avx512)\n",
                   max_isa);
    }
    return f;
  }();
  return features;
}

std::vector<int> allowed_cpus() { return read_allowed_cpus(); }

int available_cores() {
  const auto count = static_cast<int>(allowed_cpus().size());
  if (count > 0) return count;
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? static_cast<int>(online) : 1;
}

int numa_node_of_process() {
  if (numa_available() < 0) return 0;
  const std::vector<int> cpus = allowed_cpus();
  if (cpus.empty()) return 0;
  const int node = numa_node_of_cpu(cpus.front());
  return node >= 0 ? node : 0;
}

std::size_t physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<std::size_t>(pages) * static_cast<std::size_t>(page_size);
}

std::size_t l2_cache_bytes() {
  // glibc reads it from CPUID (leaf 4 on Intel, 0x80000006 on AMD).
  const long bytes = sysconf(_SC_LEVEL2_CACHE_SIZE);
  return bytes > 0 ? static_cast<std::size_t>(bytes) : 0;
}

}  // namespace ember::runtime
