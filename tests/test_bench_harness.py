"""The benchmark suite's harness (benchmarks/suite): every workload at a toy size.

Runs each workload once on the systems that are cheap to prepare (CPU eager,
ember eager) plus a deliberately wrong system, checks the result structure,
the report (Markdown, JSON, plots) and that the correctness check flags the
wrong system and leaves it unranked. ONNX Runtime and OpenVINO run on two
cheap workloads when installed (requirements-bench.txt), else skip.
Inductor and the full set of exporters on every workload take minutes: they
run only with EMBER_BENCH_SLOW=1. No timing assertions.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))

from suite import harness, report, workloads
from suite.systems import SYSTEMS, Prepared, System, cpu_eager

SLOW = os.environ.get("EMBER_BENCH_SLOW") == "1"


def _plus_one(w, threads: int) -> Prepared:
    """CPU eager with every output off: x * 1.5 + 1 (tokens + 1)."""
    inner = cpu_eager(w, threads)

    def run():
        out = inner.run()
        return tuple(t * 1.5 + 1 if t.is_floating_point() else t + 1 for t in out)

    return Prepared(run=run)


WRONG = System("wrong-plus-one", _plus_one, lambda: "test", "adds 1 to every output")


def _settings() -> harness.Settings:
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


def _run(names, systems):
    return harness.run_suite(names, systems, _settings(), extra_systems={WRONG.name: WRONG})


@pytest.fixture(scope="module")
def results():
    return _run(list(workloads.WORKLOADS), ["ember-eager", WRONG.name])


def _check_structure(r: harness.WorkloadResult, systems: list[str]) -> None:
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


def test_every_workload_runs_on_cpu_and_ember(results):
    assert [r.name for r in results] == list(workloads.WORKLOADS)
    for r in results:
        _check_structure(r, ["ember-eager", WRONG.name])
        ember = r.get("ember-eager")
        assert ember.status == "ok", (r.name, ember.reason)
        assert ember.rel_err <= r.rtol
        assert ember.ember_max_allocated is not None and ember.ember_max_allocated > 0


def test_wrong_system_is_flagged_and_not_ranked(results):
    for r in results:
        wrong = r.get(WRONG.name)
        assert wrong.status == "WRONG", (r.name, wrong.rel_err)
        assert wrong.rank is None
        assert "tolerance" in wrong.reason
        assert wrong.max_abs_diff > 0
        assert r.best_baseline() is not None
        assert r.best_baseline().system != WRONG.name
    md = report.summary_table(results)
    assert WRONG.name not in md  # never the best baseline


def test_decode_reports_per_token(results):
    decode = next(r for r in results if r.name == "gpt2-decode")
    assert decode.unit == "token" and decode.per_run > 1
    ref = decode.get(harness.REFERENCE)
    assert ref.median_s == pytest.approx(ref.samples_s[0] / decode.per_run)


def test_compare():
    a = (torch.ones(3), torch.arange(3))
    assert harness.compare(a, a, 1e-3)[:2] == (0.0, 0.0)
    diff, rel, _ = harness.compare(a, (torch.ones(3) * 1.01, torch.arange(3)), 1e-3)
    assert diff == pytest.approx(0.01, rel=1e-4) and rel == pytest.approx(0.01, rel=1e-4)
    assert math.isinf(harness.compare(a, (torch.ones(3), torch.arange(3) + 1), 1e-3)[1])
    assert math.isinf(harness.compare(a, (torch.ones(4), torch.arange(3)), 1e-3)[1])
    nan = harness.compare(a, (torch.full((3,), math.nan), torch.arange(3)), 1e-3)[1]
    assert not nan <= 1e-3  # NaN output is never within tolerance


def test_greedy_compare_near_tie_is_not_wrong():
    logits = [torch.tensor([[1.0, 0.5]]), torch.tensor([[0.2, 0.2000001]])]
    ref = (torch.tensor([[0, 1]]), *logits)
    out = (torch.tensor([[0, 0]]), logits[0], logits[1] + torch.tensor([[1e-7, 0.0]]))
    _, rel, note = workloads._compare_greedy(ref, out, 1e-3)
    assert rel <= 1e-3 and "step 1" in note


def test_report_markdown_json_and_plots(results, tmp_path):
    meta = {
        "date": "today",
        "command": "make bench",
        "argv": "python benchmarks/run_suite.py",
        "elapsed_s": 1.0,
        "cpu_model": "cpu",
        "cores": 2,
        "logical": 2,
        "mem_gib": 1.0,
        "flags": {"avx2": True, "amx_bf16": False},
        "os": "Linux",
        "settings": vars(_settings()),
        "systems": {n: {"version": "1", "config": "c"} for n in ("cpu-eager", "ember-eager")},
        "packages": {"transformers": "x"},
    }
    plots = []
    if importlib.util.find_spec("matplotlib") is not None:
        plots = report.plots(results, tmp_path / "plots", tmp_path)
        assert all((tmp_path / p).stat().st_size > 0 for p in plots)
        assert "plots/ratio.png" in plots
    md = report.markdown(meta, None, results, plots)
    assert md.startswith(report.HEADER) and "Do not edit by hand" in md
    assert "| workload | CPU eager (median) | ember eager / CPU eager |" in md
    for r in results:
        assert f"### {r.name}:" in md
    assert "**WRONG**" in md
    report.write_json(tmp_path / "r.json", meta, None, results)
    doc = json.loads((tmp_path / "r.json").read_text())
    assert [w["name"] for w in doc["workloads"]] == list(workloads.WORKLOADS)
    first = doc["workloads"][0]["systems"][0]
    for key in ("system", "status", "median_s", "p10_s", "p90_s", "ratio", "max_abs_diff"):
        assert key in first


def test_cli_writes_report(tmp_path):
    import run_suite

    out = tmp_path / "B.md"
    rc = run_suite.main(
        [
            "--tiny",
            "--workloads",
            "mlp-b1",
            "--systems",
            "ember-eager",
            "--no-peak",
            "--no-progress",
            "--threads",
            str(torch.get_num_threads()),
            "--out",
            str(out),
            "--plots",
            str(tmp_path / "plots"),
        ]
    )
    assert rc == 0
    assert out.read_text().startswith(report.HEADER)
    assert json.loads((tmp_path / "plots" / "results.json").read_text())["workloads"]


def test_peak_fields():
    from suite import peak

    p = peak.measure(quick=True, gemm_sizes=[64])
    assert p.cores >= 1 and p.clock_ghz > 0 and p.fp32_flops_per_cycle >= 8
    assert p.bf16_flops_per_cycle >= p.fp32_flops_per_cycle
    assert p.theoretical(torch.bfloat16) >= p.theoretical(torch.float32) > 0
    assert set(p.gemm_best) == {"fp32", "bf16"}


@pytest.mark.parametrize("system", ["onnxruntime", "openvino"])
def test_exporter_systems_on_cheap_workloads(system):
    module = {"onnxruntime": "onnxruntime", "openvino": "openvino"}[system]
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} not installed (make bench-deps)")
    for r in _run(["mlp-b1", "gemm-fp32"], [system]):
        _check_structure(r, [system])
        assert r.get(system).status == "ok", r.get(system).reason


@pytest.mark.skipif(not SLOW, reason="minutes of compiling/exporting: EMBER_BENCH_SLOW=1")
def test_every_workload_on_every_system_slow():
    names = [n for n in SYSTEMS if n != harness.REFERENCE]
    for r in _run(list(workloads.WORKLOADS), names):
        _check_structure(r, names)
        for s in r.systems:
            assert s.status in ("ok", "skip"), (r.name, s.system, s.reason)
