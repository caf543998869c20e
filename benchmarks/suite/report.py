"""BENCHMARKS.md, the JSON record and the plots, from one run's results."""

from __future__ import annotations

import json
import platform
from dataclasses import asdict
from pathlib import Path

from .harness import REDUCED_PRECISION_SYSTEMS, REFERENCE, WorkloadResult, streams_weights
from .peak import Peak
from .report_format import (
    fmt_bw,
    fmt_bytes,
    fmt_flops,
    fmt_pct,
    fmt_ratio,
    fmt_sci,
    fmt_time,
    table,
)

HEADER = (
    "<!-- GENERATED FILE: written by benchmarks/run_suite.py (`make bench`). "
    "Do not edit by hand; rerun the command below to regenerate. -->"
)


def _status(s) -> str:
    return {"ok": "ok", "WRONG": "**WRONG**", "skip": "skipped", "error": "error"}[s.status]


# --------------------------------------------------------------------------- sections


def _core_share(r: WorkloadResult, peak: Peak | None) -> list[float]:
    """The one-core FMA loop's rates before and after timing (the
    harness's probe) as fractions of the peak's per-core rate."""
    if peak is None or not r.fma_probe_flops:
        return []
    import torch

    per_core = peak.theoretical(torch.float32, 1)
    return [f / per_core for f in r.fma_probe_flops] if per_core > 0 else []


def _core_share_cell(r: WorkloadResult, peak: Peak | None) -> str:
    shares = _core_share(r, peak)
    return " / ".join(f"{x:.0%}" for x in shares) if shares else "-"


def summary_table(results: list[WorkloadResult], peak: Peak | None = None) -> str:
    rows = []
    for r in results:
        ref, ember, best = r.get(REFERENCE), r.get("ember-eager"), r.best_baseline()
        ember_cell = "-"
        if ember is not None:
            ember_cell = fmt_ratio(ember.ratio) if ember.status == "ok" else _status(ember)
        unit = f"/{r.unit}" if r.unit != "run" else ""
        rows.append(
            [
                r.name,
                fmt_time(ref.median_s if ref else None) + unit,
                ember_cell,
                best.system if best else "-",
                fmt_ratio(best.ratio) if best else "-",
                "-" if r.other_load is None else f"{r.other_load:.2f}",
                _core_share_cell(r, peak),
            ]
        )
    return table(
        [
            "workload",
            "CPU eager (median)",
            "ember eager / CPU eager",
            "best baseline",
            "best baseline / CPU eager",
            "other load (cores)",
            "FMA loop, before / after",
        ],
        rows,
    )


