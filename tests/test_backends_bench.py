"""benchmarks/flags.py (make bench-flags) runs every section at toy sizes
(--quick) and writes its JSON; measurements themselves are not checked."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "flags.py"
SECTIONS = {
    "precision": "a",
    "blas": "b",
    "autotune": "c",
    "sdpa": "d",
    "determinism": "e",
    "verbose": "f",
}


def test_every_section_runs_at_toy_size(tmp_path):
    out = tmp_path / "flags.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--rounds", "1", "--json", str(out)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    sections = report["sections"]
    assert list(sections) == list(SECTIONS)
    for name, letter in SECTIONS.items():
        assert f"## ({letter}) " in result.stdout, name
        if name != "determinism":
            assert sections[name]["status"] == "ok", (name, sections[name]["status"])
            assert sections[name]["rows"], name
    determinism = sections["determinism"]["status"]
    assert determinism == "ok" or determinism.startswith("not available")

    precision = {row["mode"]: row for row in sections["precision"]["rows"]}
    assert set(precision) == {"ieee", "bf16", "bf16x3"}
    assert precision["ieee"]["bitwise_equal_ieee"]
    blas = [row["library"] for row in sections["blas"]["rows"]]
    assert blas[0] == "default"
    sdpa = {row["path"]: row for row in sections["sdpa"]["rows"]}
    assert sdpa["flash"]["peak_mib"] < sdpa["math"]["peak_mib"]
    assert report["machine"]["threads"] >= 1 and report["quick"] is True
    assert "| path | ms | peak memory (MiB)" in result.stdout


def test_unknown_section_is_refused(capsys):
    spec = importlib.util.spec_from_file_location("ember_bench_flags", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(SystemExit) as exit_:
        module.main(["--sections", "precison"])
    assert exit_.value.code == 2
    assert "unknown sections ['precison']" in capsys.readouterr().err
