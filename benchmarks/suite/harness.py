"""Runs workloads on systems: prepare, check against CPU eager, time interleaved.

For one workload:

1. every system is prepared in turn (export / compile / copy to device), run
   once (which may finish compiling) and warmed up; the preparation time, the
   peak RSS growth over that phase and, for ember, the peak of ember memory
   the system itself allocated (``max_memory_allocated`` less what was
   already allocated: the systems prepared before it stay alive for the
   interleaved timing, and count for nothing here) are recorded; a system
   that raises ``Skip`` or fails is recorded with the reason and left out;
2. the output of each system's first run is compared with CPU eager's:
   ``max |out - ref|`` and that divided by ``max |ref|``; above the
   workload's tolerance the system is WRONG and is not ranked. The output of
   each system's last timed run is compared the same way after timing (a
   system whose timed runs go wrong, e.g. stale cached state, is WRONG too);
3. timing: one *sample* is ``number`` back-to-back runs (garbage collector
   off; ``number`` calibrated so a sample lasts >= ``sample_s``; a system's
   ``mode``, if it has one, entered once around them), yielding the mean
   time per run. Rounds take one sample of every system, in an order that
   rotates each round, so drift of the machine hits all alike. Rounds go on
   until ``rounds`` rounds, or until the time budget is spent once
   ``min_rounds`` are done. Reported: median, p10, p90, IQR of the samples.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import math
import os
import statistics
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

import torch

from . import peak
from . import workloads as wl
from .systems import SYSTEMS, Prepared, Skip, System

REFERENCE = "cpu-eager"
# Systems whose fp32 GEMMs take bf16 products (torch's "medium" precision):
# their GEMM rates are no fp32 figure and never the best against the fp32 peak.
REDUCED_PRECISION_SYSTEMS = frozenset({"ember-medium"})


@dataclass
class Settings:
    threads: int
    rounds: int = 20  # stop after this many rounds ...
    min_rounds: int = 5  # ... or once the budget is spent and this many are done
    budget_s: float = 30.0  # per workload, timing phase
    warmup: int = 2  # runs after the first one, before timing
    sample_s: float = 0.02  # a sample lasts at least this long (number >= 1)
    pause_s: float = 0.005  # idle between samples (lets spinning worker threads sleep)
    settle_max_s: float = 0.25  # ... and then up to this long until the other threads idle
    wait_idle_s: float = 0.0  # before timing, wait up to this long for other load < 0.15 cores
    fma_probe: bool = True  # time a one-core FMA loop before and after timing each workload
    tiny: bool = False


@dataclass
class SystemResult:
    system: str
    status: str  # "ok", "WRONG", "skip", "error"
    reason: str = ""
    notes: list[str] = field(default_factory=list)
    prepare_s: float | None = None  # preparation + first run
    first_run_s: float | None = None
    peak_rss_delta: int | None = None  # bytes, VmHWM after warm-up - VmRSS before preparing
    ember_max_allocated: int | None = None
    max_abs_diff: float | None = None
    rel_err: float | None = None
    number: int = 0
    samples_s: list[float] = field(default_factory=list)  # per run
    median_s: float | None = None  # per unit (run / per_run)
    min_s: float | None = None
    p10_s: float | None = None
    p90_s: float | None = None
    iqr_s: float | None = None
    ratio: float | None = None  # median / CPU eager median
    gflops: float | None = None
    frac_peak: float | None = None
    weights_bytes_per_s: float | None = None  # decode: parameter bytes per token / time
    frac_mem_bw: float | None = None  # ... over the measured memory read bandwidth
    rank: int | None = None


@dataclass
class WorkloadResult:
    name: str
    title: str
    dtype: str
    unit: str
    per_run: int
    params: int
    flops: float | None  # per run
    rtol: float
    notes: list[str]
    systems: list[SystemResult]
    rounds: int = 0
    timing_s: float = 0.0
    other_load: float | None = None  # CPU cores busy with other processes while timing
    waited_s: float = 0.0  # waited for the machine to go idle before timing
    streamed_bytes: int = 0  # parameter bytes a run reads whole (Workload.streamed_bytes)
    # FLOP/s of a one-core FMA loop just before and just after timing
    # (peak.fma_probe): what the host's other tenants left of a core
    fma_probe_flops: list[float] = field(default_factory=list)

    def get(self, system: str) -> SystemResult | None:
        return next((s for s in self.systems if s.system == system), None)

    def best_baseline(self) -> SystemResult | None:
        """The fastest correct system that is not ember."""
        ok = [
            s
            for s in self.systems
            if s.status == "ok" and not s.system.startswith("ember") and s.median_s
        ]
        return min(ok, key=lambda s: s.median_s) if ok else None


# --------------------------------------------------------------------------- memory


def _statm_rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _vm_hwm() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_hwm() -> bool:
    """Resets VmHWM to the current RSS (Linux >= 4.0: write 5 to clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _cpu_jiffies() -> tuple[int, int] | None:
    """(busy jiffies of the whole machine, jiffies of this process), from /proc."""
    try:
        with open("/proc/stat") as f:
            vals = [int(v) for v in f.readline().split()[1:9]]
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return sum(vals) - vals[3] - vals[4], int(fields[11]) + int(fields[12])
    except (OSError, ValueError, IndexError):
        return None


def wait_idle(max_s: float, threshold: float = 0.15, window_s: float = 1.0) -> float:
    """Waits (up to ``max_s``) until other processes use < ``threshold`` cores; returns the wait."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < max_s:
        a = _cpu_jiffies()
        time.sleep(window_s)
        b = _cpu_jiffies()
        if a is None or b is None:
            break
        other = ((b[0] - a[0]) - (b[1] - a[1])) / os.sysconf("SC_CLK_TCK") / window_s
        if other < threshold:
            break
    return time.perf_counter() - t0


def _other_threads_running() -> bool | None:
    """Whether a thread of this process other than the calling one is runnable
    (state R); None where /proc cannot tell."""
    me = str(threading.get_native_id())
    try:
        for tid in os.listdir("/proc/self/task"):
            if tid == me:
                continue
            try:
                with open(f"/proc/self/task/{tid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "R":
                        return True
            except (OSError, IndexError):
                continue  # the thread ended
    except OSError:
        return None
    return False


def settle_threads(max_s: float, quiet_polls: int = 3, poll_s: float = 0.001) -> float:
    """Waits (up to ``max_s``) until no other thread of the process is runnable in
    ``quiet_polls`` polls in a row. Runtimes' worker threads spin after a run
    (ONNX Runtime's for tens of ms) and would take a core from the system timed
    next. Thread states, not CPU times: a spinning thread's CPU time is only
    brought up to date at the scheduler's tick. Returns the wait."""
    t0 = time.perf_counter()
    quiet = 0
    while quiet < quiet_polls and time.perf_counter() - t0 < max_s:
        running = _other_threads_running()
        if running is None:
            break
        quiet = 0 if running else quiet + 1
        time.sleep(poll_s)
    return time.perf_counter() - t0


def _trim() -> None:
    gc.collect()
    if hasattr(torch, "ember"):
        torch.ember.empty_cache()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


# --------------------------------------------------------------------------- checks, stats


def _flatten(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out for t in _flatten(o)]


def compare(ref: Iterable, out: Iterable, rtol: float) -> tuple[float, float, str]:
    """max |out - ref| over all output tensors, that over max |ref|, and a note."""
    ref_t, out_t = _flatten(ref), [t.cpu() for t in _flatten(out)]
    if len(ref_t) != len(out_t):
        return math.inf, math.inf, f"{len(out_t)} outputs, expected {len(ref_t)}"
    diff, scale = 0.0, 0.0
    for r, o in zip(ref_t, out_t):
        if r.shape != o.shape:
            return math.inf, math.inf, f"shape {tuple(o.shape)}, expected {tuple(r.shape)}"
        if not r.is_floating_point():
            if not torch.equal(r, o.to(r.dtype)):
                return math.inf, math.inf, "integer outputs differ"
            continue
        d = (o.double() - r.double()).abs().max() if r.numel() else torch.tensor(0.0)
        diff = max(diff, float(d) if not torch.isnan(d) else math.inf)
        scale = max(scale, float(r.double().abs().max()) if r.numel() else 0.0)
    return diff, diff / (scale or 1.0), ""


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def count_flops(w: wl.Workload) -> float | None:
    """FLOPs of one run by torch.utils.flop_counter on CPU eager (matmul/conv/attention)."""
    from torch.utils.flop_counter import FlopCounterMode

    try:
        with torch.inference_mode(), FlopCounterMode(display=False) as counter:
            w.driver(w.module, w.inputs)
        return float(counter.get_total_flops())
    except Exception:  # noqa: BLE001
        return None


def _sample(prepared: Prepared, number: int) -> tuple[float, object]:
    """Mean seconds per run over ``number`` back-to-back runs, and the last
    run's output. A system with a ``mode`` enters it once, outside the timing."""
    enabled = gc.isenabled()
    gc.disable()
    mode = prepared.mode() if prepared.mode is not None else contextlib.nullcontext()
    run = prepared.run_in_mode if prepared.mode is not None else prepared.run
    try:
        with mode:
            out = None
            t0 = time.perf_counter()
            for _ in range(number):
                out = run()
            return (time.perf_counter() - t0) / number, out
    finally:
        if enabled:
            gc.enable()


# --------------------------------------------------------------------------- one workload


def _prepare(
    sys_: System, w: wl.Workload, s: Settings, ref: tuple | None
) -> tuple[SystemResult, Prepared | None, tuple | None]:
    res = SystemResult(system=sys_.name, status="ok")
    _trim()
    have_hwm = _reset_hwm()
    rss0 = _statm_rss()
    ember = hasattr(torch, "ember")
    if ember:
        torch.ember.reset_peak_memory_stats()
        # Held by the systems prepared before this one (alive until timing
        # ends): not this system's memory.
        ember_before = torch.ember.memory_allocated()
    t0 = time.perf_counter()
    try:
        prepared = sys_.fn(w, s.threads)
        t1 = time.perf_counter()
        out = prepared.run()
        t2 = time.perf_counter()
        for _ in range(s.warmup):
            prepared.run()
    except Skip as e:
        res.status, res.reason = "skip", str(e)
        return res, None, None
    except Exception as e:  # noqa: BLE001 - a failing system is reported, not fatal
        res.status = "error"
        res.reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e) else ''}"
        if os.environ.get("EMBER_BENCH_TRACEBACK"):
            traceback.print_exc()
        return res, None, None
    res.prepare_s, res.first_run_s = t2 - t0, t2 - t1
    hwm = _vm_hwm() if have_hwm else None
    res.peak_rss_delta = max(0, (hwm if hwm is not None else _statm_rss()) - rss0)
    if ember and sys_.name.startswith("ember"):
        res.ember_max_allocated = int(torch.ember.max_memory_allocated()) - ember_before
    res.notes = list(prepared.notes)
    if ref is not None:
        res.max_abs_diff, res.rel_err = _check_output(res, prepared, w, ref, out, "")
    out_cpu = tuple(t.cpu() for t in _flatten(out))
    return res, prepared, out_cpu


