"""ember's benchmark suite: every workload on every system, in one run.

    python benchmarks/run_suite.py [--quick] [--threads N] [--out BENCHMARKS.md]
        [--plots docs/bench] [--json docs/bench/results.json]
        [--workloads a,b] [--systems a,b]

``make bench`` (``make bench QUICK=1``) runs it after installing
requirements-bench.txt. Writes BENCHMARKS.md (tables), PNG plots and a JSON
record with every sample. See ``benchmarks/suite/`` for the method.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import logging
import os
import platform
import shlex
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from suite import harness, peak, report, report_plots, workloads
from suite.systems import SYSTEMS

ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="reduced set, fewer rounds (< 10 min)")
    p.add_argument("--threads", type=int, default=None, help="threads for every system")
    p.add_argument("--out", type=Path, default=ROOT / "BENCHMARKS.md")
    p.add_argument("--plots", type=Path, default=ROOT / "docs" / "bench")
    p.add_argument("--json", type=Path, default=None, help="default: <plots>/results.json")
    p.add_argument(
        "--workloads", default=None, help=f"comma list of {', '.join(workloads.WORKLOADS)}"
    )
    p.add_argument("--systems", default=None, help=f"comma list of {', '.join(SYSTEMS)}")
    p.add_argument("--rounds", type=int, default=None, help="max timing rounds per workload")
    p.add_argument("--budget", type=float, default=None, help="timing seconds per workload")
    p.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="S",
        help="before timing a workload, wait up to S s for other processes to stop using CPU",
    )
    p.add_argument("--tiny", action="store_true", help="toy-size workloads (smoke test)")
    p.add_argument("--no-peak", action="store_true", help="skip the physical-limit measurement")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--render",
        type=Path,
        default=None,
        metavar="JSON",
        help="measure nothing: write the report (--out) from a results.json with the "
        "current report rules (its plots are left as they are)",
    )
    return p.parse_args(argv)


def settings(args: argparse.Namespace) -> harness.Settings:
    threads = args.threads or peak.physical_cores()
    if args.quick:
        s = harness.Settings(threads, rounds=10, min_rounds=5, budget_s=10.0, warmup=1)
    else:
        s = harness.Settings(threads, rounds=20, min_rounds=5, budget_s=30.0, warmup=2)
    if args.tiny:
        s.tiny, s.rounds, s.min_rounds, s.budget_s, s.warmup = True, 3, 1, 1.0, 0
    if args.rounds is not None:
        s.rounds = max(1, args.rounds)
        s.min_rounds = min(s.min_rounds, s.rounds)
    if args.budget is not None:
        s.budget_s = args.budget
    s.wait_idle_s = args.wait_idle
    return s


def _versions() -> dict[str, str]:
    out = {}
    for name in ("transformers", "numpy", "onnx", "onnxscript", "matplotlib", "tqdm"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def _mem_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        return 0.0


def _quiet() -> None:
    warnings.simplefilter("ignore")
    for name in ("torch.onnx", "torch._dynamo", "torch._inductor", "onnxscript", "onnx_ir"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        import transformers

        transformers.logging.set_verbosity_error()
    except ImportError:
        pass


class _Progress:
    def __init__(self, total: int, enabled: bool):
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="step", dynamic_ncols=True, file=sys.stderr)
            except ImportError:
                pass

    def __call__(self, msg: str, advance: int = 0) -> None:
        if self.bar is None:
            if advance:
                print(msg, file=sys.stderr, flush=True)
            return
        self.bar.set_description_str(msg[:60])
        if advance:
            self.bar.update(advance)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def render(args: argparse.Namespace) -> int:
    meta, machine_peak, results = report.read_json(args.render)
    if machine_peak is not None:
        apply_peaks(results, machine_peak, meta["settings"]["threads"])
    plot_paths = [
        os.path.relpath(args.plots / name, args.out.resolve().parent)
        for name in ("ratio.png", "latency.png", "peak.png")
        if (args.plots / name).exists()
    ]
    args.out.write_text(report.markdown(meta, machine_peak, results, plot_paths))
    print(f"wrote {args.out} from {args.render}")
    return 0


def apply_peaks(results: list, machine_peak: peak.Peak, threads: int) -> None:
    cores = min(threads, machine_peak.cores)
    for r in results:
        dtype = torch.bfloat16 if r.dtype == "bfloat16" else torch.float32
        harness.apply_peak(
            r,
            machine_peak.theoretical(dtype, cores),
            machine_peak.theoretical(torch.bfloat16, cores),
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render is not None:
        return render(args)
    _quiet()
    s = settings(args)
    names = args.workloads.split(",") if args.workloads else None
    if names is None:
        names = workloads.default_names(args.quick, bf16=peak.native_bf16())
        if not peak.native_bf16():
            print(
                "no bf16 instructions on this CPU: the bf16 workloads are left out", file=sys.stderr
            )
    for n in names:
        if n not in workloads.WORKLOADS:
            sys.exit(f"unknown workload {n!r}; known: {', '.join(workloads.WORKLOADS)}")
    system_names = args.systems.split(",") if args.systems else list(SYSTEMS)
    for n in system_names:
        if n not in SYSTEMS:
            sys.exit(f"unknown system {n!r}; known: {', '.join(SYSTEMS)}")
    if harness.REFERENCE not in system_names:
        system_names.insert(0, harness.REFERENCE)
    start = time.perf_counter()
    torch.set_num_threads(s.threads)
    progress = _Progress(
        len(names) * (len(system_names) + 1) + (0 if args.no_peak else 1),
        enabled=not args.no_progress,
    )
    machine_peak = None
    if not args.no_peak:
        progress("physical limit: clock, FMA loop, memory bandwidth, GEMM sweep")
        machine_peak = peak.measure(quick=args.quick or args.tiny, threads=s.threads)
        progress("physical limit measured", 1)
    results = harness.run_suite(names, system_names, s, progress=progress)
    progress.close()
    if machine_peak is not None:
        apply_peaks(results, machine_peak, s.threads)
    bandwidth = machine_peak.read_bandwidth(s.threads) if machine_peak is not None else None
    for r in results:
        harness.apply_bandwidth(r, bandwidth[1] if bandwidth else None)

    command = os.environ.get("BENCH_COMMAND") or shlex.join(["python", *sys.argv])
    meta = {
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "command": command,
        "argv": shlex.join(["python", *sys.argv]),
        "elapsed_s": time.perf_counter() - start,
        "cpu_model": peak.cpu_model(),
        "cores": peak.physical_cores(),
        "logical": os.cpu_count(),
        "mem_gib": _mem_gib(),
        "flags": peak.cpu_flags(),
        "os": f"{platform.system()} {platform.release()}",
        "settings": vars(s),
        "systems": {
            n: {"version": SYSTEMS[n].version(), "config": SYSTEMS[n].config} for n in system_names
        },
        "packages": _versions(),
    }
    json_path = args.json or args.plots / "results.json"
    report.write_json(json_path, meta, machine_peak, results)
    plot_paths: list[str] = []
    if importlib.util.find_spec("matplotlib") is not None:
        plot_paths = report_plots.plots(results, args.plots, args.out.resolve().parent)
    else:
        print("matplotlib not installed (make bench-deps): no plots", file=sys.stderr)
    args.out.write_text(report.markdown(meta, machine_peak, results, plot_paths))
    print(report.summary_table(results, machine_peak))
    print(f"\nwrote {args.out}, {json_path} and {len(plot_paths)} plots in {args.plots}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
