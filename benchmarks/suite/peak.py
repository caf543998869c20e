"""The machine's physical limit: clock, FMA width, theoretical and measured FLOP/s.

theoretical FLOP/s = cores x clock x FLOPs/cycle/core, where

* clock is *measured*: a chain of dependent integer adds (one cycle each) in a
  tight loop of compiled C, timed (fallback: /proc/cpuinfo "cpu MHz");
* FLOPs/cycle/core = vector lanes x 2 (an FMA is two FLOPs) x FMA pipes. The
  lanes come from CPU feature detection (``torch_ember._C.cpu_features()``:
  AVX-512 -> 16 fp32 lanes, AVX2+FMA -> 8); the number of FMA pipes is not a
  CPUID flag, so it is measured: a loop of independent FMAs (16 accumulators)
  gives FLOPs/cycle, divided by lanes x 2 and rounded. bf16 with AVX512_BF16
  uses VDPBF16PS (16 lanes x 2 products x 2 = 64 FLOPs per instruction),
  measured the same way; AMX-BF16 counts 1024 FLOPs/cycle/core (one TDPBF16PS,
  16x16x32 MACs, per 16 cycles); without either, bf16 peak = fp32 peak.

Memory read bandwidth (STREAM-style, read only): a buffer of at least 4x the
L3 cache (all L3 instances together; >= 1 GiB) is split into one slice per
thread, each thread first-touches its own slice, then every repetition all
threads sum their slices at once (64-bit integer adds, AVX-512 / AVX2 loads,
4 accumulators) between two barriers; bandwidth = buffer bytes / time of the
fastest repetition. Measured with one thread per physical core, with one
thread, and with the suite's thread count. It bounds every workload that
streams its weights from memory (GPT-2 decode: all weights once per token).

The C source is compiled with the system compiler (``cc``) into a temporary
directory and loaded with ctypes; without a compiler the clock falls back to
/proc/cpuinfo and the pipe count to 2, and memory bandwidth is not measured
(said so in the report).
"""

from __future__ import annotations

import ctypes
import math
import os
import shutil
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

