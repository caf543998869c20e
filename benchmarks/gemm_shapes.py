"""Transformer-shaped GEMMs: ember against ONNX Runtime, OpenVINO and zentorch.

Issue 10 asks that fp32 Linear shapes M = 128..1024, K, N = 768..3072 run
within 1.15x of the best of ONNX Runtime / OpenVINO on the same shape. Each
shape is one ``nn.Linear`` (bias) on an [M, K] input, run by the suite's
harness (``suite/``: systems interleaved sample by sample, outputs checked
against CPU eager), so every figure in a row comes from the same minutes.

    python benchmarks/gemm_shapes.py [--shapes linear-128x768x2304,...]
        [--systems ...] [--out docs/bench/gemm_shapes.md]

``make bench-gemm-shapes`` runs it. Writes a markdown table (GFLOP/s per
system, ember's share of the theoretical peak, ember's time over the best
peer's) and a JSON record with every sample.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from run_suite import _Progress, _quiet
from suite import harness, peak, report, workloads
from suite.systems import SYSTEMS

ROOT = Path(__file__).resolve().parent.parent
PEERS = ("onnxruntime", "openvino", "zentorch")
TARGET = 1.15  # ember time / best peer time (ONNX Runtime, OpenVINO), issue 10


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--shapes", default=None, help=f"comma list of {', '.join(workloads.LINEAR_SHAPES)}"
    )
    p.add_argument(
        "--systems",
        default="onnxruntime,openvino,zentorch,ember-eager",
        help="systems beside cpu-eager (the reference)",
    )
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--budget", type=float, default=4.0, help="timing seconds per shape")
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "gemm_shapes.md")
    p.add_argument("--tiny", action="store_true", help="toy shapes (smoke test)")
    p.add_argument("--no-progress", action="store_true")
    return p.parse_args(argv)


def _gflops(r: harness.WorkloadResult, system: str) -> float | None:
    s = r.get(system)
    return s.gflops if s is not None and s.status == "ok" else None


def _row(r: harness.WorkloadResult, systems: list[str], peak_flops: float) -> list[str]:
    m, k, n = workloads.LINEAR_SHAPES.get(r.name, (0, 0, 0))
    cells = [f"{m} x {k} x {n}" if m else r.name]
    for name in systems:
        s = r.get(name)
        if s is None or s.status != "ok" or not s.gflops:
            cells.append(s.status if s is not None else "-")
        else:
            cells.append(f"{s.gflops:.0f}")
    ember = r.get("ember-eager")
    peers = [r.get(p) for p in PEERS if p in systems]
    ok_peers = [p for p in peers if p is not None and p.status == "ok" and p.median_s]
    binding = [p for p in ok_peers if p.system != "zentorch"]
    if ember is None or ember.status != "ok" or not ember.median_s:
        return cells + ["-", "-", "-"]
    cells.append(report.fmt_pct(ember.gflops * 1e9 / peak_flops) if ember.gflops else "-")
    if not binding:
        return cells + ["-", "-"]
    best = min(binding, key=lambda p: p.median_s)
    ratio = ember.median_s / best.median_s
    cells.append(f"{ratio:.2f}x ({best.system})")
    cells.append("ok" if ratio <= TARGET else "**over**")
    return cells


def markdown(
    meta: dict, results: list[harness.WorkloadResult], systems: list[str], peak_flops: float
) -> str:
    headers = (
        ["M x K x N"]
        + [f"{s} GFLOP/s" for s in systems]
        + ["ember of peak", "ember / best of ORT, OV", f"<= {TARGET}x"]
    )
    rows = [_row(r, systems, peak_flops) for r in results]
    right = set(range(1, len(headers)))
    lines = [
        (
            "<!-- GENERATED FILE: written by benchmarks/gemm_shapes.py (`make bench-gemm-shapes`). "
            "Do not edit by hand; rerun the command below to regenerate. -->"
        ),
        "",
        "# Transformer-shaped fp32 GEMMs: ember against its peers",
        "",
        (
            f"Generated {meta['date']} by `{meta['command']}`, {meta['elapsed_s'] / 60:.1f} min, "
            f"{meta['threads']} threads for every system, on {meta['cpu_model']} "
            f"({meta['cores']} cores). Theoretical fp32 peak of those cores: "
            f"{peak_flops / 1e9:.0f} GFLOP/s (measured clock x FMA width x FMA pipes)."
        ),
        "",
        (
            "Each row is one `nn.Linear(K, N)` with bias on an [M, K] fp32 input "
            "(`torch.set_float32_matmul_precision('highest')`), every system timed "
            "sample by sample in turn (the suite's harness); GFLOP/s = 2 M K N / median "
            "time. The binding comparison is against ONNX Runtime and OpenVINO "
            "(issue 10: within 1.15x); zentorch is shown beside them."
        ),
        "",
        report.table(headers, rows, right),
        "",
    ]
    for r in results:
        for s in r.systems:
            if s.status not in ("ok",) and s.reason:
                lines.append(f"- {r.name} / {s.system}: {s.status}: {s.reason}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _quiet()
    names = args.shapes.split(",") if args.shapes else list(workloads.LINEAR_SHAPES)
    for n in names:
        if n not in workloads.LINEAR_SHAPES:
            sys.exit(f"unknown shape {n!r}; known: {', '.join(workloads.LINEAR_SHAPES)}")
    systems = [s for s in args.systems.split(",") if s and s != harness.REFERENCE]
    for n in systems:
        if n not in SYSTEMS:
            sys.exit(f"unknown system {n!r}; known: {', '.join(SYSTEMS)}")
    threads = args.threads or peak.physical_cores()
    s = harness.Settings(
        threads, rounds=args.rounds, min_rounds=min(5, args.rounds), budget_s=args.budget, warmup=1
    )
    if args.tiny:
        s.tiny, s.rounds, s.min_rounds, s.budget_s, s.warmup = True, 3, 1, 1.0, 0
    start = time.perf_counter()
    torch.set_float32_matmul_precision("highest")
    machine = peak.measure(quick=True, gemm_sizes=[512], threads=threads)
    peak_flops = machine.theoretical(torch.float32, min(threads, machine.cores))
    progress = _Progress(len(names) * (len(systems) + 2), enabled=not args.no_progress)
    results = harness.run_suite(names, systems, s, progress=progress)
    progress.close()
    for r in results:
        harness.apply_peak(r, peak_flops)
    all_systems = [harness.REFERENCE] + systems
    meta = {
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "command": os.environ.get("BENCH_COMMAND") or shlex.join(["python", *sys.argv]),
        "elapsed_s": time.perf_counter() - start,
        "cpu_model": peak.cpu_model(),
        "cores": peak.physical_cores(),
        "threads": threads,
        "peak_fp32_flops": peak_flops,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = markdown(meta, results, all_systems, peak_flops)
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(
        json.dumps({"meta": meta, "results": harness.to_dict(results)}, indent=1)
    )
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
