"""Guard profiler (torch_ember.guards): recompile diagnosis, guard timing with
its overhead excluded, optimize() for frozen inference models, reports, CLI.

Guards do not depend on the compile backend, so the models compile with
``backend="eager"`` (fast, and works for CPU and ember alike). Performance
claims (the guard-time cut) live in benchmarks/guards.py, not here.
"""

import itertools
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch._dynamo

from torch_ember import guards
from torch_ember.guards.timing import GuardTimer
from torch_ember.guards.tree import build_tree, count_by_kind

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST = guards.Profiler(budget=8, rounds=1)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Scaled(torch.nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.fc = torch.nn.Linear(d, d)
        self.scale = 0.5

    def forward(self, x, mask):
        return torch.relu(self.fc(x)) * self.scale + mask


class Deep(torch.nn.Module):
    """Nested small modules: many guards on nn.Modules."""

    def __init__(self, d=8, n=4):
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.LayerNorm(d), torch.nn.ReLU())
            for _ in range(n)
        )

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x


def _advice(profile, kind):
    return [a for a in profile.advice if a.kind == kind]


def _code(profile, name):
    matches = [c for c in profile.codes if c.name == name]
    assert len(matches) == 1, [c.name for c in profile.codes]
    return matches[0]


@pytest.mark.parametrize("device", ["cpu", "ember"])
def test_batch_size_recompiles_diagnosed_as_dim0_of_the_right_input(device):
    model = Scaled().to(device)
    compiled = torch.compile(model, backend="eager", dynamic=False)
    mask = torch.zeros(8, device=device)
    for batch in (2, 3, 5):
        compiled(torch.randn(batch, 8, device=device), mask)

    report = FAST.profile(compiled, torch.randn(5, 8, device=device), mask)

    code = _code(report, "forward")
    assert len(code.recompiles) == 2
    assert len(code.entries) == 3
    assert "size mismatch at index 0" in code.recompiles[0].primary
    # The second recompile refused both existing entries, newest first.
    assert [cid for cid, _ in code.recompiles[1].reasons] == ["0/1", "0/0"]
    dims = _advice(report, "dynamic_dimension")
    assert len(dims) == 1, report.to_text()
    assert dims[0].data["tensor"] == "x" and dims[0].data["dim"] == 0
    assert dims[0].data["sizes"] == ["2", "3", "5"]
    assert "mark_dynamic(x, 0)" in dims[0].fix
    # The entry for batch 5 ran during the profile and was timed.
    (hit,) = [e for e in code.entries if e.calls]
    assert hit.compile_id == "0/2" and hit.guard_us is not None


def test_changing_second_dim_of_second_input_is_named():
    def f(x, y):
        return x.sum() + y.sum(dim=1)

    compiled = torch.compile(f, backend="eager", dynamic=False)
    x = torch.randn(4)
    for width in (3, 6):
        compiled(x, torch.randn(2, width))
    report = FAST.profile(compiled, x, torch.randn(2, 6))
    (dim,) = _advice(report, "dynamic_dimension")
    assert (dim.data["tensor"], dim.data["dim"]) == ("y", 1)


def test_unchanged_model_reports_zero_recompiles():
    model = Deep()
    compiled = torch.compile(model, backend="eager")
    x = torch.randn(2, 8)
    for _ in range(3):
        compiled(x)
    report = FAST.profile(compiled, x)
    assert report.recompile_count == 0
    (code,) = report.codes
    assert len(code.entries) == 1 and code.recompiles == [] and code.limit_hit is None
    assert not [a for a in report.advice if a.kind != "module_guards"]
    summary = report.to_dict()["summary"]
    assert summary["recompiles"] == 0 and summary["cache_entries"] == 1


def test_profiler_overhead_is_reported_and_excluded():
    compiled = torch.compile(Deep(), backend="eager")
    x = torch.randn(2, 8)
    compiled(x)
    report = FAST.profile(compiled, x)
    (entry,) = report.hit_entries
    assert entry.overhead_us > 0
    assert entry.guard_us == pytest.approx(entry.raw_us - entry.overhead_us)
    assert report.overhead["empty_guard_check_us"] == pytest.approx(entry.overhead_us)
    assert report.overhead["timing_loop_us"] > 0
    assert report.guard_us == pytest.approx(entry.guard_us)
    assert 0 < report.guard_share < 1
    # The in-call cross-check ran (the call again with guard evaluation skipped).
    assert report.call_skip_guards_us is not None and report.guard_in_call_us is not None
    # The overhead is what checking no guards at all costs: subtracting it
    # leaves (close to) nothing for an empty guard manager.
    from torch._C._dynamo.guards import RootGuardManager

    timer = GuardTimer({"x": x})
    # Best of five: one timing on a loaded 2-core host can read high.
    empty_us = min(timer.time_us(RootGuardManager()) for _ in range(5))
    assert empty_us < 0.5 * timer.overhead_us + 0.05
    # Subtrees were timed and the expensive ones are named (the modules).
    assert entry.measured_nodes > 0
    top = entry.expensive(3)
    assert top and any("blocks" in node.source for node in top)