_C_SOURCE = r"""
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

/* 16 dependent adds per iteration: 16 cycles per iteration on any x86 core. */
double add_chain(long n) {
  uint64_t x = 0, one = 1;
  double t0 = now();
  for (long i = 0; i < n; i++) {
#define A "add %1, %0\n\t"
    __asm__ volatile(A A A A A A A A A A A A A A A A : "+r"(x) : "r"(one));
  }
  return now() - t0;
}

#define ACC 16
static volatile float sink;

__attribute__((target("avx512f"))) double fma512(long n) {
  __m512 acc[ACC];
  for (int k = 0; k < ACC; k++) acc[k] = _mm512_set1_ps((float)k);
  __m512 b = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  double t0 = now();
  for (long i = 0; i < n; i++)
    _Pragma("GCC unroll 16") for (int k = 0; k < ACC; k++) acc[k] = _mm512_fmadd_ps(acc[k], b, c);
  double t = now() - t0;
  float s = 0;
  for (int k = 0; k < ACC; k++) s += _mm512_reduce_add_ps(acc[k]);
  sink = s;
  return t;
}

/* AVX2 has 16 ymm registers: 12 accumulators + 2 operands stay in registers. */
#define ACC2 12
__attribute__((target("avx2,fma"))) double fma256(long n) {
  __m256 acc[ACC2];
  for (int k = 0; k < ACC2; k++) acc[k] = _mm256_set1_ps((float)k);
  __m256 b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  double t0 = now();
  for (long i = 0; i < n; i++)
    _Pragma("GCC unroll 12") for (int k = 0; k < ACC2; k++) acc[k] = _mm256_fmadd_ps(acc[k], b, c);
  double t = now() - t0;
  float out[8], s = 0;
  for (int k = 0; k < ACC2; k++) {
    _mm256_storeu_ps(out, acc[k]);
    for (int j = 0; j < 8; j++) s += out[j];
  }
  sink = s;
  return t;
}

#ifdef HAVE_BF16
__attribute__((target("avx512f,avx512bf16"))) double dpbf16(long n) {
  __m512 acc[ACC];
  for (int k = 0; k < ACC; k++) acc[k] = _mm512_set1_ps((float)k);
  __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80), b = (__m512bh)_mm512_set1_epi16(0x3380);
  double t0 = now();
  for (long i = 0; i < n; i++)
    _Pragma("GCC unroll 16") for (int k = 0; k < ACC; k++) acc[k] = _mm512_dpbf16_ps(acc[k], a, b);
  double t = now() - t0;
  float s = 0;
  for (int k = 0; k < ACC; k++) s += _mm512_reduce_add_ps(acc[k]);
  sink = s;
  return t;
}
#endif

/* ---- memory read bandwidth: every thread sums its slice, all at once ---- */

__attribute__((target("avx512f"))) static uint64_t sum512(const uint64_t* p, long n) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  long i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm512_add_epi64(a0, _mm512_load_si512((const void*)(p + i)));
    a1 = _mm512_add_epi64(a1, _mm512_load_si512((const void*)(p + i + 8)));
    a2 = _mm512_add_epi64(a2, _mm512_load_si512((const void*)(p + i + 16)));
    a3 = _mm512_add_epi64(a3, _mm512_load_si512((const void*)(p + i + 24)));
  }
  uint64_t s = _mm512_reduce_add_epi64(
      _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
  for (; i < n; i++) s += p[i];
  return s;
}

__attribute__((target("avx2"))) static uint64_t sum256(const uint64_t* p, long n) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  long i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i*)(p + i)));
    a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i*)(p + i + 4)));
    a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i*)(p + i + 8)));
    a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i*)(p + i + 12)));
  }
  uint64_t out[4], s = 0;
  _mm256_storeu_si256((__m256i*)out,
                      _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
  for (int k = 0; k < 4; k++) s += out[k];
  for (; i < n; i++) s += p[i];
  return s;
}

static uint64_t sum_scalar(const uint64_t* p, long n) {
  uint64_t s0 = 0, s1 = 0;
  long i = 0;
  for (; i + 2 <= n; i += 2) {
    s0 += p[i];
    s1 += p[i + 1];
  }
  for (; i < n; i++) s0 += p[i];
  return s0 + s1;
}

typedef struct {
  uint64_t* p;
  long n; /* 8-byte words */
  uint64_t sum;
} slice_t;

static pthread_barrier_t bw_start, bw_end;
static int bw_reps;
static uint64_t (*bw_sum)(const uint64_t*, long);
static volatile uint64_t bw_sink;

static void* bw_worker(void* arg) {
  slice_t* s = (slice_t*)arg;
  for (long i = 0; i < s->n; i++) s->p[i] = (uint64_t)i; /* first touch: this thread */
  pthread_barrier_wait(&bw_start);
  for (int r = 0; r < bw_reps; r++) {
    pthread_barrier_wait(&bw_start);
    s->sum += bw_sum(s->p, s->n);
    pthread_barrier_wait(&bw_end);
  }
  return NULL;
}

/* Best seconds for `threads` threads to read `bytes` once, over `reps` repetitions;
   a negative value on failure. */
double mem_read(long bytes, int threads, int reps) {
  if (threads < 1 || reps < 1) return -1;
  long per = (bytes / threads) & ~(long)4095; /* whole pages per thread */
  if (per < 4096) return -1;
  char* buf = NULL;
  if (posix_memalign((void**)&buf, 4096, (size_t)per * threads) != 0) return -2;
  slice_t* slices = calloc(threads, sizeof(slice_t));
  pthread_t* tids = calloc(threads, sizeof(pthread_t));
  if (!slices || !tids) return -2;
  __builtin_cpu_init();
  bw_sum = __builtin_cpu_supports("avx512f") ? sum512
           : __builtin_cpu_supports("avx2") ? sum256 : sum_scalar;
  bw_reps = reps;
  pthread_barrier_init(&bw_start, NULL, threads + 1);
  pthread_barrier_init(&bw_end, NULL, threads + 1);
  int started = 0;
  for (int t = 0; t < threads; t++) {
    slices[t].p = (uint64_t*)(buf + (size_t)per * t);
    slices[t].n = per / 8;
    if (pthread_create(&tids[t], NULL, bw_worker, &slices[t]) != 0) break;
    started++;
  }
  double best = -3;
  if (started == threads) {
    pthread_barrier_wait(&bw_start); /* slices touched */
    best = 1e30;
    for (int r = 0; r < reps; r++) {
      double t0 = now();
      pthread_barrier_wait(&bw_start);
      pthread_barrier_wait(&bw_end);
      double t = now() - t0;
      if (t < best) best = t;
    }
    for (int t = 0; t < threads; t++) {
      pthread_join(tids[t], NULL);
      bw_sink += slices[t].sum;
    }
  }
  /* on a failed pthread_create the started threads block forever: leak them, never
     free memory they may still touch */
  if (started == threads) {
    pthread_barrier_destroy(&bw_start);
    pthread_barrier_destroy(&bw_end);
    free(buf);
    free(slices);
    free(tids);
  }
  return best;
}
"""