def _check_output(
    res: SystemResult, prepared: Prepared, w: wl.Workload, ref: tuple, out, when: str
) -> tuple[float, float]:
    """Compares ``out`` with CPU eager's ``ref``; outside the tolerance the
    system becomes WRONG (``when`` names the run in the reason)."""
    cmp = w.compare or compare
    rtol = prepared.rtol if prepared.rtol is not None else w.rtol
    max_abs, rel_err, note = cmp(ref, out, rtol)
    if note:
        res.notes.append(when + note)
    if not rel_err <= rtol and res.status != "WRONG":  # also catches NaN
        res.status = "WRONG"
        res.reason = f"{when}max|diff|/max|ref| = {rel_err:.3g} > tolerance {rtol:g}"
    return max_abs, rel_err


def run_workload(
    name: str,
    systems: list[System],
    s: Settings,
    progress: Callable[..., None] = lambda msg, advance=0: None,
) -> WorkloadResult:
    w = wl.build(name, tiny=s.tiny)
    for m in w.module.modules():
        assert not m.training, f"{name}: {type(m).__name__} is in training mode"
    if not systems or systems[0].name != REFERENCE:
        raise ValueError(f"the first system must be {REFERENCE} (the reference)")
    result = WorkloadResult(
        name=w.name,
        title=w.title,
        dtype=str(w.dtype).replace("torch.", ""),
        unit=w.unit,
        per_run=w.per_run,
        params=w.params,
        flops=count_flops(w),
        rtol=w.rtol,
        notes=list(w.notes),
        systems=[],
        streamed_bytes=w.streamed_bytes,
    )
    prepared: dict[str, Prepared] = {}
    ref = None
    _trim()
    if hasattr(torch, "ember") and torch.ember.memory_allocated():
        # Nothing may carry over from the workloads before; it would be
        # excluded from the max-alloc figures anyway, but it is a leak.
        result.notes.append(
            f"{torch.ember.memory_allocated() / 2**20:.1f} MiB of ember memory still "
            "allocated from earlier workloads"
        )
    for sys_ in systems:
        progress(f"{name}: preparing {sys_.name}")
        res, prep, out = _prepare(sys_, w, s, ref)
        progress(f"{name}: prepared {sys_.name} ({res.status})", 1)
        if sys_.name == REFERENCE:
            if prep is None:
                raise RuntimeError(f"{REFERENCE} failed on {name}: {res.reason}")
            ref = out
            res.max_abs_diff, res.rel_err = 0.0, 0.0
        result.systems.append(res)
        if prep is not None:
            prepared[sys_.name] = prep
    if s.wait_idle_s > 0:
        progress(f"{name}: waiting for other load to stop")
        result.waited_s = wait_idle(s.wait_idle_s)
    progress(f"{name}: timing")
    last_outputs = _time(prepared, result, s, progress)
    for n, out in last_outputs.items():  # a timed run's output is checked too
        _check_output(result.get(n), prepared[n], w, ref, out, "timed run: ")
    del last_outputs
    progress(f"{name}: done", 1)
    _summarize(result, prepared)
    for prep in prepared.values():
        if prep.close is not None:
            prep.close()
    prepared.clear()
    _trim()
    return result


