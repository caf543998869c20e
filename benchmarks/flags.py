"""What each ``torch.backends.ember`` switch costs and buys, measured in one run.

Sections (every mode of a section is measured in the same run, repetitions
interleaved across modes with the order rotating each round, medians
reported):

* ``precision``: ``matmul.fp32_precision`` ieee / bf16 / bf16x3 on a 2048^3
  fp32 GEMM: time, speedup over ieee, error against a float64 product;
* ``blas``: ``preferred_blas_library`` default / mkl / onednn on the same GEMM;
* ``autotune``: ``benchmark`` False / True on a ResNet-like conv2d (64->64
  channels, 3x3, 56x56) and a linear: first call after clearing the
  autotuning cache (includes tuning) and steady state, plus
  ``benchmark_cache_info()``;
* ``sdpa``: flash vs math attention at L=4096 (batch 1, 8 heads, d=64):
  time and peak ember memory;
* ``determinism``: runs ``benchmarks/determinism.py`` when it exists;
* ``verbose``: level 0 vs 1 on a loop of small ops (the log goes to a file,
  whose lines per op show that logging ran).

A section whose feature is missing from this build reports "not available"
instead of failing the run. Prints one markdown table per section.

    python benchmarks/flags.py [--json PATH] [--sections precision,blas,...] [--rounds N]
                               [--quick]   (toy sizes: checks that every section runs)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import torch_ember
import torch_ember.backends as be
from torch_ember import _C

DEVICE = "ember"
SECTIONS = ("precision", "blas", "autotune", "sdpa", "determinism", "verbose")


class NotAvailable(Exception):
    """A section's feature is not in this build."""


# -- measurement -----------------------------------------------------------------


def _sync() -> None:
    torch.ember.synchronize()


def interleaved(
    modes: dict[str, Callable[[], Any]],
    rounds: int,
    number: int = 1,
    setup: dict[str, Callable[[], None]] | None = None,
) -> dict[str, list[float]]:
    """Seconds per call of each mode: ``rounds`` samples of ``number`` calls;
    within a round every mode runs once, in an order rotated each round.
    ``setup[mode]`` runs before each sample, untimed (e.g. setting a flag)."""
    names = list(modes)
    samples: dict[str, list[float]] = {name: [] for name in names}
    gc.disable()
    try:
        for r in range(rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                if setup and name in setup:
                    setup[name]()
                _sync()
                start = time.perf_counter()
                for _ in range(number):
                    modes[name]()
                _sync()
                samples[name].append((time.perf_counter() - start) / number)
    finally:
        gc.enable()
    return samples


def median(values: list[float]) -> float:
    return statistics.median(values)


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE)


# -- sections ----------------------------------------------------------------------