@dataclass
class Peak:
    cpu_model: str
    cores: int  # physical cores
    flags: dict[str, bool]
    clock_ghz: float
    clock_method: str
    fp32_lanes: int
    fp32_flops_per_cycle: float  # theoretical, per core
    fp32_measured_flops_per_cycle: float | None  # FMA loop, one core
    bf16_flops_per_cycle: float
    bf16_measured_flops_per_cycle: float | None
    bf16_method: str
    fp32_fma_loop_all_cores: float | None = None  # FLOP/s, FMA loop on every core at once
    gemm_best: dict[str, dict] = field(default_factory=dict)  # dtype -> {n, flops_per_s}
    mem_read_bw: dict[int, float] = field(default_factory=dict)  # threads -> bytes/s
    mem_buffer_bytes: int | None = None
    mem_method: str = ""
    notes: list[str] = field(default_factory=list)

    def theoretical(self, dtype: torch.dtype, cores: int | None = None) -> float:
        """FLOP/s of ``cores`` cores (default: all) for ``dtype``."""
        per_cycle = (
            self.bf16_flops_per_cycle if dtype == torch.bfloat16 else self.fp32_flops_per_cycle
        )
        return (cores or self.cores) * self.clock_ghz * 1e9 * per_cycle

    def read_bandwidth(self, threads: int | None = None) -> tuple[int, float] | None:
        """(threads, bytes/s) of the read-bandwidth figure for ``threads`` threads
        (capped at the physical cores; default: all cores): that thread count if it
        was measured, else the all-cores figure."""
        bw = {int(k): v for k, v in self.mem_read_bw.items()}  # JSON turns keys into str
        if not bw:
            return None
        want = min(threads or self.cores, self.cores)
        if want in bw:
            return want, bw[want]
        n = self.cores if self.cores in bw else max(bw)
        return n, bw[n]


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown"


def cpu_flags() -> dict[str, bool]:
    try:
        import torch_ember

        return {k: v for k, v in torch_ember._C.cpu_features().items() if isinstance(v, bool)}
    except Exception:  # noqa: BLE001
        text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
        have = set(text.split())
        names = ["avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"]
        return {n: n in have for n in names}


def native_bf16() -> bool:
    """Whether the CPU has bf16 arithmetic. Without it (AVX2-only CPUs such as
    AMD Zen 3) CPU's bf16 GEMM runs scalar code: minutes for one 4096^3."""
    flags = cpu_flags()
    return bool(flags.get("avx512_bf16") or flags.get("amx_bf16"))