def test_guard_tree_and_counts_by_kind():
    compiled = torch.compile(Scaled(), backend="eager")
    x, mask = torch.randn(2, 8), torch.zeros(8)
    compiled(x, mask)
    report = FAST.profile(compiled, x, mask)
    (entry,) = report.hit_entries
    sources = {node.source for node in entry.tree.walk()}
    assert {"L['x']", "L['mask']"} <= sources
    assert any("_modules['fc']" in s for s in sources)
    counts = entry.counts
    assert counts["TENSOR_MATCH"] >= 4  # x, mask, weight, bias
    assert sum(counts.values()) == entry.guard_count
    assert entry.module_guard_count > 0
    # build_tree/count_by_kind agree with the entry's own view.
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list

    (cache_entry,) = _debug_get_cache_entry_list(Scaled.forward.__code__)
    assert count_by_kind(build_tree(cache_entry.guard_manager.root)) == counts


def test_float_attribute_and_recompile_limit_advice():
    model = Scaled()
    # dynamic=False: without it the float turns dynamic after one recompile.
    compiled = torch.compile(model, backend="eager", dynamic=False)
    x, mask = torch.randn(2, 8), torch.zeros(8)
    with torch._dynamo.config.patch(recompile_limit=3):
        for scale in (0.5, 0.7, 0.9, 1.1):
            model.scale = scale
            compiled(x, mask)
        report = FAST.profile(compiled, x, mask)
    (floats,) = _advice(report, "float_to_tensor")
    assert floats.data["attribute"] and floats.data["name"].endswith(".scale")
    assert "0.5" in floats.data["values"]
    code = _code(report, "forward")
    assert code.recompile_limit == 3 and len(code.entries) == 3
    assert code.limit_hit is not None
    (limit,) = _advice(report, "recompile_limit")
    assert limit.severity == "high"
    # With the cache full, the profiled call (scale 1.1) ran eagerly; Dynamo
    # refuses the skip-guards stance for it, so there is no in-call figure.
    assert code.ran_eagerly and _advice(report, "ran_eagerly")
    assert report.guard_in_call_us is None


def test_recompile_events_are_split_per_recompile(monkeypatch):
    from torch_ember.guards import recorder

    def code():
        pass

    raw = [
        "0/0: tensor 'x' size mismatch at index 0. expected 2, actual 3",
        "0/1: 2 <= x.size()[0]  # x + 1  # t.py:1 in f (... 0/1 specialization in the framework)",
        "0/0: tensor 'x' size mismatch at index 0. expected 2, actual 1",
        "0/1: GLOBAL_STATE changed: grad_mode ",
        "0/2: GLOBAL_STATE changed: grad_mode ",
        "0/0: GLOBAL_STATE changed: grad_mode ",
    ]
    monkeypatch.setitem(recorder.guard_failures, code.__code__, raw)
    events = recorder.recompile_events(code.__code__, first_new=3)
    assert [[cid for cid, _ in e.reasons] for e in events] == [
        ["0/0"],
        ["0/1", "0/0"],
        ["0/1", "0/2", "0/0"],
    ]
    assert [e.during_profile for e in events] == [False, False, True]
    assert events[1].primary == "2 <= x.size()[0]  (0/1 specialization)"


def test_reports_text_json_html():
    compiled = torch.compile(Scaled(), backend="eager", dynamic=False)
    mask = torch.zeros(8)
    compiled(torch.randn(2, 8), mask)
    report = FAST.profile(compiled, torch.randn(3, 8), mask)
    text = report.to_text()
    assert "recompile #1" in text and "mark_dynamic(x, 0)" in text and "guard tree" in text
    data = json.loads(report.to_json())
    assert data["summary"]["recompiles"] == 1
    (code,) = data["codes"]
    assert code["recompiles"][0]["failed_guards"][0]["entry"] == "0/0"
    assert code["entries"][0]["tree"]["children"]
    assert data["advice"][0]["kind"] == "dynamic_dimension"
    assert "profiler_overhead" in data
    html = report.to_html()
    assert html.startswith("<!doctype html>") and "<details" in html and "L[&#x27;x&#x27;]" in html


@pytest.mark.parametrize("device", ["cpu", "ember"])
def test_optimize_keeps_outputs_bitwise_and_drops_module_guards(device):
    torch.manual_seed(0)
    model = Deep().to(device).eval()
    x = torch.randn(3, 8, device=device)
    with torch.no_grad():
        fast = guards.optimize(model, (x,), backend="eager", profiler=FAST)
        result = fast.guard_report
        assert result.outputs_equal
        before, after = result.before.guard_count, result.after.guard_count
        assert after < before / 2, (before, after)
        # No guard left below an nn.Module; the input is still guarded.
        (entry,) = result.after.hit_entries
        assert entry.module_guard_count == 0
        assert any(
            kind == "TENSOR_MATCH" and "args" in node.source
            for node in entry.tree.walk()
            for kind, _ in node.leaves
        )
        assert torch.equal(fast(x), model(x))
        # A new shape still fails the input guards and recompiles correctly.
        y = torch.randn(5, 8, device=device)
        assert torch.equal(fast(y), model(y))
    assert result.to_dict()["guard_count_after"] == after


