"""``python -m torch_ember.conformance``: the conformance sweep (see the package doc)."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
import time
import traceback
from pathlib import Path

DEFAULT_OUT = Path("build/conformance")
MODES = ("parity", "default")  # = modes.MODES (kept here: --help imports no torch)


def default_out(mode: str) -> Path:
    """Where a sweep in ``mode`` keeps its results: one directory per mode."""
    return DEFAULT_OUT / mode


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m torch_ember.conformance",
        description="Run PyTorch's OpInfo/ModuleInfo databases on a device and compare with CPU.",
    )
    parser.add_argument(
        "--ops",
        action="append",
        help="op/module name pattern (fnmatch or regex, comma-separated; repeatable)",
    )
    parser.add_argument("--dtypes", help="comma-separated dtypes, e.g. float32,int64")
    parser.add_argument(
        "--kind", default="forward,backward,modules", help="forward,backward,modules"
    )
    parser.add_argument("--variants", help="comma-separated: op,inplace,out,grad,train,eval")
    parser.add_argument("--device", default="ember", help="device type name (default ember)")
    parser.add_argument(
        "--mode",
        choices=MODES,
        default="parity",
        help=(
            "parity: the device's cpu_parity switch on (EMBER_CPU_PARITY=1), values compared "
            "bitwise; default: the device's own kernels, values compared with OpInfo's "
            "per-dtype tolerances (default: parity)"
        ),
    )
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        help="module to import in every process first (to load another backend)",
    )
    parser.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads per worker (default cores/jobs)"
    )
    parser.add_argument("--out", type=Path, help=f"results directory (default {DEFAULT_OUT}/MODE)")
    parser.add_argument("--doc", type=Path, help="also write the Markdown report here")
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="seconds without progress on one sample"
    )
    parser.add_argument("--max-samples", type=int, help="samples per op-dtype-variant")
    parser.add_argument("--limit", type=int, help="run only the first N pending tasks")
    parser.add_argument("--fresh", action="store_true", help="discard earlier results")
    parser.add_argument(
        "--rerun",
        help="rerun tasks whose earlier status is in this list (e.g. crash,timeout or 'failed')",
    )
    parser.add_argument(
        "--subset",
        action="store_true",
        help="the fast subset run by `make test` (with --max-samples defaulting to 6)",
    )
    parser.add_argument("--extra-ops", help="Python file defining a list `op_db` of extra OpInfos")
    parser.add_argument("--list", action="store_true", help="print the selected task keys")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="only write the reports from the results already in --out",
    )
    parser.add_argument("--repro", metavar="KEY", help="run one task in-process, verbosely")
    parser.add_argument("--sample", type=int, help="with --repro: run only this sample, raising")
    return parser


def _split(values) -> list[str]:
    if not values:
        return []
    if isinstance(values, str):
        values = [values]
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def _repro(args, registry, device) -> int:
    from . import modes

    with modes.active(device.type, args.mode) as cpu_parity:
        print(f"mode: {args.mode} ({modes.COMPARISON[args.mode]}; cpu_parity {cpu_parity})")
        return _repro_in_mode(args, registry, device)


def _repro_in_mode(args, registry, device) -> int:
    from . import cases, modules, repro
    from .tasks import Task, parse_dtype

    task = Task.from_key(args.repro)
    dtype = parse_dtype(task.dtype)
    mode = args.mode
    if args.sample is None:
        if task.kind == "forward":
            op = registry.ops[task.name]
            result = cases.run_forward(op, dtype, task.variant, device, mode=mode)
        elif task.kind == "backward":
            result = cases.run_backward(registry.ops[task.name], dtype, device, mode=mode)
        else:
            info = registry.modules[task.name]
            result = modules.run_module(info, dtype, task.variant, device, mode=mode)
        print(json.dumps(result, indent=1))
        return 0 if result["status"] in ("pass", "unsupported_on_cpu") else 1
    cases.DEBUG = True
    sample = repro.pick_sample(task, registry, dtype, args.sample, device)
    print("sample:", sample.summary())
    try:
        outcome = repro.run_sample(task, registry, dtype, device, sample, mode)
    except repro.Outcome as outcome_error:
        print(f"{outcome_error.outcome}: {outcome_error.cause}: {outcome_error.detail}")
        return 1
    except Exception:  # noqa: BLE001 - shown with its traceback
        traceback.print_exc()
        return 1
    print(outcome)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser().parse_args(argv)
    args.argv = argv
    if args.out is None:
        args.out = default_out(args.mode)
    import importlib

    import torch

    for module in args.imports:
        importlib.import_module(module)

    from .runner import Runner, load_results
    from .tasks import KINDS, Registry, parse_dtype

    kinds = _split(args.kind)
    for kind in kinds:
        if kind not in KINDS:
            raise SystemExit(f"unknown kind {kind!r}; choose from {', '.join(KINDS)}")
    dtypes = [parse_dtype(d) for d in _split(args.dtypes)] or None
    registry = Registry(
        args.extra_ops, load_modules="modules" in kinds or bool(args.repro) or args.subset
    )
    device = torch.device(args.device)
    if args.repro:
        return _repro(args, registry, device)
    if args.subset:
        from . import subset

        tasks = subset.tasks(registry)
        if args.max_samples is None:
            args.max_samples = subset.MAX_SAMPLES
    else:
        variants = _split(args.variants) or None
        tasks = registry.tasks(kinds, _split(args.ops) or None, dtypes, variants)
    if args.list:
        for task in tasks:
            print(task.key)
        print(f"{len(tasks)} tasks", file=sys.stderr)
        return 0
    results_path = args.out / "results.jsonl"
    if args.fresh and results_path.exists():
        results_path.unlink()
    if args.rerun:
        _drop_for_rerun(results_path, set(_split(args.rerun)), {t.key for t in tasks}, args.mode)
    selected = tasks
    if args.limit is not None:
        done = load_results(results_path, args.mode)
        pending = [t for t in tasks if t.key not in done][: args.limit]
        selected = [t for t in tasks if t.key in done] + pending
    threads = args.threads or max(1, (os.cpu_count() or 1) // max(1, args.jobs))
    start = time.monotonic()
    if args.report_only:
        results = load_results(results_path, args.mode)
        previous = _previous_meta(args.out / "conformance.json")
        return _write_reports(args, selected, results, previous, threads, None)
    runner = Runner(
        selected,
        args.out,
        device=args.device,
        jobs=args.jobs,
        threads=threads,
        timeout=args.timeout,
        max_samples=args.max_samples,
        extra_ops=args.extra_ops,
        imports=args.imports,
        mode=args.mode,
    )
    results = runner.run()
    return _write_reports(args, selected, results, {}, threads, time.monotonic() - start)


def _previous_meta(path: Path) -> dict:
    try:
        return json.loads(path.read_text()).get("meta", {})
    except (OSError, ValueError):
        return {}


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _other_mode_records(args, selected, build: str) -> tuple[str, list[dict], int] | None:
    """(mode, records, how many of them are of another build): the other
    mode's results for the same tasks, when its sweep kept them in the
    sibling directory (the default layout); the report lists where the two
    sweeps disagree."""
    if args.out.name != args.mode:
        return None
    other = next(m for m in MODES if m != args.mode)
    from .runner import load_results

    results = load_results(args.out.parent / other / "results.jsonl", other)
    records = [results[t.key] for t in selected if t.key in results]
    other_build = sum(1 for r in records if r.get("build") != build)
    return (other, records, other_build) if records else None


def _write_reports(args, selected, results, previous: dict, threads, wall) -> int:
    import torch

    from . import modes, report
    from .runner import build_fingerprint

    records = [results[t.key] for t in selected if t.key in results]
    meta = {
        "command": "python -m torch_ember.conformance " + " ".join(map(shlex.quote, sys.argv[1:])),
        "mode": args.mode,
        "comparison": modes.COMPARISON[args.mode],
        "cpu_parity": _cpu_parity(args),
        "device": args.device,
        "torch": torch.__version__,
        "commit": _git_commit(),
        "build": build_fingerprint(args.device),
        "date": datetime.date.today().isoformat(),
        "wall_seconds": None if wall is None else round(wall, 1),
        "jobs": args.jobs,
        "threads": threads,
        "max_samples": args.max_samples,
    }
    if wall is None:  # a report of an earlier run: keep what that run recorded
        meta.update({k: v for k, v in previous.items() if k not in ("build", "mode", "comparison")})
    other = _other_mode_records(args, selected, meta["build"])
    report.write_json(args.out / "conformance.json", records, meta, other)
    report.write_markdown(args.out / "conformance.md", records, meta, other)
    if args.doc:
        report.write_markdown(args.doc, records, meta, other)
    table = report.totals(records)
    print(f"[conformance] mode {args.mode}: values compared {modes.COMPARISON[args.mode]}")
    for kind, row in table.items():
        rate = "n/a" if row["pass_rate"] is None else f"{100 * row['pass_rate']:.2f}%"
        others = ", ".join(f"{s} {row[s]}" for s in report.STATUSES if s != "pass" and row[s])
        inexact = f" ({row['inexact']} within tolerance only)" if row.get("inexact") else ""
        print(
            f"[conformance] {kind}: {row['pass']}/{row['compared']} pass ({rate}){inexact} {others}"
        )
    print(f"[conformance] report: {args.out / 'conformance.md'}")
    stale = sum(1 for r in records if r.get("build") != meta["build"])
    if stale:
        print(f"[conformance] note: {stale} results are from another build or kit version")
    return 0


def _cpu_parity(args) -> bool | None:
    """The cpu_parity switch the workers ran with (they refuse to start when
    it cannot be set); None for a device without one."""
    from . import modes

    if modes.cpu_parity(args.device) is None:
        return None
    return args.mode == "parity"


def _drop_for_rerun(path: Path, statuses: set[str], keys: set[str], mode: str) -> None:
    """Rewrites results.jsonl without the selected tasks of ``mode`` whose
    (last) status is in ``statuses``; the other mode's records stay."""
    from .report import FAILING
    from .runner import load_results, read_records

    if "failed" in statuses:
        statuses |= set(FAILING)
    drop = {k for k, r in load_results(path, mode).items() if k in keys and r["status"] in statuses}
    if not drop:
        return
    kept = [r for r in read_records(path) if not (r.get("mode") == mode and r["key"] in drop)]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
    tmp.replace(path)


if __name__ == "__main__":
    sys.exit(main())
