"""What the benchmark-suite tests share: benchmarks/ on the import path, a
one-round toy-size harness setting, a deliberately wrong system, and the
structure every workload result must have."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

from suite import harness
from suite.systems import Prepared, System, cpu_eager


def plus_one(w, threads: int) -> Prepared:
    """CPU eager with every output off: x * 1.5 + 1 (tokens + 1)."""
    inner = cpu_eager(w, threads)

    def run():
        out = inner.run()
        return tuple(t * 1.5 + 1 if t.is_floating_point() else t + 1 for t in out)

    return Prepared(run=run)


WRONG = System("wrong-plus-one", plus_one, lambda: "test", "adds 1 to every output")


def settings() -> harness.Settings:
    # the process's own thread count: the harness sets it, other tests must not notice
    return harness.Settings(
        threads=torch.get_num_threads(),
        rounds=1,
        min_rounds=1,
        budget_s=0.0,
        warmup=0,
        sample_s=0.0,
        pause_s=0.0,
        tiny=True,
    )


def run(names, systems):
    return harness.run_suite(names, systems, settings(), extra_systems={WRONG.name: WRONG})


def check_structure(r: harness.WorkloadResult, systems: list[str]) -> None:
    assert [s.system for s in r.systems] == [harness.REFERENCE, *systems]
    assert r.rounds == 1 and r.per_run >= 1 and r.params >= 0
    assert r.flops is None or r.flops > 0
    ref = r.get(harness.REFERENCE)
    assert ref.status == "ok" and ref.ratio == pytest.approx(1.0) and ref.max_abs_diff == 0.0
    for s in r.systems:
        assert s.status in ("ok", "WRONG", "skip", "error"), s
        if s.status in ("ok", "WRONG"):
            assert len(s.samples_s) == 1 and s.number >= 1
            assert s.median_s > 0 and s.p10_s <= s.median_s <= s.p90_s
            assert s.ratio is not None and math.isfinite(s.ratio)
            assert s.max_abs_diff is not None and s.prepare_s is not None
            assert s.peak_rss_delta is not None and s.peak_rss_delta >= 0
        else:
            assert s.reason and s.rank is None and s.median_s is None
    ranked = sorted(s.rank for s in r.systems if s.rank is not None)
    assert ranked == list(range(1, len(ranked) + 1))
    assert all((s.rank is not None) == (s.status == "ok") for s in r.systems)