def test_optimize_rejects_unknown_mode_and_missing_inputs():
    with pytest.raises(ValueError, match="mode"):
        guards.optimize(Deep(), (torch.randn(1, 8),), mode="training")
    with pytest.raises(TypeError, match="example_inputs"):
        guards.optimize(Deep())


def test_cli_report_runs_a_script(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            import torch

            def step(x):
                return (x * 2).sum()

            compiled = torch.compile(step, backend="eager", dynamic=False)
            for batch in (2, 4, 4, 4):
                compiled(torch.randn(batch, 3))
            print("script args", sys.argv[1:])
            """
        )
    )
    out_json = tmp_path / "r.json"
    out_html = tmp_path / "r.html"
    proc = subprocess.run(
        [sys.executable, "-m", "torch_ember.guards", "report", "--json", str(out_json),
         "--html", str(out_html), "--budget", "4", str(script), "--flag"],
        check=False, capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "script args ['--flag']" in proc.stdout
    assert "recompile #1" in proc.stdout and "mark_dynamic(x, 0)" in proc.stdout
    data = json.loads(out_json.read_text())
    (code,) = [c for c in data["codes"] if c["name"] == "step"]
    assert code["cache_entries"] == 2 and len(code["recompiles"]) == 1
    busy = max(code["entries"], key=lambda e: e["calls"])
    assert busy["calls"] == 3 and busy["guard_us"] is not None
    assert data["summary"]["compiled_calls"] == 4
    assert "<details" in out_html.read_text()


def test_guards_timed_on_the_locals_of_the_call_even_if_the_call_mutates_them():
    """A wrapper that adds a key to its **kwargs dict during the call (as
    transformers' wrappers do) makes its guards (`'flag' not in kwargs`)
    fail on that dict afterwards: they must be timed at the call."""
    model = Scaled()

    def wrapper(**kwargs):
        if "flag" not in kwargs:
            kwargs["flag"] = True
        return model(kwargs["x"], kwargs["mask"])

    compiled = torch.compile(wrapper, backend="eager")
    x, mask = torch.randn(2, 8), torch.zeros(8)
    report = FAST.profile(compiled, x=x, mask=mask)
    (entry,) = report.hit_entries
    assert entry.note == "" and entry.guard_us > 0
    assert entry.input_shapes == {"kwargs['x']": (2, 8), "kwargs['mask']": (8,)}
    breakdown = entry.breakdown
    assert abs(breakdown.total_us - entry.guard_us) <= entry.overhead_us
    assert set(breakdown.by_source) >= {"inputs", "module tree"}


def test_positional_wrapper_dimension_advice_names_the_argument():
    def call(*args):
        return args[0].sum(dim=1) * 2

    compiled = torch.compile(call, backend="eager", dynamic=False)
    for width in (3, 6):
        compiled(torch.randn(2, width))
    report = FAST.profile(compiled, torch.randn(2, 6))
    (dim,) = _advice(report, "dynamic_dimension")
    assert (dim.data["tensor"], dim.data["dim"]) == ("args[0]", 1)
    assert "mark_dynamic(arg0, 1)" in dim.fix and "positional argument 0" in dim.fix
    assert dim.data["saving"]["recompiles"] == 1 and "recompile" in dim.saving


def test_median_interval_and_verdict_of_a_comparison():
    from torch_ember.guards.compare import CallComparison, median_interval

    values = list(range(1, 16))  # 15 values: the 95% interval is the 4th..12th
    assert median_interval(values) == (4, 12)
    assert median_interval([1.0, 2.0]) == (1.0, 2.0)
    # Differences scattered around zero: no measurable change.
    noisy = CallComparison([100, 102, 98, 101, 99, 103, 97], [101, 99, 100, 98, 103, 100, 99], 1)
    assert not noisy.measurable and noisy.verdict().startswith("no measurable change")
    # Every round 10 us faster: measurable, and said so.
    clear = CallComparison([100 + r for r in range(9)], [90 + r for r in range(9)], 1)
    assert clear.measurable and clear.change_us == -10
    assert "10.0 us (" in clear.verdict() and "faster" in clear.verdict()
    assert clear.to_dict()["measurable"] is True


def test_peeling_fit_never_increases_and_keeps_its_ends():
    from torch_ember.guards.breakdown import non_increasing_fit

    fitted = non_increasing_fit([10.0, 8.0, 9.0, 5.0, 6.0, 1.0], pinned_ends=True)
    assert fitted == pytest.approx([10.0, 8.5, 8.5, 5.5, 5.5, 1.0])
    assert all(a >= b for a, b in itertools.pairwise(fitted))
    assert non_increasing_fit([3.0, 2.0, 1.0]) == [3.0, 2.0, 1.0]
