#include "flags/BackendFlags.h"

#include <ATen/Context.h>
#include <c10/util/Exception.h>
#include <sched.h>

#include <atomic>

#include "ember/runtime/cpu_features.h"
#include "ember/runtime/stream.h"
#include "flags/Environment.h"

namespace ember::flags {
namespace {

// -1 in a precision slot means "not set: follow torch's global setting".
constexpr int8_t kFollowGlobal = -1;

// Launching needs a core for the host thread beside the kernels' threads
// some of the time: on one core there is nothing to overlap. Measured on 2
// cores (ember-async vs ember-sync in one run, since the skinny GEMM stopped
// waiting at OpenMP barriers for a thread the host displaced): batch-1 MLP
// 0.81x, GPT-2 decode 0.77x, the compute-bound workloads 0.98-1.02x.
bool async_by_default() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return false;
  return CPU_COUNT(&set) >= 2;
}
std::atomic<bool> g_async_execution{
    env_switch("EMBER_ASYNC", "async_execution").value_or(async_by_default()) &&
    !runtime::launch_blocking()};
std::atomic<bool> g_cpu_parity{
    env_switch("EMBER_CPU_PARITY", "cpu_parity").value_or(false)};
std::atomic<bool> g_fuse_elementwise{
    env_switch("EMBER_FUSE_ELEMENTWISE", "fuse_elementwise").value_or(true)};
std::atomic<bool> g_deterministic{false};
std::atomic<bool> g_benchmark{false};
std::atomic<int64_t> g_benchmark_limit{100};
std::atomic<int8_t> g_matmul_precision{kFollowGlobal};
std::atomic<int8_t> g_conv_precision{kFollowGlobal};
// AMX's bf16 products with fp32 results are what make bf16x3 pay off.
std::atomic<bool> g_bf16x3_faster{runtime::cpu_features().amx_bf16};
std::atomic<uint8_t> g_blas{static_cast<uint8_t>(BlasLibrary::kDefault)};

std::atomic<int> g_verbose{env_verbose_level().value_or(0)};

FallbackPolicy initial_fallback_policy() {
  // Both are read (and validated) whatever the other holds.
  // EMBER_STRICT=1 predates the policy flag and still means "error".
  const bool strict = env_switch("EMBER_STRICT", "strict").value_or(false);
  const auto policy = env_fallback_policy();
  if (strict) return FallbackPolicy::kError;
  if (policy == "warn") return FallbackPolicy::kWarn;
  if (policy == "error") return FallbackPolicy::kError;
  return FallbackPolicy::kAllow;
}
std::atomic<uint8_t> g_fallback{
    static_cast<uint8_t>(initial_fallback_policy())};

int8_t parse_precision(const std::string& value) {
  if (value == "none") return kFollowGlobal;
  if (value == "ieee") return static_cast<int8_t>(Fp32Precision::kIeee);
  if (value == "bf16") return static_cast<int8_t>(Fp32Precision::kBf16);
  if (value == "bf16x3") return static_cast<int8_t>(Fp32Precision::kBf16x3);
  TORCH_CHECK_VALUE(false, "fp32_precision must be one of 'ieee', 'bf16', ",
                    "'bf16x3' or 'none', got '", value, "'");
}

std::string precision_setting(int8_t stored) {
  return stored == kFollowGlobal
             ? "none"
             : to_string(static_cast<Fp32Precision>(stored));
}

bool native_bf16() {
  static const bool supported =
      runtime::cpu_features().avx512_bf16 || runtime::cpu_features().amx_bf16;
  return supported;
}

Fp32Precision resolve(int8_t stored) {
  if (stored != kFollowGlobal) return static_cast<Fp32Precision>(stored);
  switch (at::globalContext().float32MatmulPrecision()) {
    case at::Float32MatmulPrecision::HIGHEST:
      return Fp32Precision::kIeee;
    case at::Float32MatmulPrecision::MEDIUM:
      // As on CPU, "medium" is a permission, taken where it pays: without
      // bf16 arithmetic (AVX2-only CPUs) bf16 GEMMs run scalar code, ~100x
      // slower than fp32, so it stays fp32 there (an explicit "bf16" is
      // still obeyed).
      return native_bf16() ? Fp32Precision::kBf16 : Fp32Precision::kIeee;
    case at::Float32MatmulPrecision::HIGH:
      return g_bf16x3_faster.load(std::memory_order_relaxed)
                 ? Fp32Precision::kBf16x3
                 : Fp32Precision::kIeee;
  }
  return Fp32Precision::kIeee;
}

}  // namespace

const char* to_string(Fp32Precision precision) {
  switch (precision) {
    case Fp32Precision::kIeee:
      return "ieee";
    case Fp32Precision::kBf16:
      return "bf16";
    case Fp32Precision::kBf16x3:
      return "bf16x3";
  }
  return "?";
}

const char* to_string(BlasLibrary library) {
  switch (library) {
    case BlasLibrary::kDefault:
      return "default";
    case BlasLibrary::kMkl:
      return "mkl";
    case BlasLibrary::kOneDnn:
      return "onednn";
  }
  return "?";
}