def peak_section(peak: Peak, threads: int, results: list[WorkloadResult]) -> str:
    import torch

    cores = min(threads, peak.cores)

    def pct(f: float | None, dtype) -> str:
        return "-" if f is None else f"{100 * f / peak.theoretical(dtype, cores):.1f}%"

    gemm = {}
    for r in results:
        if r.name in ("gemm-fp32", "gemm-bf16"):
            ok = [
                s
                for s in r.systems
                if s.status == "ok"
                and s.gflops
                and not (r.name == "gemm-fp32" and s.system in REDUCED_PRECISION_SYSTEMS)
            ]
            if ok:
                b = max(ok, key=lambda s: s.gflops)
                gemm[r.name[-4:]] = (b.gflops * 1e9, b.system)
    f32, b16 = torch.float32, torch.bfloat16
    measured = [
        "measured FLOPs/cycle/core (FMA loop, one core)",
        *(
            "-" if v is None else f"{v:.1f}"
            for v in (peak.fp32_measured_flops_per_cycle, peak.bf16_measured_flops_per_cycle)
        ),
    ]
    rows = [
        ["FLOPs/cycle/core (ISA x pipes)", f"{peak.fp32_flops_per_cycle:g}", f"{peak.bf16_flops_per_cycle:g}"],
        measured,
        [f"theoretical peak, {cores} core(s) x {peak.clock_ghz:.2f} GHz",
         fmt_flops(peak.theoretical(f32, cores)), fmt_flops(peak.theoretical(b16, cores))],
        ["FMA loop on all cores at once",
         fmt_flops(peak.fp32_fma_loop_all_cores) + " " + pct(peak.fp32_fma_loop_all_cores, f32), "-"],
    ]  # fmt: skip
    best = peak.gemm_best
    rows.append(
        [
            "best torch.mm (CPU eager, sweep)",
            *(
                f"{fmt_flops(best[k]['flops_per_s'])} (n={best[k]['n']}) "
                f"{pct(best[k]['flops_per_s'], dt)}"
                if k in best
                else "-"
                for k, dt in (("fp32", f32), ("bf16", b16))
            ),
        ]
    )
    rows.append(
        [
            "best system on the GEMM workloads",
            *(
                f"{fmt_flops(gemm[k][0])} ({gemm[k][1]}) {pct(gemm[k][0], dt)}"
                if k in gemm
                else "-"
                for k, dt in (("fp32", f32), ("bf16", b16))
            ),
        ]
    )
    bw = peak.read_bandwidth(threads)
    if bw is not None:
        n, bps = bw
        rows.append(
            [f"memory read bandwidth, {n} thread(s) (STREAM-style read)", fmt_bw(bps), fmt_bw(bps)]
        )
        rows.append(
            [
                "ridge point: theoretical peak / read bandwidth",
                *(f"{peak.theoretical(dt, cores) / bps:.0f} FLOP/byte" for dt in (f32, b16)),
            ]
        )
    lines = [
        table(["", "fp32", "bf16"], rows, right={1, 2}),
        "",
        f"- clock: {peak.clock_ghz:.2f} GHz, {peak.clock_method}",
        (
            f"- fp32: {peak.fp32_lanes} lanes x 2 (FMA) x "
            f"{peak.fp32_flops_per_cycle / (2 * peak.fp32_lanes):g} FMA pipe(s), the pipe "
            "count rounded from the measured FMA loop"
        ),
        f"- bf16: {peak.bf16_method}",
        f"- percentages are of the theoretical peak of the cores used ({cores} = threads)",
    ]
    lines += [f"- {n}" for n in peak.notes]
    mem = memory_section(peak, threads, results)
    if mem:
        lines += ["", mem]
    return "\n".join(lines)


def memory_section(peak: Peak, threads: int, results: list[WorkloadResult]) -> str:
    """Memory read bandwidth, and the decode workloads' weight streaming against it."""
    bw = {int(k): v for k, v in peak.mem_read_bw.items()}
    if not bw:
        return ""
    used = peak.read_bandwidth(threads)
    rows = [
        [f"{t} thread{'s' if t > 1 else ''}" + (" (all cores)" if t == peak.cores else ""),
         fmt_bw(v)]
        for t, v in sorted(bw.items())
    ]  # fmt: skip
    out = [
        "Memory read bandwidth (STREAM-style read kernel):",
        "",
        table(["threads", "read bandwidth"], rows),
        "",
        f"- {peak.mem_method}; GB = 10^9 bytes",
    ]
    decode = [r for r in results if streams_weights(r)]
    drows = []
    for r in decode:
        for sres in r.systems:
            if sres.weights_bytes_per_s is None:
                continue
            drows.append(
                [
                    r.name,
                    sres.system,
                    fmt_time(sres.median_s),
                    fmt_bw(sres.weights_bytes_per_s),
                    fmt_pct(sres.frac_mem_bw),
                    _status(sres),
                ]
            )
    if drows and used is not None:
        mib = ", ".join(f"{r.name} {r.streamed_bytes / 2**20:.0f} MiB" for r in decode)
        out += [
            "",
            "### decode: weights streamed per second",
            "",
            table(
                [
                    "workload",
                    "system",
                    "median /token",
                    "weights streamed",
                    f"of read bandwidth ({used[0]} thread{'s' if used[0] > 1 else ''})",
                    "status",
                ],
                drows,
                right={2, 3, 4},
            ),
            "",
            (
                f"- weights streamed = parameter bytes per token ({mib}; tied weights "
                "once; embedding tables only looked up, one row a token, not counted) "
                "/ median time per token: every decode step reads every other weight "
                "once. KV cache and activation traffic are not counted, so this is a "
                "lower bound on the bytes moved; 100% means the step runs at the "
                f"measured read bandwidth of {fmt_bw(used[1])}."
            ),
        ]
    return "\n".join(out)


