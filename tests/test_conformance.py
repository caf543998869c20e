"""The conformance kit: its fast subset on ember, and the harness itself.

``test_fast_subset`` runs the fixed representative subset of PyTorch's OpInfo
and ModuleInfo databases (torch_ember/conformance/subset.py) through the real
sweep machinery (two worker processes) and requires every op-sample that
works on CPU to give the same result on ember. Known failures are listed in
``EXPECTED_FAILURES`` with their cause; the list is strict: a listed task
that passes fails the test until it is removed.

The harness tests feed deliberately broken fake ops through the same
machinery and check each is classified as it must be.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from torch_ember.conformance.__main__ import main as conformance_main

# task key -> cause. Each is a divergence of ember from CPU found by the kit.
EXPECTED_FAILURES = {
    f"modules|nn.LSTM|float32|{mode}": (
        "ATen's LSTMCell takes the fused path for PrivateUse1 (as for CUDA/XPU); ember's "
        "fused cell (csrc/ops/kernels/RecurrentCells.cpp) adds the two biases separately, "
        "so it equals CPU's unfused cell to rounding, not bit for bit"
    )
    for mode in ("train", "eval")
}


def _run(tmp_path, *args):
    out = tmp_path / "out"
    code = conformance_main([*args, "--out", str(out), "--jobs", "2"])
    assert code == 0
    summary = json.loads((out / "conformance.json").read_text())
    return {r["key"]: r for r in summary["results"]}, summary


def test_fast_subset(tmp_path):
    results, summary = _run(tmp_path, "--subset")
    assert len(results) > 500
    failing = {
        k: r for k, r in results.items() if r["status"] not in ("pass", "unsupported_on_cpu")
    }
    unexpected = {k: r for k, r in failing.items() if k not in EXPECTED_FAILURES}
    fixed = sorted(k for k in EXPECTED_FAILURES if k in results and k not in failing)
    lines = [
        f"{k}: {r['status']}: {str(r.get('error', ''))[:300]}"
        for k, r in sorted(unexpected.items())
    ]
    assert not unexpected, "ember differs from CPU:\n" + "\n".join(lines)
    assert not fixed, "now passing, remove from EXPECTED_FAILURES: " + ", ".join(fixed)
    # Every family produced passing work (the subset is not silently empty).
    kinds = {r["kind"] for r in results.values() if r["status"] == "pass"}
    assert kinds == {"forward", "backward", "modules"}
    assert summary["totals"]["all"]["pass"] > 400


FAKE_OPS = textwrap.dedent(
    """
    import os
    import time

    import torch
    from torch.testing._internal.common_dtype import floating_types
    from torch.testing._internal.opinfo.core import OpInfo, SampleInput


    def samples(op, device, dtype, requires_grad, **kwargs):
        yield SampleInput(torch.arange(6, dtype=dtype, device=device).reshape(2, 3))
        yield SampleInput(torch.ones(4, dtype=dtype, device=device)[::2])


    def on_device(x):
        return x.device.type != "cpu"


    def wrong_values(x):
        return x + 1 if on_device(x) else x.clone()


    def wrong_strides(x):
        return x.t().contiguous().t() if on_device(x) and x.dim() == 2 else x.clone()


    def raises(x):
        if on_device(x):
            raise RuntimeError("fake device failure at 0x7f3a for 3 elements")
        return x.clone()


    def aborts(x):
        if on_device(x):
            os.abort()
        return x.clone()


    def hangs(x):
        if on_device(x):
            time.sleep(3600)
        return x.clone()


    def fails_everywhere(x):
        raise RuntimeError("not implemented anywhere")


    def only_cpu_raises(x):
        if not on_device(x):
            raise RuntimeError("CPU refuses")
        return x.clone()


    def inplace_returns_copy(x):
        return x.mul_(2).clone() if on_device(x) else x.mul_(2)


    def make(name, fn, **kwargs):
        return OpInfo(name, op=fn, dtypes=floating_types(), sample_inputs_func=samples,
                      supports_out=False, supports_autograd=False, **kwargs)


    op_db = [
        make("fake.good", lambda x: x * 2),
        make("fake.wrong_values", wrong_values),
        make("fake.wrong_strides", wrong_strides),
        make("fake.raises", raises),
        make("fake.abort", aborts),
        make("fake.hang", hangs),
        make("fake.fails_everywhere", fails_everywhere),
        make("fake.only_cpu_raises", only_cpu_raises),
        make("fake.inplace", lambda x: x * 2, inplace_variant=inplace_returns_copy),
    ]
    """
)


def test_harness_classifies_broken_ops(tmp_path):
    plugin = tmp_path / "fake_ops.py"
    plugin.write_text(FAKE_OPS)
    args = ["--extra-ops", str(plugin), "--ops", "fake.*", "--dtypes", "float32"]
    results, summary = _run(tmp_path, *args, "--timeout", "6")
    status = {
        key.split("|")[1] + "|" + key.split("|")[3]: r["status"] for key, r in results.items()
    }
    assert status == {
        "fake.good|op": "pass",
        "fake.wrong_values|op": "mismatch",
        "fake.wrong_strides|op": "mismatch",
        "fake.raises|op": "error_ember_only",
        "fake.abort|op": "crash",
        "fake.hang|op": "timeout",
        "fake.fails_everywhere|op": "unsupported_on_cpu",
        "fake.only_cpu_raises|op": "mismatch",
        "fake.inplace|op": "pass",
        "fake.inplace|inplace": "mismatch",
    }
    by_name = {key.split("|")[1] + "|" + key.split("|")[3]: r for key, r in results.items()}
    assert by_name["fake.wrong_values|op"]["cause"] == "values differ"
    assert by_name["fake.wrong_strides|op"]["cause"] == "strides differ"
    assert by_name["fake.inplace|inplace"]["cause"] == "returned object identity differs"
    assert "SIGABRT" in by_name["fake.abort|op"]["error"]
    assert by_name["fake.abort|op"]["sample"] == 0
    # Excluded from the rate: 2 passes out of 9 compared tasks.
    assert summary["totals"]["all"]["compared"] == 9
    assert summary["totals"]["all"]["pass"] == 2
    # The error message is normalized (numbers, addresses) to group by cause.
    causes = {g["cause"] for g in summary["groups"]}
    assert "RuntimeError: fake device failure at ADDR for N elements" in causes
    report = (tmp_path / "out" / "conformance.md").read_text()
    assert "fake.abort" in report and "process killed by SIGABRT" in report


def test_resume_skips_done_tasks(tmp_path):
    plugin = tmp_path / "fake_ops.py"
    plugin.write_text(FAKE_OPS)
    args = ["--extra-ops", str(plugin), "--ops", "fake.good,fake.raises", "--dtypes", "float32"]
    results, _ = _run(tmp_path, *args)
    assert {r["status"] for r in results.values()} == {"pass", "error_ember_only"}
    lines = (tmp_path / "out" / "results.jsonl").read_text().splitlines()
    assert len(lines) == 2
    _run(tmp_path, *args)  # nothing left to do: no new lines
    assert len((tmp_path / "out" / "results.jsonl").read_text().splitlines()) == 2
    _run(tmp_path, *args, "--rerun", "failed")  # reruns only the failure
    lines = (tmp_path / "out" / "results.jsonl").read_text().splitlines()
    assert [json.loads(line)["name"] for line in lines] == ["fake.good", "fake.raises"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("RuntimeError: size 12 at 0x7ffe12 != 3.5e-07", "RuntimeError: size N at ADDR != N"),
        ("first line\nsecond 42", "first line"),
        ("shape [2, 3] vs (4,)", "shape [N, N] vs (N,)"),
    ],
)
def test_normalize(text, expected):
    from torch_ember.conformance.report import normalize

    assert normalize(text) == expected
