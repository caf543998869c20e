"""torch.cuda's memory tools on ember: memory_summary (torch.cuda's table),
memory_snapshot / _record_memory_history / _snapshot in the format
torch.cuda._memory_viz renders, get_per_process_memory_fraction and
caching_allocator_alloc/delete."""

import pickle

import pytest
import torch
from torch.cuda import _memory_viz

import torch_ember

MiB = 1 << 20

pytestmark = pytest.mark.usefixtures("clean_memory")


@pytest.fixture
def history():
    torch.ember.memory._record_memory_history("all", context="all", stacks="python")
    yield
    torch.ember.memory._record_memory_history(None)


def _line(summary: str, metric: str) -> list[str]:
    row = next(line for line in summary.splitlines() if line.startswith(f"| {metric}"))
    return [cell.strip() for cell in row.strip("|").split("|")]


def test_memory_summary_has_torch_cuda_layout_and_ember_values():
    x = torch.empty(3 * MiB, dtype=torch.uint8, device="ember")
    summary = torch.ember.memory_summary()
    lines = summary.splitlines()
    assert all(len(line) == 77 for line in lines), {len(line) for line in lines}
    assert "PyTorch ember memory summary, device ID 0" in summary
    assert "CUDA" not in summary and "GPU" not in summary
    assert "from large pool" in summary and "from small pool" in summary
    allocated = torch.ember.memory_allocated()
    cells = _line(summary, "Allocated memory")
    assert cells[1] == f"{allocated // 1024:6d} KiB".strip()
    assert _line(summary, "Allocations")[1] == str(
        torch.ember.memory_stats()["allocation.all.current"]
    )
    # The large pool row carries the 3 MiB block.
    large = next(line for line in lines if "from large pool" in line)
    assert int(large.split("|")[2].split()[0]) >= 3 * 1024
    del x


def test_memory_summary_abbreviated_and_device_argument():
    summary = torch.ember.memory_summary("ember:0", abbreviated=True)
    assert "from large pool" not in summary
    assert summary.startswith("|====")


def test_memory_snapshot_segments_and_blocks():
    x = torch.empty(5 * MiB, dtype=torch.uint8, device="ember")
    segments = torch.ember.memory_snapshot()
    reserved = sum(s["total_size"] for s in segments if s["device"] == 0)
    assert reserved == torch.ember.memory_reserved()
    blocks = [b for s in segments for b in s["blocks"]]
    mine = [b for b in blocks if b["address"] == x.data_ptr()]
    assert len(mine) == 1
    assert mine[0]["state"] == "active_allocated"
    assert mine[0]["requested_size"] == x.nbytes
    for segment in segments:
        assert sum(b["size"] for b in segment["blocks"]) == segment["total_size"]
        assert segment["segment_type"] in ("small", "large")
    del x


def test_record_memory_history_and_memory_viz_render(history, tmp_path):
    x = torch.randn(256, 256, device="ember")
    y = torch.ones(64, device="ember")
    address = y.data_ptr()
    del y
    snapshot = torch.ember.memory._snapshot()
    trace = snapshot["device_traces"][0]
    actions = [(e["action"], e["addr"]) for e in trace]
    assert ("alloc", x.data_ptr()) in actions
    assert ("alloc", address) in actions and ("free_completed", address) in actions
    alloc = next(e for e in trace if e["action"] == "alloc" and e["addr"] == x.data_ptr())
    assert any(f["filename"] == __file__ for f in alloc["frames"])  # the Python stack
    # Live blocks carry the stack that allocated them.
    block = next(
        b for s in snapshot["segments"] for b in s["blocks"] if b["address"] == x.data_ptr()
    )
    assert any(
        f["name"] == "test_record_memory_history_and_memory_viz_render" for f in block["frames"]
    )
    # PyTorch's visualiser renders it.
    assert "<html" in _memory_viz.trace_plot(snapshot).lower()
    assert "<html" in _memory_viz.segment_plot(snapshot).lower()
    path = tmp_path / "snapshot.pickle"
    torch.ember.memory._dump_snapshot(str(path))
    with open(path, "rb") as f:
        assert pickle.load(f)["device_traces"][0]


def test_record_memory_history_off_and_max_entries():
    torch.ember.memory._record_memory_history("all", stacks="python", max_entries=3)
    try:
        for _ in range(5):
            torch.ones(8, device="ember")
        assert len(torch.ember.memory._snapshot()["device_traces"][0]) == 3
    finally:
        torch.ember.memory._record_memory_history(None)
    torch.ones(8, device="ember")
    assert torch.ember.memory._snapshot()["device_traces"][0] == []
    with pytest.raises(ValueError):
        torch.ember.memory._record_memory_history("everything")


def test_per_process_memory_fraction_round_trip():
    assert torch.ember.get_per_process_memory_fraction() == pytest.approx(1.0)
    try:
        torch.ember.set_per_process_memory_fraction(0.25)
        assert torch.ember.get_per_process_memory_fraction() == pytest.approx(0.25, rel=1e-6)
    finally:
        torch.ember.set_per_process_memory_fraction(1.0)


def test_caching_allocator_alloc_delete():
    before = torch.ember.memory_allocated()
    ptr = torch.ember.caching_allocator_alloc(MiB)
    assert ptr % 64 == 0
    assert torch.ember.memory_allocated() - before >= MiB
    assert torch_ember._C.memory_snapshot(False)["segments"]  # inside ember's pool
    torch.ember.caching_allocator_delete(ptr)
    assert torch.ember.memory_allocated() == before
    with pytest.raises(RuntimeError, match="invalid device pointer"):
        torch.ember.caching_allocator_delete(ptr)
