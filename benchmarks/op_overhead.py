"""Per-op cost of ember against CPU, measured in one run.

Regimes:

* small tensors (8x8; linear 8->8): the time is all per-op overhead
  (dispatch, delegation, allocation), so the ratio ember/CPU is the overhead
  ember adds to an op;
* large tensors (4096x4096; linear 1024x1024 @ 1024x1024): the time is the
  kernel, which is CPU's own on ember, so the ratio should be ~1;
* optionally (``--regimes all``) "small_out" and "large_out": the same ops
  writing into preallocated outputs (``out=``), so neither device allocates.
  For small ops this separates ember's allocation cost from the rest of its
  overhead. Functional large ops also time the allocation of a 64 MiB
  result, which CPU's allocator maps and faults in afresh on every call
  while ember's caching allocator reuses a block; out= isolates kernel plus
  delegation. (layer_norm has no out= kernel on CPU: native_layer_norm.out
  is a composite that allocates, so it is left out.)

Method: like ``timeit``, a sample is ``number`` back-to-back calls (garbage
collector off) and yields the mean time per call; every op gets ``samples``
samples per device. CPU and ember samples alternate within each round (and
which goes first alternates between rounds), so drift of the machine (other
load, frequency) hits both alike. Reported times are medians of the samples;
the ratio is median(ember) / median(CPU); "noise" is the larger of the two
interquartile ranges relative to their median.

Targets: large-op ratio <= 1.05, small-op ratio <= 1.3. The exit code is 0
unless ``--check`` is given and a target is missed.

    python benchmarks/op_overhead.py [--quick] [--threads N] [--json PATH] [--check]
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F

import torch_ember

DEVICE = "ember"
SMALL_TARGET = 1.3
LARGE_TARGET = 1.05
REGIMES = ("small", "large", "small_out", "large_out")


@dataclass
class Case:
    name: str  # op name, e.g. "add"
    regime: str  # one of REGIMES
    shape: str  # human-readable input description
    make_inputs: Callable[[], list[torch.Tensor]]
    fn: Callable[..., torch.Tensor]


@dataclass
class Result:
    op: str
    regime: str
    shape: str
    number: int
    cpu_us: float
    ember_us: float
    ratio: float
    paired_ratio: float  # median over rounds of ember/CPU of the same round
    noise: float
    target: float
    passed: bool
    bitwise_equal: bool
    cpu_samples_us: list[float] = field(default_factory=list)
    ember_samples_us: list[float] = field(default_factory=list)


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def _cases(large_n: int, linear_n: int) -> list[Case]:
    def inputs(*shapes: tuple[int, ...], outs: Sequence[tuple[int, ...]] = ()):
        """Random inputs, then (for out= variants) preallocated outputs."""

        def make() -> list[torch.Tensor]:
            tensors = [_randn(*shape, seed=i + 1) for i, shape in enumerate(shapes)]
            return tensors + [torch.empty(shape) for shape in outs]

        return make

    def layer_norm(x, w, b):
        return F.layer_norm(x, (x.shape[-1],), w, b)

    def softmax(x):
        return F.softmax(x, dim=-1)

    def cat(a, b):
        return torch.cat([a, b])

    # out= variants: the same kernels writing into preallocated outputs, so neither
    # device allocates (CPU's allocator maps and faults in fresh pages for every
    # large functional result; ember's caching allocator reuses its blocks).
    def add_out(a, b, out):
        return torch.add(a, b, out=out)

    def mul_out(a, b, out):
        return torch.mul(a, b, out=out)

    def linear_out(x, w, b, out):
        return torch.addmm(b, x, w.t(), out=out)

    def softmax_out(x, out):
        return torch.ops.aten._softmax.out(x, -1, False, out=out)

    cases = []
    for regime, n, lin in (("small", 8, 8), ("large", large_n, linear_n)):
        sq, vec, lin_sq = (n, n), (n,), (lin, lin)
        linear_shape = f"{lin}x{lin} @ {lin}x{lin}+b"
        cases += [
            Case("add", regime, f"{n}x{n}", inputs(sq, sq), torch.add),
            Case("mul", regime, f"{n}x{n}", inputs(sq, sq), torch.mul),
            Case("linear", regime, linear_shape, inputs(lin_sq, lin_sq, (lin,)), F.linear),
            Case("softmax", regime, f"{n}x{n}", inputs(sq), softmax),
            Case("layer_norm", regime, f"{n}x{n}", inputs(sq, vec, vec), layer_norm),
            # the boxed delegation (no unboxed registration), and a join
            Case("exp", regime, f"{n}x{n}", inputs(sq), torch.exp),
            Case("cat", regime, f"2 x {n}x{n}", inputs(sq, sq), cat),
        ]
    for regime, n, lin in (("small_out", 8, 8), ("large_out", large_n, linear_n)):
        sq, lin_sq = (n, n), (lin, lin)
        cases += [
            Case("add", regime, f"{n}x{n}, out=", inputs(sq, sq, outs=[sq]), add_out),
            Case("mul", regime, f"{n}x{n}, out=", inputs(sq, sq, outs=[sq]), mul_out),
            Case(
                "linear",
                regime,
                f"addmm {lin}x{lin}, out=",
                inputs(lin_sq, lin_sq, (lin,), outs=[lin_sq]),
                linear_out,
            ),
            Case("softmax", regime, f"{n}x{n}, out=", inputs(sq, outs=[sq]), softmax_out),
        ]
    return cases


def _sync(device: str) -> None:
    if device == DEVICE:
        torch.ember.synchronize()


def _sample_us(
    fn: Callable, inputs: Sequence[torch.Tensor], device: str, number: int, keep: bool = False
) -> float:
    """Mean time of one call, in microseconds, over ``number`` back-to-back calls.

    ``keep`` holds every result until the sample's synchronize: ember's
    elementwise chain does not compute a result that nobody holds when the
    chain runs (docs/engine.md), so a large ``add`` whose result is dropped at
    once would time no arithmetic at all.
    """
    kept: list[torch.Tensor] = []
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter()
        for _ in range(number):
            result = fn(*inputs)
            if keep:
                kept.append(result)
        _sync(device)
        elapsed = time.perf_counter() - start
    finally:
        del kept
        if gc_was_enabled:
            gc.enable()
    return elapsed / number * 1e6


def _relative_iqr(samples: Sequence[float]) -> float:
    if len(samples) < 4:
        return 0.0
    q1, _, q3 = statistics.quantiles(samples, n=4)
    return (q3 - q1) / statistics.median(samples)


def _measure(case: Case, number: int, samples: int, warmup: int) -> Result:
    cpu_inputs = case.make_inputs()
    ember_inputs = [t.to(DEVICE) for t in cpu_inputs]
    runs = {"cpu": cpu_inputs, DEVICE: ember_inputs}

    with torch.no_grad():
        expected = case.fn(*cpu_inputs)
        actual = case.fn(*ember_inputs)
        bitwise = actual.device.type == DEVICE and torch.equal(expected, actual.cpu())
        del expected, actual
        # Large results are kept (see _sample_us); small ones are below the size
        # ember chains, and keeping thousands of them would time the allocator instead.
        keep = case.regime == "large"
        for _ in range(warmup):
            for device, inputs in runs.items():
                _sample_us(case.fn, inputs, device, number, keep)

        times: dict[str, list[float]] = {"cpu": [], DEVICE: []}
        for round_index in range(samples):
            order = ["cpu", DEVICE] if round_index % 2 == 0 else [DEVICE, "cpu"]
            for device in order:
                times[device].append(_sample_us(case.fn, runs[device], device, number, keep))

    cpu_us = statistics.median(times["cpu"])
    ember_us = statistics.median(times[DEVICE])
    ratio = ember_us / cpu_us
    paired = statistics.median(e / c for e, c in zip(times[DEVICE], times["cpu"], strict=True))
    target = SMALL_TARGET if case.regime.startswith("small") else LARGE_TARGET
    return Result(
        op=case.name,
        regime=case.regime,
        shape=case.shape,
        number=number,
        cpu_us=cpu_us,
        ember_us=ember_us,
        ratio=ratio,
        paired_ratio=paired,
        noise=max(_relative_iqr(times["cpu"]), _relative_iqr(times[DEVICE])),
        target=target,
        passed=ratio <= target,
        bitwise_equal=bitwise,
        cpu_samples_us=times["cpu"],
        ember_samples_us=times[DEVICE],
    )


def _idle_fraction(seconds: float = 1.0) -> float | None:
    """Share of all CPUs' time spent idle over the next ``seconds`` (Linux /proc/stat).

    The load average lags by a minute; this says whether other processes compete
    for the cores right now. None where /proc/stat is unavailable.
    """

    def snapshot() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
        return fields[3] + fields[4], sum(fields[:8])  # idle + iowait, total

    try:
        idle0, total0 = snapshot()
        time.sleep(seconds)
        idle1, total1 = snapshot()
    except (OSError, ValueError, IndexError):
        return None
    return (idle1 - idle0) / max(1, total1 - total0)


def _geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _fmt_us(us: float) -> str:
    return f"{us:,.2f}" if us < 1000 else f"{us:,.0f}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "  ".join(
            str(c).ljust(w) if i < 2 else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )

    return "\n".join([line(headers), "  ".join("-" * w for w in widths), *map(line, rows)])


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (2)")
    parser.add_argument("--quick", action="store_true", help="fewer calls and samples")
    parser.add_argument("--small-number", type=int, help="calls per small-op sample (2000)")
    parser.add_argument("--small-samples", type=int, help="samples per small op (15)")
    parser.add_argument("--large-number", type=int, help="calls per large-op sample (3)")
    parser.add_argument("--large-samples", type=int, help="samples per large op (15)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed samples first (1)")
    parser.add_argument("--large-size", type=int, default=4096, help="large square side")
    parser.add_argument("--linear-size", type=int, default=1024, help="large linear width")
    parser.add_argument("--ops", help="comma-separated subset of add,mul,linear,softmax,...")
    parser.add_argument(
        "--regimes",
        default="small,large",
        help="comma-separated: small, large, small_out, large_out (the ops writing into "
        "preallocated outputs: kernel + delegation without allocation), or all "
        "(default: small,large)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    args = parser.parse_args(argv)
    defaults = (200, 7, 1, 7) if args.quick else (2000, 15, 3, 15)
    for name, default in zip(
        ("small_number", "small_samples", "large_number", "large_samples"), defaults, strict=True
    ):
        if getattr(args, name) is None:
            setattr(args, name, default)
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    torch.set_num_threads(args.threads)
    regimes = [r.strip() for r in args.regimes.split(",") if r.strip()]
    if regimes == ["all"]:
        regimes = list(REGIMES)
    unknown = [r for r in regimes if r not in REGIMES]
    if unknown:
        print(f"unknown regime(s): {', '.join(unknown)}; choose from {REGIMES}", file=sys.stderr)
        return 2
    wanted = {o.strip() for o in args.ops.split(",")} if args.ops else None
    cases = [
        c
        for c in _cases(args.large_size, args.linear_size)
        if c.regime in regimes and (wanted is None or c.name in wanted)
    ]
    if not cases:
        print("no op selected", file=sys.stderr)
        return 2

    load_before = os.getloadavg()
    idle = _idle_fraction()
    print(
        f"ember op overhead: torch {torch.__version__}, torch_ember {torch_ember.__version__}, "
        f"{torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
        f"load average {load_before[0]:.2f}"
        + (f", CPUs {idle:.0%} idle before start" if idle is not None else "")
    )
    print(
        f"small: {args.small_samples} samples x {args.small_number} calls; "
        f"large: {args.large_samples} samples x {args.large_number} calls; "
        "CPU and ember interleaved; times are medians per call"
    )
    if idle is not None and idle < 0.8:
        print(
            "warning: other processes are using the CPUs; timings are noisy (multi-threaded "
            "kernels the most: a worker thread waiting for a core costs a scheduler tick)"
        )

    started = time.perf_counter()
    torch_ember.reset_fallback_stats()
    results: list[Result] = []
    for case in cases:
        small = case.regime.startswith("small")
        number = args.small_number if small else args.large_number
        samples = args.small_samples if small else args.large_samples
        results.append(_measure(case, number, samples, args.warmup))
        r = results[-1]
        print(
            f"  {r.regime:<5} {r.op:<10} cpu {_fmt_us(r.cpu_us):>9} us  "
            f"ember {_fmt_us(r.ember_us):>9} us  ratio {r.ratio:.3f}",
            flush=True,
        )

    rows = []
    summary = {}
    for regime in regimes:
        subset = [r for r in results if r.regime == regime]
        if not subset:
            continue
        for r in subset:
            rows.append(
                [
                    r.regime,
                    r.op,
                    r.shape,
                    _fmt_us(r.cpu_us),
                    _fmt_us(r.ember_us),
                    f"{r.ember_us - r.cpu_us:+,.2f}",
                    f"{r.ratio:.3f}",
                    f"{r.noise * 100:.1f}%",
                    "yes" if r.bitwise_equal else "NO",
                    f"<= {r.target:g}",
                    "PASS" if r.passed else "FAIL",
                ]
            )
        geomean = _geomean([r.ratio for r in subset])
        target = subset[0].target
        summary[regime] = {"geomean_ratio": geomean, "target": target, "passed": geomean <= target}
        rows.append(
            [regime, "geomean", "", "", "", "", f"{geomean:.3f}", "", "", f"<= {target:g}",
             "PASS" if geomean <= target else "FAIL"]
        )  # fmt: skip
    print()
    headers = ["regime", "op", "input", "CPU us", "ember us", "diff us", "ratio", "noise",
               "bitwise", "target", "result"]  # fmt: skip
    print(_table(headers, rows))

    load_after = os.getloadavg()
    missed = [f"{r.regime} {r.op}" for r in results if not r.passed]
    fallbacks = torch_ember.fallback_stats()
    print(
        "\nratio = median ember / median CPU; diff = median ember - median CPU (per call); "
        "noise = larger relative IQR of the two; "
        f"load average {load_before[0]:.2f} -> {load_after[0]:.2f}; "
        f"{time.perf_counter() - started:.0f} s"
    )
    if fallbacks:
        print(f"copying fallbacks: {fallbacks}")
    print("targets missed: " + (", ".join(missed) if missed else "none"))

    if args.json:
        payload = {
            "torch": torch.__version__,
            "torch_ember": torch_ember.__version__,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
            "threads": torch.get_num_threads(),
            "idle_before": idle,
            "loadavg_before": load_before,
            "loadavg_after": load_after,
            "config": {
                k: getattr(args, k)
                for k in (
                    "small_number",
                    "small_samples",
                    "large_number",
                    "large_samples",
                    "warmup",
                    "large_size",
                    "linear_size",
                )
            },
            "targets": {"small*": SMALL_TARGET, "large*": LARGE_TARGET},
            "results": [asdict(r) for r in results],
            "summary": summary,
            "fallback_stats": fallbacks,
            "targets_missed": missed,
        }
        with open(args.json, "w") as f:
            json.dump(payload, f, indent=2)
        print(f"wrote {args.json}")

    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