def engine_section(results: list[WorkloadResult]) -> str:
    """The asynchronous engine against the synchronous one, in the same run:
    ember-async / ember-sync per workload (issue 11's latency figure)."""
    rows = []
    for r in results:
        launched, synchronous = r.get("ember-async"), r.get("ember-sync")
        if launched is None or synchronous is None:
            continue
        both_ok = launched.status == "ok" and synchronous.status == "ok"
        rows.append(
            [
                r.name,
                fmt_time(synchronous.median_s),
                fmt_time(launched.median_s),
                fmt_ratio(launched.median_s / synchronous.median_s) if both_ok else "-",
            ]
        )
    if not rows:
        return ""
    return "\n".join(
        [
            table(
                ["workload", "ember-sync (median)", "ember-async (median)", "async / sync"],
                rows,
                right={1, 2, 3},
            ),
            "",
            (
                "- ember-async launches every op with a launched form on the stream's "
                "worker (the calling thread goes on with Python while kernels run), "
                "except that, while the stream has nothing queued, a result of >= 64 Ki "
                "elements runs at the call, and so does any op while the worker sleeps "
                "(until a burst of launches rouses it) but a skinny GEMM over a pack of "
                ">= 1 MiB (a decode GEMV: queued); ember-sync runs each op at its "
                "call. "
                "Asynchronous execution is on by "
                "default from 2 cores (ember-eager is ember-async there); on 2, the "
                "host thread and the kernels' threads share the cores."
            ),
        ]
    )


def workload_section(r: WorkloadResult, peak: Peak | None, threads: int) -> str:
    unit = r.unit if r.unit != "run" else "run"
    flops = f"{r.flops / 1e9:.3g} GFLOP per run" if r.flops else "FLOPs not counted"
    head = [
        f"### {r.name}: {r.title}",
        "",
        f"{flops} (torch.utils.flop_counter on CPU eager: matmul, conv, attention); "
        f"{r.params / 1e6:.1f} M parameters; dtype {r.dtype}; tolerance max|diff|/max|ref| "
        f"<= {r.rtol:g}; {r.rounds} rounds in {r.timing_s:.1f} s; times are per {unit}"
        + (f" ({r.per_run} {unit}s per run)" if r.per_run > 1 else "")
        + (f"; other processes used {r.other_load:.2f} cores meanwhile" if r.other_load else "")
        + (
            "; a one-core FMA loop ran at "
            + " and ".join(f"{x:.0%}" for x in _core_share(r, peak))
            + " of the peak's per-core rate before and after timing"
            if _core_share(r, peak)
            else ""
        )
        + (f"; waited {r.waited_s:.0f} s for an idle machine first" if r.waited_s >= 1 else ""),
        "",
    ]
    weights = any(s.weights_bytes_per_s is not None for s in r.systems)
    rows = []
    for s in r.systems:
        rows.append(
            [
                s.system,
                str(s.rank) if s.rank else "-",
                fmt_time(s.median_s),
                f"{fmt_time(s.p10_s)} - {fmt_time(s.p90_s)}" if s.p10_s is not None else "-",
                fmt_time(s.min_s),
                fmt_ratio(s.ratio),
                "-" if s.gflops is None else f"{s.gflops:.1f}",
                "-" if s.frac_peak is None else f"{100 * s.frac_peak:.1f}%",
                *(
                    [f"{fmt_bw(s.weights_bytes_per_s)} ({fmt_pct(s.frac_mem_bw)})"]
                    if weights
                    else []
                ),
                fmt_sci(s.max_abs_diff),
                _status(s),
                "-" if s.prepare_s is None else f"{s.prepare_s:.1f} s",
                fmt_bytes(s.peak_rss_delta),
                fmt_bytes(s.ember_max_allocated),
                f"{len(s.samples_s)}x{s.number}" if s.samples_s else "-",
            ]
        )
    body = table(
        [
            "system",
            "rank",
            f"median /{unit}",
            "p10 - p90",
            "min",
            "vs CPU eager",
            "GFLOP/s",
            "of peak",
            *(["weights streamed (of mem read BW)"] if weights else []),
            "max abs diff",
            "status",
            "prepare",
            "peak RSS delta",
            "ember max alloc",
            "samples x runs",
        ],
        rows,
    )
    notes = [f"- {n}" for n in r.notes]
    for s in r.systems:
        for text in ([s.reason] if s.reason else []) + s.notes:
            notes.append(f"- {s.system}: {text}")
    return "\n".join(head + [body] + ([""] + notes if notes else []))


