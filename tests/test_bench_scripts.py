"""The benchmark scripts beside the suite (benchmarks/): the op breakdown
and ResNet-50's convolution layers at toy size, and the report pieces of the
graph and serving benchmarks from given figures. No timing assertions.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))


def _has_cpu_parity() -> bool:
    return hasattr(torch, "ember") and hasattr(torch.backends.ember, "cpu_parity")


# the process's setting (EMBER_CPU_PARITY may set it): scripts must leave it as it was
PARITY_AT_START = torch.backends.ember.cpu_parity if _has_cpu_parity() else None


def test_op_breakdown_tiny(tmp_path):
    if not hasattr(torch, "ember"):
        pytest.skip("torch_ember is not loaded")
    import op_breakdown

    threads = torch.get_num_threads()
    out = tmp_path / "op_breakdown.md"
    rc = op_breakdown.main(
        ["--tiny", "--workloads", "mlp-b1", "--warmup", "1", "--runs", "1", "--out", str(out)]
    )
    assert rc == 0 and torch.get_num_threads() == threads
    md = out.read_text()
    assert md.startswith(op_breakdown.HEADER) and "## mlp-b1:" in md
    rows = [ln for ln in md.splitlines() if ln.startswith("| `aten::")]
    assert rows, md
    assert any("aten::addmm" in ln or "aten::linear" in ln for ln in rows)
    doc = json.loads((tmp_path / "op_breakdown.json").read_text())
    wl = doc["workloads"][0]
    assert wl["name"] == "mlp-b1"
    expected = ["default", "cpu_parity"] if _has_cpu_parity() else ["default"]
    assert list(wl["modes"]) == expected
    for mode in wl["modes"].values():
        assert mode["ops"] and mode["ops_self_s_per_run"] > 0 and mode["wall_s_per_run"] > 0
        assert sum(o["pct"] for o in mode["ops"]) == pytest.approx(100.0)
    if _has_cpu_parity():
        assert torch.backends.ember.cpu_parity == PARITY_AT_START


def test_conv_layers_tiny(tmp_path):
    if not hasattr(torch, "ember"):
        pytest.skip("torch_ember is not loaded")
    import conv_layers

    async_before = torch.backends.ember.async_execution
    out = tmp_path / "conv_layers.md"
    rc = conv_layers.main(["--tiny", "--rounds", "1", "--calls", "1", "--out", str(out)])
    assert rc == 0 and torch.backends.ember.async_execution == async_before
    layers = conv_layers.conv_layers(tiny=True)
    rows = [ln for ln in out.read_text().splitlines() if ln.startswith("| [")]
    assert len(rows) == len(layers) >= 3
    routes = [row.split("|")[-3].strip() for row in rows]
    assert "channel-gemm" in routes and "?" not in routes, routes
    assert all(float(row.split("|")[-2]) < 1e-5 for row in rows)  # max rel err vs float64


def test_graph_bench_reports_the_decode_floor_from_the_measured_bandwidth():
    import graphs

    r = {
        "times": {"cpu-eager": 0.030, "ember-eager": 0.016, "ember-graph": 0.013},
        "streaming": {"weight_bytes": 500e6, "read_bw": 50e9, "threads": 2},
    }
    text = "\n".join(graphs.streaming_lines(r))
    assert "no step can take less than 10.00 ms" in text
    assert "| ember-graph | 13.000 ms | 38.5 GB/s | 77% | 0.77x |" in text
    assert graphs.streaming_lines({"times": r["times"]}) == []  # not measured: no table


def test_serving_table_gives_medians_and_per_round_ratio_ranges():
    import serving

    labels = ["cpu eager", "ember, 1 device", "ember, one 1-core device, 1 replica", "2 devices"]
    # Round 2 is a slow spell for every configuration: medians per column,
    # ratios per round (each 2.0x against the 1-core device).
    samples = {
        "bert-tiny": {
            labels[0]: [100.0, 50.0, 110.0],
            labels[1]: [150.0, 60.0, 140.0],
            labels[2]: [90.0, 40.0, 100.0],
            labels[3]: [180.0, 80.0, 200.0],
        }
    }
    lines = serving.serving_table(samples, labels, 2)
    assert "median of 3 round(s)" in lines[0]
    row = lines[-1].split(" | ")
    assert row[1:5] == ["100.0", "140.0", "90.0", "180.0"]
    # 2 dev / 1 dev per round: 1.2, 1.333, 1.4286 -> median 1.33 (1.20-1.43)
    assert row[5] == "1.33x (1.20-1.43)"
    assert row[6] == "2.00x (2.00-2.00)"
    assert row[7].rstrip(" |") == "1.80x (1.60-1.82)"
    one_round = {"m": {label: [v[0]] for label, v in samples["bert-tiny"].items()}}
    assert serving.serving_table(one_round, labels, 2)[-1].split(" | ")[5] == "1.20x"


@pytest.mark.usefixtures("held_work")
def test_op_overhead_large_samples_time_computed_results():
    """A large add whose result is dropped at once is never computed on ember
    (the elementwise chain skips it), so the large regime keeps its results."""
    if not hasattr(torch, "ember"):
        pytest.skip("torch_ember is not loaded")
    import op_overhead

    import torch_ember

    a, b = (torch.randn(64, 1024).to("ember") for _ in range(2))
    with torch.no_grad():
        op_overhead._sample_us(torch.add, [a, b], "ember", 3)
        dropped = torch_ember.chain_stats()
        torch_ember.reset_chain_stats()
        op_overhead._sample_us(torch.add, [a, b], "ember", 3, keep=True)
        kept = torch_ember.chain_stats()
    if dropped["chains"] == 0:
        pytest.skip("no elementwise chain on this CPU (needs AVX-512F or AVX2)")
    assert dropped["skipped"] > 0  # what the keep flag is for
    assert kept["skipped"] == 0 and kept["written"] == 3


def test_decoders_tiny(tmp_path):
    if not hasattr(torch, "ember"):
        pytest.skip("torch_ember is not loaded")
    import decoders

    out = tmp_path / "decoders.md"
    rc = decoders.main(
        ["--tiny", "--rounds", "1", "--tokens", "3", "--models", "llama,falcon", "--out", str(out)]
    )
    assert rc == 0
    md = out.read_text()
    assert md.startswith(decoders.HEADER)
    rows = [ln for ln in md.splitlines() if ln.startswith(("| llama |", "| falcon |"))]
    assert len(rows) == 2, md
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert float(cells[1]) > 0 and float(cells[2]) > 0 and cells[3].endswith("x")
    with pytest.raises(SystemExit, match="unknown architectures"):
        decoders.main(["--tiny", "--models", "nope"])
