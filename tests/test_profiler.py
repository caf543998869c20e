"""ember in PyTorch's profiler: device events for ember kernels under
ProfilerActivity.PrivateUse1 (linked to their CPU ops, device time in
key_averages, ember stream rows in the chrome trace), ember allocations
under profile_memory=True, and the autograd profiler's use_device="ember"."""

import json
import warnings

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

import torch_ember  # noqa: F401

BOTH = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]


def _work():
    x = torch.randn(64, 64, device="ember")
    w = torch.randn(64, 64, device="ember")
    torch.ember.synchronize()
    return x, w


def test_privateuse1_activity_is_supported():
    assert ProfilerActivity.PrivateUse1 in torch.profiler.supported_activities()


def test_kernels_are_device_events_linked_to_their_ops():
    x, w = _work()
    with profile(activities=BOTH) as prof:
        y = torch.mm(x, w)
        torch.relu(y)
    kernels = [e for e in prof.events() if e.device_type == DeviceType.PrivateUse1]
    names = [k.name for k in kernels]
    assert any(n.startswith("ember::mm [") for n in names), names
    assert any(n.startswith("ember::relu [") for n in names), names
    for kernel in kernels:
        assert kernel.device_index == 0
        assert kernel.time_range.elapsed_us() >= 0
    # Device time is attributed to the launching op.
    averages = {e.key: e for e in prof.key_averages()}
    assert averages["aten::mm"].device_time_total > 0
    assert averages["aten::relu"].device_time_total > 0
    assert sum(e.self_device_time_total for e in prof.key_averages()) > 0


def test_cpu_activity_alone_records_no_device_events():
    x, w = _work()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.mm(x, w)
    assert not [e for e in prof.events() if e.name.startswith("ember::")]
    assert {e.key: e for e in prof.key_averages()}["aten::mm"].device_time_total == 0


def test_cpu_ops_record_no_device_events():
    a = torch.randn(32, 32)
    with profile(activities=BOTH) as prof:
        torch.mm(a, a)
    assert not [e for e in prof.events() if e.name.startswith("ember::")]


def test_chrome_trace_has_ember_stream_rows(tmp_path):
    x, w = _work()
    with profile(activities=BOTH) as prof:
        torch.mm(x, w)
        side = torch.ember.Stream()
        with torch.ember.stream(side):
            torch.add(x, w)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert {e["name"].split(" [")[0] for e in kernels} >= {"ember::mm", "ember::add"}
    streams = {e["args"]["stream"] for e in kernels}
    assert streams == {"0", str(side.stream_id)}
    rows = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert "ember:0 stream 0" in rows and f"ember:0 stream {side.stream_id}" in rows
    # Kernels are linked to their CPU ops by Kineto's flow events.
    assert all("External id" in e["args"] for e in kernels)


def test_profile_memory_sees_ember_allocations():
    with profile(activities=BOTH, profile_memory=True) as prof:
        a = torch.empty(1 << 20, dtype=torch.uint8, device="ember")
        del a
    averages = {e.key: e for e in prof.key_averages()}
    assert averages["aten::empty"].device_memory_usage >= 1 << 20
    # The free, outside any op, is a [memory] event of its own.
    memory = [e for e in prof.events() if e.name == "[memory]"]
    assert any(e.device_memory_usage <= -(1 << 20) for e in memory)
    assert all(e.cpu_memory_usage == 0 for e in prof.events())  # not counted as CPU


def test_memory_timeline_sees_ember_device(tmp_path):
    x, w = _work()
    with profile(activities=BOTH, profile_memory=True, record_shapes=True, with_stack=True) as prof:
        torch.mm(x, w)
    from torch.profiler._memory_profiler import MemoryProfileTimeline

    timeline = MemoryProfileTimeline(prof._memory_profile())
    times, sizes = timeline._coalesce_timeline(torch.device("ember", 0))
    assert len(times) > 0 and max(max(s) for s in sizes) > 0


def test_autograd_profiler_use_device_ember_without_warnings(capfd):
    x, w = _work()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.autograd.profiler.profile(use_device="ember") as prof:
            torch.mm(x, w)
    err = capfd.readouterr().err
    assert "not enabled" not in err and "INTERNAL ASSERT" not in err
    averages = {e.key: e for e in prof.key_averages()}
    assert averages["aten::mm"].device_time_total > 0
    for event in prof.key_averages():
        assert event.self_device_time_total >= 0


def test_autograd_profiler_use_kineto_device_events():
    x, w = _work()
    with torch.autograd.profiler.profile(use_device="ember", use_kineto=True) as prof:
        torch.mm(x, w)
    assert {e.key: e for e in prof.key_averages()}["aten::mm"].device_time_total > 0


@pytest.mark.parametrize("n", [3])
def test_backward_kernels_are_recorded(n):
    x = torch.randn(16, 16, device="ember", requires_grad=True)
    with profile(activities=BOTH) as prof:
        for _ in range(n):
            (x @ x).sum().backward()
    names = [e.name for e in prof.events() if e.name.startswith("ember::")]
    assert sum(name.startswith("ember::mm [") for name in names) >= 3 * n  # fwd + 2 bwd


def test_a_launched_op_is_recorded_when_the_worker_ran_it():
    # The add is launched behind a 0.2 s sleep queued on the stream: its
    # device event starts when the worker reached it, long after the CPU op
    # (the launch) returned.
    from torch_ember import _C

    x = torch.ones(1000, device="ember")
    with torch.backends.ember.flags(async_execution=True), profile(activities=BOTH) as prof:
        _C._engine_enqueue_sleep(0, 0, 0.2)
        y = x + 1
        torch.ember.synchronize()
    assert torch.equal(y.cpu(), torch.full((1000,), 2.0))
    kernels = [e for e in prof.events() if e.name.startswith("ember::add [")]
    launches = [e for e in prof.events() if e.name == "aten::add"]
    assert len(kernels) == 1 and len(launches) == 1
    gap_us = kernels[0].time_range.start - launches[0].time_range.end
    assert gap_us > 100_000, gap_us