METHOD = """\
- **Systems run in the same process, interleaved.** For each workload every
  system is prepared (export, compile or copy to the device), run once and
  warmed up; then timing goes in rounds, one sample of every system per
  round, in an order that rotates each round. Between samples the harness
  waits until no other thread of the process is runnable (up to
  {settle_ms:g} ms): worker threads that spin after a run (ONNX Runtime's
  for ~40 ms) would otherwise take a core from the system timed next. A sample is
  enough back-to-back runs to last >= {sample_ms:g} ms (garbage collector off)
  and gives the mean time of one run; a system that runs in a mode of its
  own (the ember rows with flags or a matmul precision) enters it once per
  sample, outside the timed runs. Rounds stop after {rounds}, or once
  {budget:g} s are spent and at least {min_rounds} are done.
- **Reported:** median of the samples, p10 - p90 as the spread, and the
  fastest sample (min: the least disturbed by other load); "vs CPU eager"
  is median / median of PyTorch CPU eager from the same rounds (lower is
  faster). Decode is reported per token (a run is all decode steps).
- **Correctness:** the first output of every system is compared with CPU
  eager's: max |out - ref| (reported) and max |out - ref| / max |ref|, which
  must stay within the workload's tolerance; a system above it is **WRONG**
  and gets no rank (and cannot be the best baseline). GPT-2 decode compares
  generated tokens; where a token differs only the steps up to it are
  compared (a near-tie of two logits is not an error).
- **Threads:** {threads} for every system: `torch.set_num_threads({threads})` (eager,
  Inductor, zentorch, ember), ONNX Runtime `intra_op_num_threads={threads}` (inter-op 1),
  OpenVINO `INFERENCE_NUM_THREADS={threads}`.
- **Memory:** "peak RSS delta" is the process's peak resident set size over
  preparation, first run and warm-up (VmHWM, reset through
  /proc/self/clear_refs) minus the RSS before preparing, after a GC and
  malloc_trim. It covers what the system adds: its own copy of the weights (CPU
  eager uses the model that was built, so its delta is activations only),
  compiled code, exported graphs, activations. ember's memory is host memory
  and is in RSS too; "ember max alloc" is `torch.ember.max_memory_allocated()`
  over the same phase.
- **FLOPs** are counted by `torch.utils.flop_counter.FlopCounterMode` on a CPU
  eager run (matmul, convolution, attention; elementwise ops are not
  counted); "of peak" is GFLOP/s over the theoretical peak of the cores used
  for the workload's dtype (for ember-medium, whose fp32 GEMMs take bf16
  products, over the bf16 peak; it is never the fp32 "best system").
- **Memory bandwidth:** decode (batch 1) reads every weight once per token, so
  its limit is memory bandwidth, not FLOP/s: "weights streamed" is parameter
  bytes / median time per token, compared with the read bandwidth measured by
  a STREAM-style read kernel (Physical limit) at the same thread count.
- **FMA loop, before / after:** one core's fp32 FMA loop timed for ~20 ms just
  before and just after a workload's timing (threads idle), as a fraction of the
  peak's per-core rate. Other processes on the machine show in "other load"; a
  virtual machine's other tenants do not, but they take execution units from
  its cores (the 2-core Zen 3 host on 2026-12-07: 19-29 FLOPs a cycle of the 32
  a quiet core gives, for minutes), and every system is slower then. Compare
  rows taken at similar shares. The loop does not see tenants that take cache
  and memory bandwidth instead (the same host at 22:09 that day: the loop at
  92-103%, every system's large GEMM at 58-73% of the peak).
- **Other load:** CPU time used by other processes while timing (from
  /proc/stat), in cores; with 2 cores, anything above ~0.1 makes the numbers
  noisy. `--wait-idle S` waits up to S seconds before each workload's timing
  for that load to drop.
- Workloads are built from transformers configs with random weights and fixed
  seeds (`HF_HUB_OFFLINE=1`, nothing downloaded)."""