def physical_cores() -> int:
    try:
        return int(torch.ember.get_device_properties().cores)
    except Exception:  # noqa: BLE001
        return os.cpu_count() or 1


def _cpuinfo_mhz() -> float | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("cpu MHz"):
                return float(line.split(":", 1)[1])
    except (OSError, ValueError):
        pass
    return None


def l3_bytes() -> int | None:
    """Total L3 cache of the machine (each L3 instance once), from sysfs."""
    seen: dict[str, int] = {}
    for d in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cache/index[0-9]*"):
        try:
            if (d / "level").read_text().strip() != "3":
                continue
            size = (d / "size").read_text().strip().upper()
            shared = (d / "shared_cpu_list").read_text().strip()
        except OSError:
            continue
        mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1:], 1)
        try:
            seen[shared] = int(size.rstrip("KMG")) * mult
        except ValueError:
            continue
    if seen:
        return sum(seen.values())
    try:
        return int(os.sysconf("SC_LEVEL3_CACHE_SIZE")) or None
    except (ValueError, OSError):
        return None


def mem_buffer_bytes() -> int:
    """Read-bandwidth buffer: >= 4x the L3 cache and >= 1 GiB.

    A virtual machine reports its own share of L3; the host's may be much
    larger (a Zen 5 host read a 128 MiB buffer at 77 GB/s while 475 MB of
    decode weights streamed at 40 GB/s, the same as a 1 GiB read)."""
    return max(4 * (l3_bytes() or 32 * 2**20), 2**30)


def measure_read_bandwidth(lib, threads: int, nbytes: int, reps: int) -> float | None:
    """bytes/s of ``threads`` threads reading ``nbytes`` at once, best of ``reps``."""
    if lib is None or not hasattr(lib, "mem_read"):
        return None
    best = lib.mem_read(nbytes, threads, reps)
    if best <= 0:
        return None
    per = (nbytes // threads) & ~4095
    return per * threads / best


def _compile(bf16: bool) -> ctypes.CDLL | None:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return None
    tmp = Path(tempfile.mkdtemp(prefix="ember-peak-"))
    try:
        (tmp / "peak.c").write_text(_C_SOURCE)
        cmd = [cc, "-O3", "-shared", "-fPIC", "-pthread", str(tmp / "peak.c"), "-o"]
        cmd.append(str(tmp / "peak.so"))
        if bf16:
            cmd.insert(1, "-DHAVE_BF16")
        if subprocess.run(cmd, check=False, capture_output=True, timeout=120).returncode != 0:
            return None
        lib = ctypes.CDLL(str(tmp / "peak.so"))
        for name in ("add_chain", "fma512", "fma256", "dpbf16"):
            if hasattr(lib, name):
                getattr(lib, name).restype = ctypes.c_double
                getattr(lib, name).argtypes = [ctypes.c_long]
        lib.mem_read.restype = ctypes.c_double
        lib.mem_read.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_int]
        return lib
    except (OSError, subprocess.SubprocessError):
        return None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


_PROBE: list = []  # [(lib, FMA loop, FLOPs an iteration, iterations a call)] once built