def _time(
    prepared: dict[str, Prepared],
    result: WorkloadResult,
    s: Settings,
    progress: Callable[..., None],
) -> dict[str, object]:
    """Times the systems; returns each one's output of its last timed run."""
    names = list(prepared)
    numbers = {}
    last_outputs: dict[str, object] = {}
    for n in names:  # calibrate: a sample lasts >= sample_s
        # the fastest of three single runs: one slow first run (a pack made,
        # a cold cache) must not leave a system at one run per sample
        one = min(_sample(prepared[n], 1)[0] for _ in range(3))
        numbers[n] = max(1, min(10_000, math.ceil(s.sample_s / max(one, 1e-7))))
    samples: dict[str, list[float]] = {n: [] for n in names}
    _probe_cores(result, s)
    t0 = time.perf_counter()
    jiffies0 = _cpu_jiffies()
    rounds = 0
    while names:
        k = rounds % len(names)
        for n in names[k:] + names[:k]:
            try:
                seconds, last_outputs[n] = _sample(prepared[n], numbers[n])
                samples[n].append(seconds)
            except Exception as e:  # noqa: BLE001
                res = result.get(n)
                res.status, res.reason = "error", f"during timing: {type(e).__name__}: {e}"[:300]
                names.remove(n)
            time.sleep(s.pause_s)
            settle_threads(s.settle_max_s)
        rounds += 1
        elapsed = time.perf_counter() - t0
        progress(f"{result.name}: timing, round {rounds}")
        if rounds >= s.rounds or (rounds >= s.min_rounds and elapsed >= s.budget_s):
            break
    result.rounds, result.timing_s = rounds, time.perf_counter() - t0
    jiffies1 = _cpu_jiffies()
    if jiffies0 and jiffies1 and result.timing_s > 0:
        other = (jiffies1[0] - jiffies0[0]) - (jiffies1[1] - jiffies0[1])
        result.other_load = max(0.0, other / os.sysconf("SC_CLK_TCK") / result.timing_s)
    for n, xs in samples.items():
        res = result.get(n)
        res.number, res.samples_s = numbers[n], xs
    _probe_cores(result, s)
    return {n: out for n, out in last_outputs.items() if n in names}


