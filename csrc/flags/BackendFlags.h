// torch.backends.ember: the switches that change how ops run on ember.
// One process-wide value per flag (as torch.backends.cudnn), read on every
// op, so each is a relaxed atomic; Python sets them through torch_ember._C.
#pragma once

#include <cstdint>
#include <string>

namespace ember::flags {

// fp32 matmul/convolution arithmetic (the CPU counterpart of TF32).
enum class Fp32Precision : uint8_t {
  kIeee,    // plain fp32
  kBf16,    // inputs rounded to bf16, fp32 accumulation
  kBf16x3,  // inputs split into bf16 hi + lo, three bf16 products summed
};
const char* to_string(Fp32Precision precision);

// Which GEMM library ember's matmul family calls.
enum class BlasLibrary : uint8_t {
  kDefault,  // ATen's CPU choice (MKL for fp32): bitwise equal to CPU
  kMkl,
  kOneDnn,
};
const char* to_string(BlasLibrary library);

enum class FallbackPolicy : uint8_t { kAllow, kWarn, kError };
const char* to_string(FallbackPolicy policy);

// CPU parity: every op runs CPU's own ATen kernel (bitwise equal to CPU).
// Off by default: ember runs its fastest correct kernels (packed GEMM,
// skinny-GEMM streaming, ...), equal to CPU within OpInfo's tolerances.
// EMBER_CPU_PARITY=1 sets it at start-up.
bool cpu_parity();
void set_cpu_parity(bool on);

// Asynchronous execution: ops whose result layout ember knows before they
// run are queued on their stream and return at once (docs/engine.md).
// On by default where the process has at least 2
// cores (on one there is nothing to overlap); EMBER_ASYNC=0/1 decides at
// start-up, EMBER_LAUNCH_BLOCKING=1 turns it off. Never changes a result.
bool async_execution();
void set_async_execution(bool on);

// Elementwise chains: ember's fp32 elementwise kernels (add, sub, mul, div,
// relu, tanh, pow 2 and 3) launched one after another over the same
// elements are held on the stream and run as one pass, tile by tile, and
// results nobody holds any more are never written (docs/engine.md, "Held
// work and elementwise chains"). On by default; EMBER_FUSE_ELEMENTWISE=0/1
// decides at start-up. Never changes a result (the same kernels, element by
// element).
bool fuse_elementwise();
void set_fuse_elementwise(bool on);

// Determinism: ember's own switch or torch.use_deterministic_algorithms.
bool deterministic();
bool deterministic_flag();  // ember's switch alone
void set_deterministic(bool on);
// Under determinism, an op without a deterministic ember kernel: raises
// RuntimeError (or warns with warn_only) exactly as CUDA does.
void alert_not_deterministic(const char* op);

// Autotuning of convolution and matmul algorithms.
bool benchmark();
void set_benchmark(bool on);
int64_t benchmark_limit();  // 0 = unbounded
void set_benchmark_limit(int64_t limit);

// The precision ember uses now: its explicit setting, or the one
// torch.set_float32_matmul_precision implies when left unset.
Fp32Precision matmul_fp32_precision();
Fp32Precision conv_fp32_precision();
// "none" means follow torch's global setting.
bool matmul_fp32_precision_is_set();
// Whether matmul follows torch's setting and that is "medium": permission to
// compute in bf16, which matmul_fp32_precision() takes only where the CPU
// has bf16 arithmetic, and skinny GEMMs take everywhere (they stream their
// weight: bf16 panels halve the bytes, widened to fp32 in registers).
bool matmul_medium_from_torch();
std::string matmul_fp32_precision_setting();
std::string conv_fp32_precision_setting();
void set_matmul_fp32_precision(const std::string& value);  // "none" resets
void set_conv_fp32_precision(const std::string& value);
// Whether "high" resolves to bf16x3 on this CPU: only where bf16 products
// with an fp32 result run on AMX (AMX-BF16 granted by the OS); elsewhere
// bf16x3 measured slower than fp32 and "high" means ieee. Decided from
// CPUID once, so it is the same in every process on one machine.
bool bf16x3_is_faster();
void set_bf16x3_is_faster(bool faster);

BlasLibrary blas_library();
void set_blas_library(BlasLibrary library);

int verbose_level();
void set_verbose_level(int level);

FallbackPolicy fallback_policy();
void set_fallback_policy(FallbackPolicy policy);

}  // namespace ember::flags
