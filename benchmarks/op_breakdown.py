"""Where ember's time goes: per-op self CPU time of every suite workload on ember.

    python benchmarks/op_breakdown.py [--workloads a,b] [--threads N] [--warmup 2]
        [--runs 5] [--top 25] [--out docs/bench/op_breakdown.md] [--json PATH] [--tiny]

``make bench-breakdown`` runs it. Each workload of the benchmark suite
(``benchmarks/suite/workloads.py``) runs in ember eager (module and inputs on
"ember", under ``torch.inference_mode()``) in two modes, one after the other:

* **default**: ember's own kernels (``torch.backends.ember.cpu_parity = False``);
* **cpu_parity**: ``torch.backends.ember.flags(cpu_parity=True)``, every op on
  CPU's own ATen kernel (bitwise equal to CPU). Left out, with a note, where
  the build has no ``cpu_parity`` switch.

Both modes run every op at its call (``async_execution=False``), so each
op's kernel time is inside its own profiler event.

Per mode: ``--warmup`` runs, the wall time of ``--runs`` runs without the
profiler (median per run), then ``--runs`` runs under ``torch.profiler``
(CPU activity). The table lists, per op, the self CPU time per run (time in
the op itself, not in the ops it calls; intra-op worker threads are inside
their op's time), its share of the total self time of all ops, and the calls
per run. Writes a Markdown table per workload and a JSON record beside it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from suite import peak, workloads
from suite.report import table
from suite.systems import to_device_copy, torch_ember_version

ROOT = Path(__file__).resolve().parent.parent
HEADER = (
    "<!-- GENERATED FILE: written by benchmarks/op_breakdown.py (`make bench-breakdown`). "
    "Do not edit by hand; rerun the command below to regenerate. -->"
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--workloads", default=None, help=f"comma list of {', '.join(workloads.WORKLOADS)}"
    )
    p.add_argument("--threads", type=int, default=None, help="default: physical cores")
    p.add_argument("--warmup", type=int, default=None, help="runs before measuring (default 2)")
    p.add_argument("--runs", type=int, default=None, help="runs measured per mode (default 5)")
    p.add_argument("--top", type=int, default=25, help="ops listed per workload (rest summed)")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "op_breakdown.md")
    p.add_argument("--json", type=Path, default=None, help="default: --out with .json")
    p.add_argument("--tiny", action="store_true", help="toy-size workloads (tests)")
    return p.parse_args(argv)


# --------------------------------------------------------------------------- modes


def has_cpu_parity() -> bool:
    return hasattr(torch, "ember") and hasattr(torch.backends.ember, "cpu_parity")


def modes() -> dict[str, dict]:
    """mode name -> torch.backends.ember.flags() settings."""
    # Ops run at their call (async_execution off): a launched op's kernel runs
    # on the stream's worker through a redispatch the CPU profiler does not
    # see, so its time would be charged to whichever op waits for it.
    sync = {"async_execution": False} if hasattr(torch.backends.ember, "async_execution") else {}
    if not has_cpu_parity():
        return {"default": dict(sync)}
    return {
        "default": {"cpu_parity": False, **sync},
        "cpu_parity": {"cpu_parity": True, **sync},
    }


# --------------------------------------------------------------------------- measuring


def _run_once(w: workloads.Workload, module, inputs) -> None:
    with torch.inference_mode():
        w.driver(module, inputs)
    torch.ember.synchronize()


def warm_up(w: workloads.Workload, module, inputs, settings: dict, warmup: int) -> None:
    with torch.backends.ember.flags(**settings):
        for _ in range(warmup):
            _run_once(w, module, inputs)


def profile_mode(w: workloads.Workload, module, inputs, settings: dict, runs: int):
    """(wall seconds per run, {op: (self seconds per run, calls per run)}) in one mode."""
    from torch.profiler import ProfilerActivity, profile

    with torch.backends.ember.flags(**settings):
        _run_once(w, module, inputs)  # back in this mode: one run first
        walls = []
        for _ in range(runs):
            t0 = time.perf_counter()
            _run_once(w, module, inputs)
            walls.append(time.perf_counter() - t0)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(runs):
                _run_once(w, module, inputs)
    ops = {}
    for e in prof.key_averages():
        if e.self_cpu_time_total <= 0 and e.count == 0:
            continue
        ops[e.key] = (e.self_cpu_time_total * 1e-6 / runs, e.count / runs)
    return statistics.median(walls), ops


def breakdown(name: str, tiny: bool, warmup: int, runs: int) -> dict:
    w = workloads.build(name, tiny=tiny)
    module = to_device_copy(w.module, "ember")
    inputs = tuple(x.to("ember") for x in w.inputs)
    out = {
        "name": w.name,
        "title": w.title,
        "unit": w.unit,
        "per_run": w.per_run,
        "params": w.params,
        "modes": {},
    }
    for settings in modes().values():  # every mode warm before any is measured
        warm_up(w, module, inputs, settings, warmup)
    for mode, settings in modes().items():
        wall, ops = profile_mode(w, module, inputs, settings, runs)
        total = sum(t for t, _ in ops.values())
        rows = sorted(ops.items(), key=lambda kv: -kv[1][0])
        out["modes"][mode] = {
            "settings": settings,
            "wall_s_per_run": wall,
            "ops_self_s_per_run": total,
            "ops": [
                {
                    "op": op,
                    "self_s_per_run": t,
                    "pct": 100 * t / total if total else 0.0,
                    "calls_per_run": c,
                }
                for op, (t, c) in rows
            ],
        }
    del module, inputs
    torch.ember.empty_cache()
    return out


# --------------------------------------------------------------------------- report


def _ms(s: float | None) -> str:
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.3f} s"
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.3f} ms"


def _calls(c: float | None) -> str:
    if c is None:
        return "-"
    return f"{c:.0f}" if abs(c - round(c)) < 1e-9 else f"{c:.2f}"


def workload_table(wr: dict, top: int) -> str:
    """One row per op (the ``top`` ops by their largest share in any mode), modes side by side."""
    mode_names = list(wr["modes"])
    by_mode = {m: {o["op"]: o for o in wr["modes"][m]["ops"]} for m in mode_names}
    ops = set().union(*(set(d) for d in by_mode.values()))
    share = {op: max(by_mode[m].get(op, {}).get("pct", 0.0) for m in mode_names) for op in ops}
    first = by_mode[mode_names[0]]
    order = sorted(
        ops, key=lambda op: (-first.get(op, {}).get("self_s_per_run", 0.0), -share[op], op)
    )
    shown, rest = order[:top], order[top:]
    headers = ["op"]
    for m in mode_names:
        headers += [f"{m}: self /run", f"{m}: %", f"{m}: calls /run"]
    rows = []
    for op in shown:
        row = [f"`{op}`"]
        for m in mode_names:
            o = by_mode[m].get(op)
            row += (
                [_ms(o["self_s_per_run"]), f"{o['pct']:.1f}%", _calls(o["calls_per_run"])]
                if o
                else ["-", "-", "-"]
            )
        rows.append(row)
    if rest:
        row = [f"other ({len(rest)} ops)"]
        for m in mode_names:
            t = sum(by_mode[m][op]["self_s_per_run"] for op in rest if op in by_mode[m])
            pct = sum(by_mode[m][op]["pct"] for op in rest if op in by_mode[m])
            c = sum(by_mode[m][op]["calls_per_run"] for op in rest if op in by_mode[m])
            row += [_ms(t), f"{pct:.1f}%", _calls(c)]
        rows.append(row)
    row = ["**all ops (profiled)**"]
    for m in mode_names:
        md = wr["modes"][m]
        row += [
            _ms(md["ops_self_s_per_run"]),
            "100.0%",
            _calls(sum(o["calls_per_run"] for o in md["ops"])),
        ]
    rows.append(row)
    row = ["wall time /run, no profiler (median)"]
    for m in mode_names:
        row += [_ms(wr["modes"][m]["wall_s_per_run"]), "", ""]
    rows.append(row)
    return table(headers, rows)


def markdown(meta: dict, results: list[dict], top: int) -> str:
    out = [
        HEADER,
        "",
        "# ember: per-op time breakdown of the benchmark workloads",
        "",
        f"Generated {meta['date']} by `{meta['command']}`"
        + (f" (runs `{meta['argv']}`)" if meta["argv"] != meta["command"] else "")
        + ". **Do not edit by hand**: rerun the command.",
        "",
        (
            "- ember eager (module and inputs on `ember`, `torch.inference_mode()`), "
            f"{meta['threads']} thread(s); torch {meta['torch']}, "
            f"torch_ember {meta['torch_ember']}; {meta['cpu_model']}"
        ),
        (
            f"- {meta['warmup']} warm-up run(s) in every mode first; then per mode one run, "
            f"{meta['runs']} runs timed without the profiler (median wall time) and "
            f"{meta['runs']} runs under `torch.profiler` (CPU activity); times are per run "
            "(a decode run is all its tokens)"
        ),
        (
            "- **self /run**: CPU time inside the op itself (not in the ops it calls) per "
            "run, profiler overhead included; **%**: share of the total self time of all "
            "profiled ops; **calls /run**: calls per run"
        ),
        "- modes: "
        + "; ".join(
            f"**{m}** = `torch.backends.ember.flags({', '.join(f'{k}={v}' for k, v in s.items())})`"
            if s
            else f"**{m}** = ember's defaults"
            for m, s in meta["modes"].items()
        ),
    ]
    if not meta["cpu_parity_available"]:
        out.append(
            "- this build has no `torch.backends.ember.cpu_parity`: only the default mode is shown"
        )
    if meta["tiny"]:
        out.append("- **toy-size workloads (`--tiny`)**: for tests, not for conclusions")
    out.append("")
    for wr in results:
        unit = f"; a run is {wr['per_run']} {wr['unit']}s" if wr["per_run"] > 1 else ""
        out += [
            f"## {wr['name']}: {wr['title']}",
            "",
            f"{wr['params'] / 1e6:.1f} M parameters{unit}",
            "",
        ]
        out += [workload_table(wr, top), ""]
    return "\n".join(out)


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    warnings.simplefilter("ignore")
    if not hasattr(torch, "ember"):
        sys.exit("torch_ember is not loaded (TORCH_DEVICE_BACKEND_AUTOLOAD=0?)")
    names = args.workloads.split(",") if args.workloads else None
    if names is None:
        # As run_suite: bf16 GEMMs without bf16 instructions run for hours.
        names = workloads.default_names(bf16=peak.native_bf16())
        if not peak.native_bf16():
            print(
                "no bf16 instructions on this CPU: the bf16 workloads are left out", file=sys.stderr
            )
    for n in names:
        if n not in workloads.WORKLOADS:
            sys.exit(f"unknown workload {n!r}; known: {', '.join(workloads.WORKLOADS)}")
    warmup = args.warmup if args.warmup is not None else (1 if args.tiny else 2)
    runs = max(1, args.runs if args.runs is not None else (2 if args.tiny else 5))
    threads = args.threads or peak.physical_cores()
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        results = []
        for n in names:
            print(f"[op_breakdown] {n}", file=sys.stderr, flush=True)
            results.append(breakdown(n, args.tiny, warmup, runs))
    finally:
        torch.set_num_threads(previous_threads)
    argv_text = shlex.join(["python", *(sys.argv if argv is None else ["op_breakdown.py", *argv])])
    meta = {
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "command": os.environ.get("BENCH_COMMAND") or argv_text,
        "argv": argv_text,
        "threads": threads,
        "warmup": warmup,
        "runs": runs,
        "tiny": args.tiny,
        "torch": torch.__version__,
        "torch_ember": torch_ember_version(),
        "cpu_model": peak.cpu_model(),
        "python": platform.python_version(),
        "cpu_parity_available": has_cpu_parity(),
        "modes": modes(),
    }
    json_path = args.json or args.out.with_suffix(".json")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(markdown(meta, results, args.top))
    json_path.write_text(json.dumps({"meta": meta, "workloads": results}, indent=1) + "\n")
    print(f"wrote {args.out} and {json_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
