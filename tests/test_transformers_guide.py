"""docs/transformers-guide.md runs as written: its python blocks in order in
one fresh interpreter, and train_ddp.py under torchrun on two processes."""

import os
import re
import socket
import subprocess
import sys

import pytest

GUIDE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "transformers-guide.md"
)
FILE_MARK = re.compile(r"<!-- file: (\S+) -->\s*```python\n(.*?)```", re.DOTALL)
BLOCK = re.compile(r"```python\n(.*?)```", re.DOTALL)


def _blocks():
    with open(GUIDE) as f:
        text = f.read()
    files = dict(FILE_MARK.findall(text))
    inline = [b for b in BLOCK.findall(text) if b not in files.values()]
    return inline, files


def _env():
    return dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")


def test_guide_has_snippets():
    inline, files = _blocks()
    assert len(inline) >= 6 and "train_ddp.py" in files


def test_guide_snippets_run(tmp_path):
    pytest.importorskip("transformers")
    inline, _ = _blocks()
    script = tmp_path / "guide.py"
    script.write_text("\n\n".join(inline))
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "ember" in result.stdout and "allocator events" in result.stdout


def test_guide_ddp_script_runs_under_torchrun(tmp_path):
    pytest.importorskip("transformers")
    _, files = _blocks()
    (tmp_path / "train_ddp.py").write_text(files["train_ddp.py"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-addr", "127.0.0.1", "--master-port", str(port), "train_ddp.py"],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert "step 2: loss" in result.stdout