const char* to_string(FallbackPolicy policy) {
  switch (policy) {
    case FallbackPolicy::kAllow:
      return "allow";
    case FallbackPolicy::kWarn:
      return "warn";
    case FallbackPolicy::kError:
      return "error";
  }
  return "?";
}

bool async_execution() {
  return g_async_execution.load(std::memory_order_relaxed);
}
void set_async_execution(bool on) { g_async_execution.store(on); }

bool fuse_elementwise() {
  return g_fuse_elementwise.load(std::memory_order_relaxed);
}
void set_fuse_elementwise(bool on) { g_fuse_elementwise.store(on); }

bool cpu_parity() { return g_cpu_parity.load(std::memory_order_relaxed); }
void set_cpu_parity(bool on) { g_cpu_parity.store(on); }

bool deterministic() {
  return g_deterministic.load(std::memory_order_relaxed) ||
         at::globalContext().deterministicAlgorithms();
}
bool deterministic_flag() { return g_deterministic.load(); }
void set_deterministic(bool on) { g_deterministic.store(on); }

void alert_not_deterministic(const char* op) {
  if (at::globalContext().deterministicAlgorithms()) {
    // Same message, error type and warn_only handling as CUDA's kernels.
    at::globalContext().alertNotDeterministic(op);
    return;
  }
  if (g_deterministic.load(std::memory_order_relaxed)) {
    TORCH_CHECK(false, op,
                " does not have a deterministic implementation on ember, but "
                "you set 'torch.backends.ember.deterministic = True'. Turn it "
                "off for this operation, or use "
                "torch.use_deterministic_algorithms(True, warn_only=True) to "
                "be warned instead.");
  }
}

bool benchmark() { return g_benchmark.load(std::memory_order_relaxed); }
void set_benchmark(bool on) { g_benchmark.store(on); }
int64_t benchmark_limit() { return g_benchmark_limit.load(); }
void set_benchmark_limit(int64_t limit) {
  TORCH_CHECK_VALUE(limit >= 0, "benchmark_limit must be >= 0, got ", limit);
  g_benchmark_limit.store(limit);
}

Fp32Precision matmul_fp32_precision() {
  return resolve(g_matmul_precision.load(std::memory_order_relaxed));
}
Fp32Precision conv_fp32_precision() {
  const int8_t stored = g_conv_precision.load(std::memory_order_relaxed);
  if (stored != kFollowGlobal) return static_cast<Fp32Precision>(stored);
  // "none" follows what CPU's convolutions follow: torch.backends.mkldnn's
  // conv precision (its "none" resolved through mkldnn's and the generic
  // fp32_precision by ATen), not set_float32_matmul_precision, which leaves
  // CPU's convolutions in fp32. bf16 is taken where the CPU has bf16
  // arithmetic, as for matmuls.
  const at::Float32Precision torch_precision =
      at::globalContext().float32Precision(at::Float32Backend::MKLDNN,
                                           at::Float32Op::CONV);
  return torch_precision == at::Float32Precision::BF16 && native_bf16()
             ? Fp32Precision::kBf16
             : Fp32Precision::kIeee;
}
bool matmul_fp32_precision_is_set() {
  return g_matmul_precision.load(std::memory_order_relaxed) != kFollowGlobal;
}
bool matmul_medium_from_torch() {
  return !matmul_fp32_precision_is_set() &&
         at::globalContext().float32MatmulPrecision() ==
             at::Float32MatmulPrecision::MEDIUM;
}
std::string matmul_fp32_precision_setting() {
  return precision_setting(g_matmul_precision.load());
}
std::string conv_fp32_precision_setting() {
  return precision_setting(g_conv_precision.load());
}
void set_matmul_fp32_precision(const std::string& value) {
  g_matmul_precision.store(parse_precision(value));
}
void set_conv_fp32_precision(const std::string& value) {
  // No bf16 convolution with an fp32 result is reachable through ATen, so a
  // three-term split would round each term to bf16: refused, not faked.
  TORCH_CHECK_VALUE(value != "bf16x3",
                    "conv.fp32_precision must be one of 'ieee', 'bf16' or ",
                    "'none' ('bf16x3' is for matmul only), got '", value, "'");
  g_conv_precision.store(parse_precision(value));
}
bool bf16x3_is_faster() { return g_bf16x3_faster.load(); }
void set_bf16x3_is_faster(bool faster) { g_bf16x3_faster.store(faster); }

BlasLibrary blas_library() {
  return static_cast<BlasLibrary>(g_blas.load(std::memory_order_relaxed));
}
void set_blas_library(BlasLibrary library) {
  g_blas.store(static_cast<uint8_t>(library));
}

int verbose_level() { return g_verbose.load(std::memory_order_relaxed); }
void set_verbose_level(int level) {
  TORCH_CHECK_VALUE(level >= 0 && level <= 2,
                    verbose_level_message(std::to_string(level)));
  g_verbose.store(level);
}

FallbackPolicy fallback_policy() {
  return static_cast<FallbackPolicy>(
      g_fallback.load(std::memory_order_relaxed));
}
void set_fallback_policy(FallbackPolicy policy) {
  g_fallback.store(static_cast<uint8_t>(policy));
}

}  // namespace ember::flags