def _probe_cores(result: WorkloadResult, s: Settings) -> None:
    """Appends a one-core FMA loop's rate (peak.fma_probe), once the systems'
    own threads have gone idle."""
    if not s.fma_probe:
        return
    settle_threads(s.settle_max_s)
    rate = peak.fma_probe()
    if rate is not None:
        result.fma_probe_flops.append(rate)


def _summarize(result: WorkloadResult, prepared: dict[str, Prepared]) -> None:
    per = result.per_run
    for res in result.systems:
        if res.samples_s and res.status in ("ok", "WRONG"):
            xs = [x / per for x in res.samples_s]
            res.median_s, res.min_s = statistics.median(xs), min(xs)
            res.p10_s, res.p90_s = _quantile(xs, 0.1), _quantile(xs, 0.9)
            res.iqr_s = _quantile(xs, 0.75) - _quantile(xs, 0.25)
            if result.flops:
                res.gflops = result.flops / (res.median_s * per) / 1e9
    ref = result.get(REFERENCE)
    for res in result.systems:
        if res.median_s and ref and ref.median_s:
            res.ratio = res.median_s / ref.median_s
    ranked = sorted(
        (r for r in result.systems if r.status == "ok" and r.median_s), key=lambda r: r.median_s
    )
    for i, r in enumerate(ranked, 1):
        r.rank = i