def _noise_warning(
    results: list[WorkloadResult], cores: int, peak: Peak | None = None
) -> list[str]:
    worst = max((r.other_load or 0.0 for r in results), default=0.0)
    shares = [x for r in results for x in _core_share(r, peak)]
    out = []
    if shares and min(shares) < 0.85:
        text = (
            f"**Shared cores:** a one-core FMA loop ran at {min(shares):.0%}-{max(shares):.0%} "
            "of the peak's per-core rate around the workloads' timing (column 'FMA loop'): "
            "other tenants of the host took execution units from these cores. Ratios "
            "within one workload's table are taken in the same minutes; rows taken at "
            "different shares are not comparable."
        )
        out += ["", text]
    if worst < 0.25:
        return out
    text = (
        f"**Noisy run:** other processes kept up to {worst:.1f} of the {cores} cores busy "
        "while timing (column 'other load'). Systems whose worker threads wait at "
        "barriers (PyTorch's OpenMP: eager, Inductor, ember) lose most when a core is "
        "taken; rerun on an idle machine before drawing conclusions."
    )
    return [*out, "", text]


def markdown(meta: dict, peak: Peak | None, results: list[WorkloadResult], plots: list[str]) -> str:
    s = meta["settings"]
    out = [
        HEADER,
        "",
        "# ember benchmarks",
        "",
        f"Generated {meta['date']} by `{meta['command']}`"
        + (f" (runs `{meta['argv']}`)" if meta.get("argv") != meta["command"] else "")
        + f", {meta['elapsed_s'] / 60:.1f} min. **Do not edit by hand**: rerun the command.",
        "",
        "## Ratio to PyTorch CPU eager (same run; lower is faster)",
        "",
        summary_table(results, peak),
        "",
        (
            "Best baseline: the fastest correct system other than ember "
            "(CPU eager included, so it is <= 1.00x)."
        ),
        *_noise_warning(results, meta.get("cores") or 1, peak),
        "",
        "## Machine",
        "",
        (
            f"- CPU: {meta['cpu_model']}, {meta['cores']} physical cores "
            f"({meta['logical']} logical), {meta['mem_gib']:.0f} GiB"
        ),
        f"- ISA: {', '.join(k for k, v in meta['flags'].items() if v)}",
        f"- not present: {', '.join(k for k, v in meta['flags'].items() if not v) or '-'}",
        f"- OS: {meta['os']}; Python {platform.python_version()}",
        f"- threads: **{s['threads']}** for every system (see Method)",
        "",
        "## Systems and versions",
        "",
        table(
            ["system", "version", "configuration"],
            [[n, v["version"], v["config"].replace("\n", " ")] for n, v in meta["systems"].items()],
            right=set(),
        ),
        "",
        "Other packages: " + ", ".join(f"{k} {v}" for k, v in meta["packages"].items()),
        "",
    ]
    if peak is not None:
        out += ["## Physical limit", "", peak_section(peak, s["threads"], results), ""]
    engine = engine_section(results)
    if engine:
        out += ["## Asynchronous engine (same run)", "", engine, ""]
    out += ["## Workloads", ""]
    for r in results:
        out += [workload_section(r, peak, s["threads"]), ""]
    if plots:
        out += ["## Plots", ""] + [f"![{Path(p).stem}]({p})" for p in plots] + [""]
    out += [
        "## Method",
        "",
        METHOD.format(
            sample_ms=s["sample_s"] * 1e3,
            settle_ms=s.get("settle_max_s", 0.25) * 1e3,
            rounds=s["rounds"],
            budget=s["budget_s"],
            min_rounds=s["min_rounds"],
            threads=s["threads"],
        ),
        "",
    ]
    return "\n".join(out)


def write_json(path: Path, meta: dict, peak: Peak | None, results: list[WorkloadResult]) -> None:
    doc = {
        "meta": meta,
        "peak": asdict(peak) if peak else None,
        "workloads": [asdict(r) for r in results],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")


def read_json(path: Path) -> tuple[dict, Peak | None, list[WorkloadResult]]:
    """What write_json wrote: meta, the physical limit and the results."""
    from .harness import SystemResult

    doc = json.loads(path.read_text())
    results = []
    for w in doc["workloads"]:
        if "param_bytes" in w:  # a run from before lookup tables were left out
            w["streamed_bytes"] = w.pop("param_bytes")
            w["notes"] = w.get("notes", []) + [
                "weights streamed counts every parameter here, embedding tables included"
            ]
        systems = [SystemResult(**s) for s in w.pop("systems")]
        results.append(WorkloadResult(**w, systems=systems))
    peak = None
    if doc["peak"]:
        peak = Peak(**doc["peak"])
        peak.mem_read_bw = {int(k): v for k, v in peak.mem_read_bw.items()}  # JSON keys: str
    return doc["meta"], peak, results