def _gemm_operands(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _randn(n, n, seed=1), _randn(n, n, seed=2)


def bench_precision(rounds: int, n: int = 2048) -> dict[str, Any]:
    a, b = _gemm_operands(n)
    reference = a.cpu().double() @ b.cpu().double()
    modes = ("ieee", "bf16", "bf16x3")
    outputs: dict[str, torch.Tensor] = {}
    for mode in modes:  # warm-up, and the result whose error is reported
        be.matmul.fp32_precision = mode
        outputs[mode] = (a @ b).cpu()
    samples = interleaved(
        {mode: lambda: a @ b for mode in modes},
        rounds,
        setup={mode: lambda m=mode: setattr(be.matmul, "fp32_precision", m) for mode in modes},
    )
    base = median(samples["ieee"])
    ref_norm = reference.norm().item()
    ref_max = reference.abs().max().item()
    rows = []
    for mode in modes:
        error = outputs[mode].double() - reference
        t = median(samples[mode])
        rows.append(
            {
                "mode": mode,
                "ms": t * 1e3,
                "gflops": 2 * n**3 / t / 1e9,
                "speedup_vs_ieee": base / t,
                "max_abs_err": error.abs().max().item(),
                "max_rel_err": error.abs().max().item() / ref_max,
                "frobenius_rel_err": error.norm().item() / ref_norm,
                "bitwise_equal_ieee": bool(torch.equal(outputs[mode], outputs["ieee"])),
            }
        )
    table = _table(
        ["fp32_precision", "ms", "GFLOP/s", "speedup vs ieee", "max abs err", "max rel err",
         "rel err (Frobenius)", "= ieee bitwise"],
        [
            [r["mode"], f"{r['ms']:.1f}", f"{r['gflops']:.0f}", f"{r['speedup_vs_ieee']:.2f}x",
             f"{r['max_abs_err']:.2e}", f"{r['max_rel_err']:.2e}",
             f"{r['frobenius_rel_err']:.2e}", "yes" if r["bitwise_equal_ieee"] else "no"]
            for r in rows
        ],
    )  # fmt: skip
    notes = [
        (
            f"{n}x{n} @ {n}x{n} fp32 on ember, {rounds} interleaved rounds; errors against "
            "the float64 product of the same inputs; max rel err = max abs err / max abs exact."
        )
    ]
    if all(r["bitwise_equal_ieee"] for r in rows):
        notes.append("every mode gives ieee's result: fp32_precision has no effect in this build")
    return {"rows": rows, "table": table, "notes": notes}


def bench_blas(rounds: int, n: int = 2048) -> dict[str, Any]:
    a, b = _gemm_operands(n)
    libraries = be.available_blas_libraries()
    be.matmul.fp32_precision = "ieee"
    outputs = {}
    for library in libraries:
        be.preferred_blas_library(library)
        outputs[library] = (a @ b).cpu()
    samples = interleaved(
        {library: lambda: a @ b for library in libraries},
        rounds,
        setup={lib: lambda x=lib: be.preferred_blas_library(x) for lib in libraries},
    )
    base = median(samples["default"])
    rows = []
    for library in libraries:
        t = median(samples[library])
        rows.append(
            {
                "library": library,
                "ms": t * 1e3,
                "gflops": 2 * n**3 / t / 1e9,
                "speedup_vs_default": base / t,
                "max_abs_diff_vs_default": (outputs[library] - outputs["default"])
                .abs()
                .max()
                .item(),
            }
        )
    table = _table(
        ["preferred_blas_library", "ms", "GFLOP/s", "speedup vs default", "max abs diff vs default"],
        [
            [r["library"], f"{r['ms']:.1f}", f"{r['gflops']:.0f}",
             f"{r['speedup_vs_default']:.2f}x", f"{r['max_abs_diff_vs_default']:.2e}"]
            for r in rows
        ],
    )  # fmt: skip
    notes = [f"{n}^3 fp32 GEMM on ember, matmul.fp32_precision='ieee', {rounds} rounds."]
    return {"rows": rows, "table": table, "notes": notes}


def _clear_tuning_cache() -> None:
    clear = getattr(_C, "clear_benchmark_cache", None)
    if clear is not None:
        clear()
    else:
        torch.ember.empty_cache()  # also clears the autotuning cache


def _cache_info() -> dict[str, Any] | str:
    try:
        return be.benchmark_cache_info()
    except Exception as error:  # noqa: BLE001 - reported, the timings stand alone
        return f"not available: {type(error).__name__}: {error}"


def bench_autotune(rounds: int, spatial: int = 56, features: int = 1024) -> dict[str, Any]:
    x_conv = _randn(1, 64, spatial, spatial, seed=3)
    w_conv = _randn(64, 64, 3, 3, seed=4) * 0.05
    x_lin = _randn(512, features, seed=5)
    w_lin = _randn(features, features, seed=6) * 0.03
    workloads = {
        f"conv2d 1x64x{spatial}x{spatial}, 64x64x3x3, pad 1": lambda: F.conv2d(
            x_conv, w_conv, padding=1
        ),
        f"linear 512x{features} @ {features}x{features}": lambda: F.linear(x_lin, w_lin),
    }
    rows = []
    cache_after: dict[str, Any] = {}
    for name, fn in workloads.items():
        for _ in range(2):
            fn()  # warm-up outside tuning (allocator, library init)

        first: dict[str, list[float]] = {"off": [], "on": []}
        for r in range(rounds):  # first calls: cache cleared before each
            for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
                be.benchmark = mode == "on"
                _clear_tuning_cache()
                first[mode] += interleaved({mode: fn}, 1)[mode]
        # Steady state: tuned once (benchmark on), then many calls.
        be.benchmark = True
        _clear_tuning_cache()
        fn()
        cache_after[name] = _cache_info()
        steady = interleaved(
            {"off": fn, "on": fn},
            rounds,
            number=5,
            setup={"off": lambda: setattr(be, "benchmark", False),
                   "on": lambda: setattr(be, "benchmark", True)},
        )  # fmt: skip
        results = {}
        for mode in ("off", "on"):
            be.benchmark = mode == "on"
            results[mode] = fn().cpu()
        rows.append(
            {
                "workload": name,
                "first_call_ms_off": median(first["off"]) * 1e3,
                "first_call_ms_on": median(first["on"]) * 1e3,
                "steady_ms_off": median(steady["off"]) * 1e3,
                "steady_ms_on": median(steady["on"]) * 1e3,
                "steady_speedup": median(steady["off"]) / median(steady["on"]),
                "max_abs_diff_on_vs_off": (results["on"] - results["off"]).abs().max().item(),
            }
        )
    table = _table(
        ["workload", "first call off (ms)", "first call on (ms, tuning)", "steady off (ms)",
         "steady on (ms)", "steady speedup", "max abs diff on vs off"],
        [
            [r["workload"], f"{r['first_call_ms_off']:.2f}", f"{r['first_call_ms_on']:.2f}",
             f"{r['steady_ms_off']:.2f}", f"{r['steady_ms_on']:.2f}",
             f"{r['steady_speedup']:.2f}x", f"{r['max_abs_diff_on_vs_off']:.2e}"]
            for r in rows
        ],
    )  # fmt: skip
    cache_rows = []
    for name, info in cache_after.items():
        if isinstance(info, str):
            cache_rows.append([name, info, "", ""])
            continue
        if not info.get("choices"):
            cache_rows.append([name, "(no entry: not autotuned)", "", str(info.get("limit"))])
        for choice in info.get("choices", []):
            timings = ", ".join(
                f"{alg} {us:.0f} us" for alg, us in choice.get("timings_us", {}).items()
            )
            cache_rows.append(
                [name, f"{choice.get('op')}: {choice.get('algorithm')}", timings,
                 str(info.get("limit"))]
            )  # fmt: skip
    table += "\n\nbenchmark_cache_info() after one tuned call:\n\n" + _table(
        ["workload", "tuned op: chosen algorithm", "timings", "limit"], cache_rows
    )
    notes = [
        (
            f"first call: median of {rounds} calls each right after clearing the autotuning "
            "cache; steady: 5 calls per sample, interleaved."
        )
    ]
    return {"rows": rows, "cache": cache_after, "table": table, "notes": notes}


def _attention_peak(backend: SDPBackend, q, k, v) -> tuple[int, torch.Tensor]:
    gc.collect()
    torch.ember.empty_cache()
    torch.ember.reset_peak_memory_stats()
    base = torch.ember.memory_allocated()
    with sdpa_kernel([backend]), torch.no_grad():
        out = F.scaled_dot_product_attention(q, k, v)
    _sync()
    return torch.ember.max_memory_allocated() - base, out.cpu()


def bench_sdpa(rounds: int, length: int = 4096, heads: int = 8, dim: int = 64) -> dict[str, Any]:
    q, k, v = (_randn(1, heads, length, dim, seed=s) for s in (7, 8, 9))
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}
    peaks, outputs = {}, {}
    for name, backend in backends.items():
        peaks[name], outputs[name] = _attention_peak(backend, q, k, v)

    def run(backend: SDPBackend) -> Callable[[], Any]:
        def call() -> None:
            with sdpa_kernel([backend]), torch.no_grad():
                F.scaled_dot_product_attention(q, k, v)

        return call

    samples = interleaved({name: run(b) for name, b in backends.items()}, rounds)
    scores = heads * length * length * 4
    rows = [
        {
            "path": name,
            "ms": median(samples[name]) * 1e3,
            "peak_mib": peaks[name] / 2**20,
            "peak_over_one_score_matrix": peaks[name] / scores,
        }
        for name in backends
    ]
    diff = (outputs["flash"] - outputs["math"]).abs().max().item()
    table = _table(
        ["path", "ms", "peak memory (MiB)", "peak / fp32 scores (L*L*heads*4 B)"],
        [
            [r["path"], f"{r['ms']:.1f}", f"{r['peak_mib']:.1f}",
             f"{r['peak_over_one_score_matrix']:.3f}"]
            for r in rows
        ],
    )  # fmt: skip
    notes = [
        (
            f"batch 1, {heads} heads, L={length}, d={dim}, fp32, forward (no_grad), "
            f"{rounds} rounds; peak = max_memory_allocated() above the inputs; "
            f"max abs diff flash vs math = {diff:.2e}."
        )
    ]
    return {"rows": rows, "max_abs_diff": diff, "table": table, "notes": notes}