def apply_peak(
    result: WorkloadResult, peak_flops: float | None, bf16_peak_flops: float | None = None
) -> None:
    """Fraction of the workload dtype's peak; a reduced-precision system's is of
    the bf16 peak (its products are bf16) when that is given."""
    for res in result.systems:
        peak = peak_flops
        if res.system in REDUCED_PRECISION_SYSTEMS and bf16_peak_flops:
            peak = bf16_peak_flops
        if res.gflops is not None and peak:
            res.frac_peak = res.gflops * 1e9 / peak


def streams_weights(result: WorkloadResult) -> bool:
    """Whether a run reads every weight once per unit: the decode workloads (per token)."""
    return result.unit == "token" and result.streamed_bytes > 0


def apply_bandwidth(result: WorkloadResult, read_bytes_per_s: float | None) -> None:
    """Decode: weights streamed per second (streamed parameter bytes per token / median
    time per token) and that as a fraction of the measured memory read bandwidth."""
    if not streams_weights(result):
        return
    for res in result.systems:
        if res.median_s:
            res.weights_bytes_per_s = result.streamed_bytes / res.median_s
            if read_bytes_per_s:
                res.frac_mem_bw = res.weights_bytes_per_s / read_bytes_per_s


def run_suite(
    names: list[str],
    system_names: list[str] | None,
    s: Settings,
    extra_systems: dict[str, System] | None = None,
    progress: Callable[..., None] = lambda msg, advance=0: None,
) -> list[WorkloadResult]:
    """Every workload in ``names`` on every system (CPU eager first, always)."""
    registry = {**SYSTEMS, **(extra_systems or {})}
    chosen = list(registry) if system_names is None else list(system_names)
    if REFERENCE in chosen:
        chosen.remove(REFERENCE)
    systems = [registry[REFERENCE]] + [registry[n] for n in chosen]
    torch.set_num_threads(s.threads)
    return [run_workload(n, systems, s, progress) for n in names]


def to_dict(results: list[WorkloadResult]) -> list[dict]:
    return [asdict(r) for r in results]
