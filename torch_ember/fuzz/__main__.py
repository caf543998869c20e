"""``python -m torch_ember.fuzz``: run seeded random programs on ember and
CPU; print a shrunk standalone reproducer for each difference."""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import torch

import torch_ember  # noqa: F401
from torch_ember.fuzz.program import generate
from torch_ember.fuzz.runner import MODES, InvalidOnCpu, reproducer, run, shrink


def _op_of(line: str) -> str:
    """The call a program line makes (``torch.tanh``, ``.add_``), for grouping."""
    match = re.search(r"(torch(?:\.\w+)+|\.\w+)\(", line)
    return match.group(1) if match else line[:40]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_ember.fuzz", description=__doc__)
    parser.add_argument("--programs", type=int, default=10_000, help="programs per mode")
    parser.add_argument("--seed", type=int, default=0, help="first seed (programs use seed..)")
    parser.add_argument("--mode", choices=(*MODES, "both"), default="both")
    parser.add_argument("--out", type=Path, default=Path("build/fuzz"), help="reproducers go here")
    args = parser.parse_args(argv)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    modes = MODES if args.mode == "both" else (args.mode,)
    total_failures = 0
    for mode in modes:
        start = time.perf_counter()
        ran = autograd = invalid = 0
        failures: list[int] = []
        kinds: dict[tuple[str, str], list[int]] = {}  # (cause, op of the failing line) -> seeds
        for seed in range(args.seed, args.seed + args.programs):
            if seed % 200 == 0:
                torch.ember.empty_cache()  # shapes vary: keep the cache from piling up
            program = generate(seed)
            try:
                failure = run(program, mode)
            except InvalidOnCpu:
                invalid += 1  # CPU itself is not reproducible on this program
                continue
            ran += 1
            autograd += program.autograd
            if failure is None:
                continue
            failures.append(seed)
            small = shrink(program, mode, failure)
            shrunk = run(small, mode) or failure
            kind = (shrunk.cause, _op_of(small.lines[shrunk.line]))
            kinds.setdefault(kind, []).append(seed)
            if len(kinds[kind]) > 1:
                continue  # the same difference again: counted, reproduced once
            text = reproducer(small, mode, shrunk)
            args.out.mkdir(parents=True, exist_ok=True)
            path = args.out / f"{mode}-seed{seed}.py"
            path.write_text(text)
            print(f"--- {mode} mode, seed {seed}: {shrunk} -> {path}\n{text}", flush=True)
        elapsed = time.perf_counter() - start
        print(
            f"fuzz {mode}: {ran} programs ({autograd} with autograd, {invalid} not reproducible "
            f"on CPU), {len(failures)} with a difference, {len(kinds)} distinct ({elapsed:.0f} s)",
            flush=True,
        )
        for (cause, op), seeds in kinds.items():
            print(f"  {cause} in {op}: {len(seeds)} program(s), first seed {seeds[0]}", flush=True)
        total_failures += len(failures)
    return 1 if total_failures else 0


if __name__ == "__main__":
    sys.exit(main())