def fma_probe(seconds: float = 0.004, calls: int = 5) -> float | None:
    """FLOP/s of a one-core fp32 FMA loop right now (median of ``calls`` calls
    of about ``seconds`` each, on the calling thread), or None without a C
    compiler. On a shared host a core's other tenants take its execution
    units for seconds at a time (the 2-core Zen 3 host on 2026-12-07: 19-29
    FLOPs a cycle of the 32 a quiet core gives); the suite runs it before and
    after timing each workload, so a run's report says how much of its cores
    the systems had."""
    if not _PROBE:
        lib = _compile(bf16=False)
        if lib is None:
            return None
        avx512 = cpu_flags().get("avx512f", False)
        fn, work = (lib.fma512, 16 * 16 * 2) if avx512 else (lib.fma256, 12 * 8 * 2)
        n = 10_000
        while fn(n) < seconds / 4 and n < 1 << 30:  # calibrate the call's length
            n *= 2
        n = max(1, int(n * seconds / max(fn(n), 1e-9)))
        _PROBE.append((lib, fn, work, n))
    _, fn, work, n = _PROBE[0]
    rates = sorted(n * work / fn(n) for _ in range(calls))
    return rates[len(rates) // 2]


def _best_rate(fn, n: int, work_per_iter: float, repeats: int = 5) -> float:
    """Best (work / second) over ``repeats`` calls of ``fn(n)``."""
    fn(n // 10)  # warm up: wake the core, settle the clock
    return max(n * work_per_iter / fn(n) for _ in range(repeats))


def _all_cores(fn, n: int, work: float, cores: int, repeats: int = 5) -> float:
    """(work / second) summed over ``cores`` threads running ``fn`` at once (ctypes drops
    the GIL). Each thread first warms up (wakes its core, settles the clock), then
    the threads start each of ``repeats`` timed calls together (a barrier); a
    thread's best call counts, as in :func:`_best_rate`. A single unwarmed call
    per thread, with threads starting at different moments, read below the
    one-core GEMMs."""
    rates = [0.0] * cores
    barrier = threading.Barrier(cores)

    def worker(index: int):
        fn(n // 4)  # warm up
        for _ in range(repeats):
            barrier.wait()
            rates[index] = max(rates[index], n * work / fn(n))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(cores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(rates)


def fma_pipes(
    one_core_per_cycle: float,
    all_cores_rate: float | None,
    cores: int,
    clock_ghz: float,
    lanes: int,
) -> int:
    """FMA pipes per core from the FMA loops: the fewest pipes that explain the
    better of the one-core loop and the all-core loop's rate per core.

    A loop can only fall short of the hardware, never exceed it: on a shared
    host a core's other tenants take execution units for seconds at a time (a
    2-core Intel Xeon on 2026-12-06: 44.5 FLOPs/cycle on one core, 55.2 per
    core in the all-core loop, of AVX-512's 32 a pipe; the 2-core Zen 3 host
    on 2026-12-07 21:13: both loops under 24 of AVX2's 16 a pipe, where a
    quiet core reads 32). Rounding read one pipe there and every "of peak"
    figure above 100%. A rate above one pipe's proves a second, less a margin
    for the clock measurement (an add chain timed in the same minutes)."""
    per_core = one_core_per_cycle
    if all_cores_rate:
        per_core = max(per_core, all_cores_rate / cores / (clock_ghz * 1e9))
    margin = 0.15  # of a pipe: the clock measurement's error
    return max(1, math.ceil(per_core / (lanes * 2) - margin))


def measure(
    quick: bool = False, gemm_sizes: list[int] | None = None, threads: int | None = None
) -> Peak:
    """The machine's limits; ``threads``: the suite's thread count (memory bandwidth is
    also measured at that count)."""
    flags = cpu_flags()
    cores = physical_cores()
    avx512 = flags.get("avx512f", False)
    lanes = 16 if avx512 else 8 if flags.get("avx2") and flags.get("fma") else 4
    has_bf16 = flags.get("avx512_bf16", False)
    lib = _compile(bf16=has_bf16) or (_compile(bf16=False) if has_bf16 else None)
    notes: list[str] = []
    n = 2_000_000 if quick else 10_000_000
    if lib is not None:
        clock = _best_rate(lib.add_chain, n, 16) / 1e9
        clock_method = "measured: timed chain of dependent integer adds (1 cycle each), one core"
    else:
        clock = (_cpuinfo_mhz() or 2000.0) / 1000
        clock_method = "/proc/cpuinfo cpu MHz (no C compiler for the add-chain measurement)"
    fma_measured = bf16_measured = all_cores = None
    fma = None
    if lib is not None and lanes >= 8:
        fma, accumulators = (lib.fma512, 16) if avx512 else (lib.fma256, 12)
        iters = n // 4
        rate = _best_rate(fma, iters, accumulators * lanes * 2)
        fma_measured = rate / (clock * 1e9)
        # Calls long enough (~4x the one-core ones) to dwarf thread start-up.
        all_cores = _all_cores(fma, iters * 4, accumulators * lanes * 2, cores)
    if fma_measured is not None:
        pipes = fma_pipes(fma_measured, all_cores, cores, clock, lanes)
    else:
        pipes = 2
        notes.append("FMA pipes not measured (no C compiler): assumed 2")
    fp32_per_cycle = float(lanes * 2 * pipes)
    if flags.get("amx_bf16"):
        bf16_per_cycle, bf16_method = 1024.0, "AMX-BF16: 1024 FLOPs/cycle/core (TDPBF16PS)"
    elif has_bf16 and lib is not None and hasattr(lib, "dpbf16"):
        rate = _best_rate(lib.dpbf16, n // 4, 16 * 64)
        bf16_measured = rate / (clock * 1e9)
        dp_pipes = max(1, round(bf16_measured / 64))
        bf16_per_cycle = 64.0 * dp_pipes
        bf16_method = f"AVX512_BF16 VDPBF16PS: 64 FLOPs x {dp_pipes} pipe(s) (measured)"
    elif has_bf16:
        bf16_per_cycle, bf16_method = 2 * fp32_per_cycle, "AVX512_BF16, assumed 2x fp32"
    else:
        bf16_per_cycle, bf16_method = fp32_per_cycle, "no native bf16 compute: = fp32"
    peak = Peak(
        cpu_model=cpu_model(),
        cores=cores,
        flags=flags,
        clock_ghz=clock,
        clock_method=clock_method,
        fp32_lanes=lanes,
        fp32_flops_per_cycle=fp32_per_cycle,
        fp32_measured_flops_per_cycle=fma_measured,
        bf16_flops_per_cycle=bf16_per_cycle,
        bf16_measured_flops_per_cycle=bf16_measured,
        bf16_method=bf16_method,
        fp32_fma_loop_all_cores=all_cores,
        notes=notes,
    )
    nbytes = mem_buffer_bytes()
    reps = 5 if quick else 10
    for t in sorted({1, cores, min(threads or cores, cores)}):
        bw = measure_read_bandwidth(lib, t, nbytes, reps)
        if bw is not None:
            peak.mem_read_bw[t] = bw
    if peak.mem_read_bw:
        l3 = l3_bytes()
        peak.mem_buffer_bytes = nbytes
        peak.mem_method = (
            f"sum of a {nbytes / 2**20:.0f} MiB buffer"
            + (f" ({nbytes / l3:.0f}x the {l3 / 2**20:.0f} MiB L3)" if l3 else "")
            + f", one slice per thread (first-touched by it), best of {reps}"
        )
    else:
        notes.append("memory read bandwidth not measured (no C compiler or the kernel failed)")
    peak.gemm_best = gemm_sweep(gemm_sizes or ([1024, 2048] if quick else [1024, 2048, 4096]))
    return peak


def gemm_sweep(sizes: list[int], repeats: int = 3) -> dict[str, dict]:
    """Best torch.mm FLOP/s on CPU (eager) over square sizes, fp32 and (where
    the CPU computes in bf16) bf16."""
    best: dict[str, dict] = {}
    dtypes = [(torch.float32, "fp32")] + ([(torch.bfloat16, "bf16")] if native_bf16() else [])
    for dtype, name in dtypes:
        for n in sizes:
            a = torch.randn(n, n).to(dtype)
            b = torch.randn(n, n).to(dtype)
            torch.mm(a, b)
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                torch.mm(a, b)
                times.append(time.perf_counter() - t0)
            rate = 2 * n**3 / min(times)
            if rate > best.get(name, {}).get("flops_per_s", 0):
                best[name] = {"n": n, "flops_per_s": rate}
    return best
