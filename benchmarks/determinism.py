"""Cost of ember's deterministic mode, op by op, measured in one run.

Each op runs on ember with the mode off (``torch_ember._C.flags`` switch
off: the plain CPU delegation) and on (fixed-order kernels, see
docs/determinism.md). The ratio on/off is the cost of the mode; ops whose
ATen kernel is already thread-count independent run the same code either
way, so their ratio should be ~1.

Method (as benchmarks/op_overhead.py): a sample is ``number`` back-to-back
calls (garbage collector off) and yields the mean time per call; off and on
samples alternate within each round (which goes first alternates between
rounds), so drift of the machine hits both alike. Reported times are
medians, and "best on/best off" compares the fastest samples (on a loaded
machine the least disturbed ones); "noise" is the larger of the two interquartile ranges relative to
their median. Every op's on-result is also checked to be bitwise identical
at 1 and 3 threads ("bits").

    python benchmarks/determinism.py [--threads 2] [--quick] [--json PATH]
                                     [--update-doc docs/determinism.md]

``--update-doc`` rewrites the table between the benchmark markers of that
page (the figures there come from this script, never from hand edits).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

import torch_ember
from torch_ember import _C

DEVICE = "ember"


@dataclass
class Case:
    name: str
    shape: str
    make: Callable[[], tuple]  # inputs, built once
    fn: Callable[..., object]


@dataclass
class Result:
    op: str
    shape: str
    number: int
    off_us: float  # medians
    on_us: float
    ratio: float
    best_ratio: float  # min(on) / min(off): least disturbed by other load
    noise: float
    bits: str  # "same" across 1 and 3 threads with the mode on, or "DIFFER"


def _t(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype).to(DEVICE)


def _grad(fn: Callable, *inputs: torch.Tensor, wrt: int | tuple = 0):
    """A backward pass of ``fn`` (forward included) as one timed call."""
    wrt = (wrt,) if isinstance(wrt, int) else wrt

    def run():
        leaves = [t.detach().requires_grad_(i in wrt) for i, t in enumerate(inputs)]
        out = fn(*leaves)
        return torch.autograd.grad(out, [leaves[i] for i in wrt], torch.ones_like(out))

    return run


def cases(quick: bool) -> list[Case]:
    n = 1_000_000 if quick else 4_000_000
    big = (1024, 1024) if quick else (2048, 2048)
    idx_n = 200_000 if quick else 1_000_000

    def ids(n, high, seed=1):
        g = torch.Generator().manual_seed(seed)
        return torch.randint(0, high, (n,), generator=g).to(DEVICE)

    out = [
        Case("sum", f"({n},) all", lambda: (_t(n),), lambda x: x.sum()),
        Case("sum", f"{big} dim=1", lambda: (_t(*big),), lambda x: x.sum(1)),
        Case("sum", f"{big} dim=0", lambda: (_t(*big),), lambda x: x.sum(0)),
        Case("sum", "(64, 1024) dim=1", lambda: (_t(64, 1024),), lambda x: x.sum(1)),
        Case("mean", f"({n},) all", lambda: (_t(n),), lambda x: x.mean()),
        # The matmul family: fixed 256x256 output tiles, one serial GEMM each.
        Case(
            "mm", "(1024, 1024) @ (1024, 1024)", lambda: (_t(1024, 1024), _t(1024, 1024)), torch.mm
        ),
        Case("mm", "(8, 65536) @ (65536, 8)", lambda: (_t(8, 65536), _t(65536, 8)), torch.mm),
        Case(
            "linear",
            "(128, 768) x (3072, 768)",
            lambda: (_t(128, 768), _t(3072, 768), _t(3072)),
            torch.nn.functional.linear,
        ),
        Case("var", f"{big} dim=1", lambda: (_t(*big),), lambda x: x.var(1)),
        Case("std", f"({n},) all", lambda: (_t(n),), lambda x: x.std()),
        Case("norm", f"({n},) p=2", lambda: (_t(n),), lambda x: torch.linalg.vector_norm(x)),
        Case("norm", f"{big} p=3 dim=0", lambda: (_t(*big),), lambda x: x.norm(3, dim=0)),
        Case("softmax", f"{big} dim=-1", lambda: (_t(*big),), lambda x: x.softmax(-1)),
        Case("softmax", f"{big} dim=0", lambda: (_t(*big),), lambda x: x.softmax(0)),
        Case(
            "softmax bwd",
            f"{big} dim=0",
            lambda: (_t(*big),),
            lambda x: _grad(lambda a: a.softmax(0), x)(),
        ),
        Case("log_softmax", f"{big} dim=0", lambda: (_t(*big),), lambda x: x.log_softmax(0)),
        Case("cumsum", f"{big} dim=0", lambda: (_t(*big),), lambda x: x.cumsum(0)),
        Case(
            "layer_norm",
            "(8192, 512)",
            lambda: (_t(8192, 512), _t(512, seed=1), _t(512, seed=2)),
            lambda x, w, b: F.layer_norm(x, (512,), w, b),
        ),
        Case(
            "layer_norm bwd",
            "(8192, 512)",
            lambda: (_t(8192, 512), _t(512, seed=1), _t(512, seed=2)),
            lambda x, w, b: _grad(
                lambda *a: F.layer_norm(a[0], (512,), a[1], a[2]), x, w, b, wrt=(0, 1, 2)
            )(),
        ),
        Case(
            "group_norm",
            "(16, 64, 32, 32) G=8",
            lambda: (_t(16, 64, 32, 32), _t(64, seed=1), _t(64, seed=2)),
            lambda x, w, b: F.group_norm(x, 8, w, b),
        ),
        Case(
            "group_norm",
            "(16, 64, 32, 32) G=8 channels_last",
            lambda: (
                _t(16, 64, 32, 32).contiguous(memory_format=torch.channels_last),
                _t(64, seed=1),
                _t(64, seed=2),
            ),
            lambda x, w, b: F.group_norm(x, 8, w, b),
        ),
        Case(
            "group_norm bwd",
            "(16, 64, 32, 32) G=8",
            lambda: (_t(16, 64, 32, 32), _t(64, seed=1), _t(64, seed=2)),
            lambda x, w, b: _grad(
                lambda *a: F.group_norm(a[0], 8, a[1], a[2]), x, w, b, wrt=(0, 1, 2)
            )(),
        ),
        Case(
            "index_add",
            f"({idx_n}, 16) -> (1000, 16)",
            lambda: (_t(idx_n, 16), ids(idx_n, 1000)),
            lambda s, i: torch.zeros(1000, 16, device=DEVICE).index_add_(0, i, s),
        ),
        Case(
            "scatter_add",
            f"({idx_n},) -> (1000,)",
            lambda: (_t(idx_n), ids(idx_n, 1000)),
            lambda s, i: torch.zeros(1000, device=DEVICE).scatter_add_(0, i, s),
        ),
        Case(
            "index_put acc",
            f"({idx_n},) -> (1000,)",
            lambda: (_t(idx_n), ids(idx_n, 1000)),
            lambda s, i: torch.zeros(1000, device=DEVICE).index_put_((i,), s, accumulate=True),
        ),
        Case(
            "embedding_bag bwd",
            f"(10000, 64) {idx_n // 4} ids, bags of 20",
            lambda: (
                _t(10000, 64),
                ids(idx_n // 4, 10000),
                torch.arange(0, idx_n // 4, 20).to(DEVICE),
            ),
            lambda w, i, o: _grad(lambda ww: F.embedding_bag(i, ww, o, mode="sum"), w)(),
        ),
        Case("mse_loss", f"({n},)", lambda: (_t(n), _t(n, seed=1)), lambda a, b: F.mse_loss(a, b)),
        Case(
            "huber_loss",
            f"({n},)",
            lambda: (_t(n), _t(n, seed=1)),
            lambda a, b: F.huber_loss(a, b),
        ),
        Case("sigmoid", f"({n},)", lambda: (_t(n),), torch.sigmoid),
        Case("silu bwd", f"({n},)", lambda: (_t(n),), lambda x: _grad(F.silu, x)()),
        Case("gelu", f"({n},)", lambda: (_t(n),), F.gelu),
    ]
    return out


def _sample(fn: Callable, inputs: tuple, number: int, on: bool) -> float:
    _C.flags.set_deterministic(on)
    try:
        torch.ember.synchronize()
        start = time.perf_counter()
        for _ in range(number):
            fn(*inputs)
        torch.ember.synchronize()  # launched ops have run
        return (time.perf_counter() - start) / number
    finally:
        _C.flags.set_deterministic(False)


def _calibrate(fn: Callable, inputs: tuple, budget: float = 0.02) -> int:
    fn(*inputs)
    torch.ember.synchronize()
    start = time.perf_counter()
    fn(*inputs)
    torch.ember.synchronize()
    once = max(time.perf_counter() - start, 1e-7)
    return max(1, min(1000, int(budget / once)))


def _iqr(xs: list[float]) -> float:
    q = statistics.quantiles(xs, n=4)
    return (q[2] - q[0]) / statistics.median(xs)


def _raw(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes (so -0.0 != 0.0 and NaN payloads count)."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def _bits(case: Case, inputs: tuple) -> str:
    def flat(r):
        if isinstance(r, torch.Tensor):
            return [r.detach().cpu()]
        return [t.detach().cpu() for t in r]

    prev = torch.get_num_threads()
    _C.flags.set_deterministic(True)
    try:
        got = []
        for threads in (1, 3):
            torch.set_num_threads(threads)
            got.append(flat(case.fn(*inputs)))
    finally:
        _C.flags.set_deterministic(False)
        torch.set_num_threads(prev)
    same = all(torch.equal(_raw(a), _raw(b)) for a, b in zip(*got))
    return "same" if same else "DIFFER"


def run(case: Case, samples: int) -> Result:
    inputs = case.make()
    bits = _bits(case, inputs)
    number = _calibrate(case.fn, inputs)
    off, on = [], []
    gc.disable()
    try:
        for r in range(samples):
            order = (False, True) if r % 2 == 0 else (True, False)
            for mode in order:
                (on if mode else off).append(_sample(case.fn, inputs, number, mode))
    finally:
        gc.enable()
    off_us = statistics.median(off) * 1e6
    on_us = statistics.median(on) * 1e6
    return Result(
        op=case.name,
        shape=case.shape,
        number=number,
        off_us=off_us,
        on_us=on_us,
        ratio=on_us / off_us,
        best_ratio=min(on) / min(off),
        noise=max(_iqr(off), _iqr(on)),
        bits=bits,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--samples", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="smaller shapes, fewer samples")
    parser.add_argument("--only", default="", help="comma-separated op names")
    parser.add_argument("--json", default="", help="also write the results here")
    parser.add_argument("--update-doc", default="", help="rewrite the table in this page")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    samples = 7 if args.quick else args.samples
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    results = []
    lines = [
        (
            f"torch {torch.__version__}, torch_ember {getattr(torch_ember, '__version__', '?')}, "
            f"threads {args.threads}, {os.cpu_count()} CPUs"
        ),
        "",
        "| op | input | off (us) | on (us) | on/off | best on/best off | noise | bits 1 vs 3 threads |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    print("\n".join(lines))
    for case in cases(args.quick):
        if only and case.name not in only:
            continue
        res = run(case, samples)
        results.append(res)
        lines.append(
            f"| {res.op} | {res.shape} | {res.off_us:.1f} | {res.on_us:.1f} | "
            f"{res.ratio:.2f} | {res.best_ratio:.2f} | {res.noise:.0%} | {res.bits} |"
        )
        print(lines[-1], flush=True)
    if results:
        ratios = [r.ratio for r in results]
        best = [r.best_ratio for r in results]
        lines += [
            "",
            (
                f"geometric mean on/off: {statistics.geometric_mean(ratios):.2f} "
                f"(best on/best off: {statistics.geometric_mean(best):.2f})"
            ),
        ]
        print("\n".join(lines[-2:]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"threads": args.threads, "results": [asdict(r) for r in results]}, f, indent=1
            )
    if args.update_doc:
        _update_doc(args.update_doc, lines, " ".join(sys.argv[1:]))


BEGIN = "<!-- determinism-benchmark:begin -->"
END = "<!-- determinism-benchmark:end -->"


def _update_doc(path: str, lines: list[str], arguments: str) -> None:
    """Replaces the text between BEGIN and END in ``path`` with the table."""
    with open(path) as f:
        text = f.read()
    head, begin, rest = text.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise SystemExit(f"{path}: no {BEGIN} ... {END} section")
    body = "\n".join([f"`python benchmarks/determinism.py {arguments}`", "", *lines])
    with open(path, "w") as f:
        f.write(f"{head}{BEGIN}\n{body}\n{END}{tail}")


if __name__ == "__main__":
    main()
