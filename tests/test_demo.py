"""`make demo` (python -m torch_ember.demo) runs and reports agreement."""

import subprocess
import sys

import pytest

pytest.importorskip("transformers")

# A tiny model and one timed run: this checks the demo works, not its numbers.
TINY = [
    "--quick",
    "--layers=1",
    "--width=64",
    "--heads=2",
    "--vocab=500",
    "--seq-len=32",
    "--prompt-len=8",
    "--new-tokens=4",
    "--runs=1",
    "--warmup=0",
]


def test_demo_main_in_process(capsys):
    from torch_ember import demo

    assert demo.main(TINY) == 0
    out = capsys.readouterr().out
    assert "generated ids identical: True" in out
    assert "replayed tokens identical to eager: True" in out
    assert "forward logits bitwise identical, cpu_parity (eager attention): True" in out
    assert "within fp32 rounding, default kernels (eager attention): True" in out
    assert "within fp32 rounding, default kernels (sdpa attention): True" in out
    assert "ember/CPU" in out and "max_memory_allocated" in out and "fallback_stats" in out


def test_python_dash_m_demo():
    result = subprocess.run(
        [sys.executable, "-m", "torch_ember.demo", *TINY],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    # Both streams: the demo reports a failed check on stdout, a crash on stderr.
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "generated ids identical: True" in result.stdout


def test_import_torch_ember_first():
    result = subprocess.run(
        [sys.executable, "-c", "import torch_ember, torch; torch.empty(1, device='ember')"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
