"""Guard time per call before and after ``torch_ember.guards.optimize``.

The model is the worst case for guards: deep nesting of small modules
(residual blocks of Linear + LayerNorm + GELU, each wrapped in modules with a
float attribute, nested ``--depth`` levels, ``--blocks`` of them in a row),
with tiny tensors so that the compiled graph is cheap and guards are a
visible share of a call.

Rows: "guard us/call" is the isolated guard check (``RootGuardManager.check``
on the recorded frame locals, warm caches, profiler overhead subtracted);
"guards in call us" is the cost inside the real call: call time minus the
call time under ``torch.compiler.set_stance(skip_guard_eval_unsafe=True)``,
plus the differentiating guards that still run there ("guards skipped" row:
that call time). The second includes cache misses the call causes, and the
noise of a difference of two call times.

Method: ``optimize`` compiles the model twice through wrappers of its own
(plain ``torch.compile`` = *before*; nn.Module guards skipped and free
tensors installed = *after*) and checks the outputs bitwise. The benchmark
then profiles *before* and *after* alternately for ``--rounds`` rounds with
the guard profiler (guard time: ``RootGuardManager.check`` on the frame
locals of a real call, minimum over batches, minus the cost of checking an
empty guard manager; whole call: the compiled call in a loop, minus the loop)
and reports medians. Every figure is measured in this run; the cut is a ratio
of two figures of the same run.

Target: guard time per call cut by >= 50% with identical outputs.

    python benchmarks/guards.py [--device cpu|ember] [--backend B] [--depth 4]
                                [--blocks 6] [--rounds 5] [--threads 1] [--json PATH] [--check]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time

import torch

import torch_ember  # noqa: F401  (registers the ember device)
from torch_ember import guards

TARGET_CUT = 0.5


class Scaled(torch.nn.Module):
    """A module around a module, with a float attribute (guarded as a constant)."""

    def __init__(self, inner: torch.nn.Module, scale: float):
        super().__init__()
        self.inner = inner
        self.scale = scale

    def forward(self, x):
        return x + self.inner(x) * self.scale


class Leaf(torch.nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Linear(d, d), torch.nn.LayerNorm(d), torch.nn.GELU()
        )

    def forward(self, x):
        return self.body(x)


def nest(d: int, depth: int) -> torch.nn.Module:
    """``depth`` levels of Scaled around a Leaf, each level also adding a Leaf."""
    if depth == 0:
        return Leaf(d)
    return torch.nn.Sequential(Scaled(nest(d, depth - 1), 0.5), Scaled(Leaf(d), 0.25))


class ModuleHeavy(torch.nn.Module):
    def __init__(self, d: int = 16, blocks: int = 6, depth: int = 4):
        super().__init__()
        self.blocks = torch.nn.ModuleList(nest(d, depth) for _ in range(blocks))
        self.head = torch.nn.Linear(d, d)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or ember")
    parser.add_argument(
        "--backend",
        default=None,
        help="torch.compile backend (default: inductor on cpu, eager elsewhere; guards are"
        " the same for every backend)",
    )
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads (tiny ops)")
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--check", action="store_true", help="exit 1 if the target is missed")
    args = parser.parse_args(argv)
    if args.backend is None:
        args.backend = "inductor" if args.device == "cpu" else "eager"

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = ModuleHeavy(args.dim, args.blocks, args.depth).to(args.device).eval()
    x = torch.randn(args.batch, args.dim, device=args.device)
    modules = sum(1 for _ in model.modules())
    print(
        f"model: {modules} modules ({args.blocks} blocks, nesting depth {args.depth}),"
        f" input {tuple(x.shape)} on {args.device}, backend {args.backend!r},"
        f" {args.threads} thread(s), torch {torch.__version__}"
    )

    t0 = time.perf_counter()
    with torch.no_grad():
        fast = guards.optimize(model, (x,), backend=args.backend)
        result = fast.guard_report
        baseline = result.baseline
        eager_out = model(x)
        before_out, after_out = baseline(x), fast(x)
        print(f"compiled before/after and verified in {time.perf_counter() - t0:.1f} s")

        profiler = guards.Profiler(budget=0)
        rows: dict[str, dict[str, list[float]]] = {
            name: {"guard_us": [], "guard_in_call_us": [], "call_us": [], "call_skip_us": []}
            for name in ("before", "after")
        }
        for r in range(args.rounds):
            order = (("before", baseline), ("after", fast))
            for name, fn in order if r % 2 == 0 else tuple(reversed(order)):
                p = profiler.profile(fn, x)
                rows[name]["guard_us"].append(p.guard_us)
                rows[name]["call_us"].append(p.call_us or 0.0)
                rows[name]["guard_in_call_us"].append(p.guard_in_call_us or 0.0)
                rows[name]["call_skip_us"].append(p.call_skip_guards_us or 0.0)
                rows[name]["guards"] = [float(p.guard_count)]

    identical = torch.equal(before_out, after_out) and result.outputs_equal
    same_as_eager = torch.equal(after_out, eager_out)
    diff_to_eager = (after_out - eager_out).abs().max().item()
    med = {
        name: {key: statistics.median(values) for key, values in row.items()}
        for name, row in rows.items()
    }
    b, a = med["before"], med["after"]
    cut = 1.0 - a["guard_us"] / b["guard_us"] if b["guard_us"] > 0 else 0.0
    call_cut = 1.0 - a["call_us"] / b["call_us"] if b["call_us"] > 0 else 0.0
    print()
    print(f"{'':18}{'before':>14}{'after':>14}{'change':>10}")
    print(f"{'guards per call':18}{b['guards']:>14.0f}{a['guards']:>14.0f}")
    print(f"{'guard us/call':18}{b['guard_us']:>14.3f}{a['guard_us']:>14.3f}{-100 * cut:>9.1f}%")
    in_call_cut = (
        1.0 - a["guard_in_call_us"] / b["guard_in_call_us"] if b["guard_in_call_us"] > 0 else 0.0
    )
    print(
        f"{'guards in call us':18}{b['guard_in_call_us']:>14.3f}{a['guard_in_call_us']:>14.3f}"
        f"{-100 * in_call_cut:>9.1f}%"
    )
    print(f"{'call us':18}{b['call_us']:>14.2f}{a['call_us']:>14.2f}{-100 * call_cut:>9.1f}%")
    print(f"{'  guards skipped':18}{b['call_skip_us']:>14.2f}{a['call_skip_us']:>14.2f}")
    print(
        f"{'guard share':18}{100 * b['guard_us'] / b['call_us']:>13.2f}%"
        f"{100 * a['guard_us'] / a['call_us']:>13.2f}%"
    )
    print()
    print(f"guard time cut: {100 * cut:.1f}% (target >= {100 * TARGET_CUT:.0f}%)")
    print(
        f"outputs identical (bitwise) before/after: {identical};"
        f" max |after - eager| = {diff_to_eager:.3g}"
    )
    print("applied: " + "; ".join(result.reductions))
    spread = {name: (min(row["guard_us"]), max(row["guard_us"])) for name, row in rows.items()}
    print(
        f"guard us/call range over {args.rounds} rounds: before {spread['before'][0]:.3f}"
        f"..{spread['before'][1]:.3f}, after {spread['after'][0]:.3f}..{spread['after'][1]:.3f}"
    )
    ok = identical and cut >= TARGET_CUT
    if args.json:
        payload = {
            "device": args.device,
            "backend": args.backend,
            "modules": modules,
            "threads": args.threads,
            "torch": torch.__version__,
            "python": platform.python_version(),
            "rounds": args.rounds,
            "before": b,
            "after": a,
            "guard_cut": cut,
            "call_cut": call_cut,
            "guard_in_call_cut": in_call_cut,
            "outputs_identical": identical,
            "equal_to_eager": same_as_eager,
            "max_abs_diff_to_eager": diff_to_eager,
            "target_met": ok,
            "raw": rows,
        }
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=1)
    if args.check and not ok:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