def bench_determinism(rounds: int) -> dict[str, Any]:
    path = Path(__file__).with_name("determinism.py")
    if not path.exists():
        raise NotAvailable("benchmarks/determinism.py does not exist yet (skipped)")
    # Its own process: it sets thread counts and flags of its own.
    done = subprocess.run(
        [sys.executable, str(path), "--threads", str(torch.get_num_threads())],
        check=False,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        raise RuntimeError(f"benchmarks/determinism.py failed: {done.stderr[-500:]}")
    table = "\n".join(line for line in done.stdout.splitlines() if line.startswith("|"))
    return {"result": {"stdout": done.stdout}, "table": table, "notes": []}


class _StderrToFile:
    """Sends file descriptor 2 (where the verbose log goes) to a file."""

    def __enter__(self) -> Self:
        sys.stderr.flush()
        self.file = tempfile.TemporaryFile(mode="w+b")
        self.saved = os.dup(2)
        os.dup2(self.file.fileno(), 2)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.stderr.flush()
        os.dup2(self.saved, 2)
        os.close(self.saved)

    def lines(self) -> int:
        self.file.seek(0)
        return self.file.read().count(b"\n")


def bench_verbose(rounds: int, ops_per_sample: int = 2000) -> dict[str, Any]:
    x = _randn(8, 8, seed=10)

    def loop() -> None:
        for _ in range(ops_per_sample):
            torch.add(x, 1.0)

    loop()
    levels = {"0": 0, "1": 1}
    with _StderrToFile() as log:
        samples = interleaved(
            {name: loop for name in levels},
            rounds,
            setup={name: lambda lv=level: be.verbose(lv) for name, level in levels.items()},
        )
        be.verbose(0)
    lines_per_op = log.lines() / (rounds * ops_per_sample)
    base = median(samples["0"])
    rows = [
        {
            "level": int(name),
            "us_per_op": median(samples[name]) / ops_per_sample * 1e6,
            "overhead": median(samples[name]) / base,
        }
        for name in levels
    ]
    table = _table(
        ["verbose", "us / op", "vs level 0"],
        [[str(r["level"]), f"{r['us_per_op']:.2f}", f"{r['overhead']:.2f}x"] for r in rows],
    )
    notes = [
        (
            f"torch.add on an 8x8 ember tensor, {ops_per_sample} ops per sample, {rounds} "
            f"rounds; log written to a file: {lines_per_op:.2f} lines per op at level 1."
        )
    ]
    if lines_per_op == 0:
        notes.append("no log lines: verbose logging is not in this build")
    return {"rows": rows, "log_lines_per_op": lines_per_op, "table": table, "notes": notes}


# -- report ------------------------------------------------------------------------


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


# --quick: toy sizes per section (a smoke test of the script, not a measurement).
QUICK_SIZES: dict[str, dict[str, int]] = {
    "precision": {"n": 256},
    "blas": {"n": 256},
    "autotune": {"spatial": 14, "features": 128},
    "sdpa": {"length": 512},
    "verbose": {"ops_per_sample": 100},
}

RUNNERS: dict[str, tuple[str, Callable[..., dict[str, Any]]]] = {
    "precision": ("(a) matmul.fp32_precision", bench_precision),
    "blas": ("(b) preferred_blas_library", bench_blas),
    "autotune": ("(c) benchmark (autotuning)", bench_autotune),
    "sdpa": ("(d) attention: flash vs math", bench_sdpa),
    "determinism": ("(e) determinism", bench_determinism),
    "verbose": ("(f) verbose overhead", bench_verbose),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write the results as JSON here")
    parser.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated subset")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds per section")
    parser.add_argument("--quick", action="store_true", help="toy sizes (checks the script)")
    args = parser.parse_args(argv)
    chosen = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(chosen) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown sections {unknown}; choose from {', '.join(SECTIONS)}")

    report: dict[str, Any] = {
        "machine": {
            "cpu": _C.cpu_features().get("model_name", platform.processor()),
            "threads": torch.get_num_threads(),
            "cpu_capability": be.get_cpu_capability(),
            "versions": be.version(),
            "python": platform.python_version(),
            "load_average": _load(),
        },
        "rounds": args.rounds,
        "quick": args.quick,
        "sections": {},
    }
    machine = report["machine"]
    print(
        f"# torch.backends.ember flags benchmark\n\nember {torch_ember.__version__}, "
        f"torch {torch.__version__}, {machine['cpu']}, {machine['threads']} threads, "
        f"ATen level {machine['cpu_capability']}; load average {_load()} (other load on the "
        "machine changes absolute times; modes of a section share it through interleaving)"
    )
    started = time.perf_counter()
    for name in chosen:
        title, runner = RUNNERS[name]
        print(f"\n## {title}\n", flush=True)
        section_start = time.perf_counter()
        try:
            with be.flags(**be.current_flags()):  # every switch restored afterwards
                result = runner(args.rounds, **(QUICK_SIZES.get(name, {}) if args.quick else {}))
            result["status"] = "ok"
        except NotAvailable as reason:
            result = {"status": f"not available: {reason}"}
        except Exception as error:  # noqa: BLE001 - one missing feature must not end the run
            result = {"status": f"not available: {type(error).__name__}: {error}"}
        result["seconds"] = time.perf_counter() - section_start
        result["load_average_after"] = _load()
        if result["status"] == "ok":
            print(result.pop("table"))
            for note in result.get("notes", []):
                print(f"\n{note}")
        else:
            print(result["status"])
        report["sections"][name] = result
    report["seconds"] = time.perf_counter() - started
    print(f"\ntotal {report['seconds']:.0f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
