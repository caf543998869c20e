"""Streams and events of ember devices (torch.ember.Stream/Event, torch.Stream,
torch.Event)."""

import time

import pytest
import torch


def test_current_stream_is_default_stream():
    current = torch.ember.current_stream()
    default = torch.ember.default_stream()
    assert default.stream_id == 0
    assert default.device == torch.device("ember", 0)
    assert current == default
    assert isinstance(current, torch.ember.Stream)
    assert isinstance(current, torch.Stream)


def test_new_streams_get_new_ids():
    first = torch.ember.Stream()
    second = torch.ember.Stream()
    ids = {first.stream_id, second.stream_id}
    assert len(ids) == 2
    assert 0 not in ids
    assert first.device == torch.device("ember", 0)
    assert first != second
    assert first != torch.ember.default_stream()


def test_generic_torch_stream_on_ember():
    stream = torch.Stream(device="ember")
    assert stream.device == torch.device("ember", 0)
    assert stream.stream_id != 0
    assert stream.stream_id != torch.Stream(device="ember").stream_id


def test_stream_context_makes_stream_current_and_restores():
    stream = torch.ember.Stream()
    with torch.ember.stream(stream):
        assert torch.ember.current_stream() == stream
        assert torch.accelerator.current_stream() == stream
        x = torch.arange(4.0, device="ember") * 3
    assert torch.ember.current_stream() == torch.ember.default_stream()
    assert torch.equal(x.cpu(), torch.arange(4.0) * 3)


def test_stream_context_restores_when_body_raises():
    stream = torch.ember.Stream()
    with pytest.raises(KeyError), torch.ember.stream(stream):
        raise KeyError("boom")
    assert torch.ember.current_stream() == torch.ember.default_stream()


def test_stream_context_with_none_is_noop():
    with torch.ember.stream(None):
        assert torch.ember.current_stream() == torch.ember.default_stream()


def test_torch_stream_as_context_manager():
    stream = torch.Stream(device="ember")
    with stream:
        assert torch.ember.current_stream().stream_id == stream.stream_id
    assert torch.ember.current_stream() == torch.ember.default_stream()


def test_set_stream():
    stream = torch.ember.Stream()
    torch.ember.set_stream(stream)
    assert torch.ember.current_stream() == stream
    torch.ember.set_stream(torch.ember.default_stream())
    assert torch.ember.current_stream().stream_id == 0


@pytest.mark.requires_two_devices
def test_streams_are_per_device():
    stream1 = torch.ember.Stream(device=1)
    assert stream1.device == torch.device("ember", 1)
    assert torch.ember.default_stream(1).device == torch.device("ember", 1)
    torch.ember.set_stream(stream1)
    assert torch.ember.current_stream(1) == stream1
    torch.ember.set_device(0)
    assert torch.ember.current_stream(0) == torch.ember.default_stream(0)


@pytest.mark.requires_two_devices
def test_stream_context_on_other_device_restores_current_device():
    stream1 = torch.ember.Stream(device=1)
    assert torch.ember.current_device() == 0
    with torch.ember.stream(stream1):
        assert torch.ember.current_stream(1) == stream1
    assert torch.ember.current_stream(1) == torch.ember.default_stream(1)
    assert torch.ember.current_stream(0) == torch.ember.default_stream(0)
    assert torch.ember.current_device() == 0


def test_event_record_synchronize_query():
    event = torch.ember.Event(enable_timing=True)
    x = torch.ones(100, device="ember").cumsum(0)
    event.record()
    event.synchronize()
    assert event.query()
    assert event.device == torch.device("ember", 0)
    assert torch.equal(x.cpu(), torch.arange(1.0, 101.0))


def test_elapsed_time_is_non_negative_and_grows_with_sleep():
    start = torch.ember.Event(enable_timing=True)
    middle = torch.ember.Event(enable_timing=True)
    end = torch.ember.Event(enable_timing=True)
    start.record()
    middle.record()
    sleep_s = 0.05
    time.sleep(sleep_s)
    end.record()
    end.synchronize()
    short = start.elapsed_time(middle)
    long = start.elapsed_time(end)
    assert short >= 0
    assert long >= sleep_s * 1000 * 0.5
    assert long > short


def _recorded(enable_timing: bool) -> torch.ember.Event:
    event = torch.ember.Event(enable_timing=enable_timing)
    event.record()
    return event


# torch 2.13's CUDAEvent::elapsed_time (and c10's InlineEvent) raise these with
# TORCH_CHECK_VALUE, i.e. ValueError; ember matches CUDA.
def test_elapsed_time_requires_timing():
    with pytest.raises(ValueError, match="enable_timing"):
        _recorded(False).elapsed_time(_recorded(False))
    with pytest.raises(ValueError, match="enable_timing"):
        _recorded(True).elapsed_time(_recorded(False))


def test_elapsed_time_requires_recorded_events():
    recorded = _recorded(True)
    unrecorded = torch.ember.Event(enable_timing=True)
    with pytest.raises(ValueError, match="recorded"):
        recorded.elapsed_time(unrecorded)
    with pytest.raises(ValueError, match="recorded"):
        unrecorded.elapsed_time(recorded)


def test_event_on_explicit_stream_and_wait():
    producer = torch.ember.Stream()
    consumer = torch.ember.Stream()
    with torch.ember.stream(producer):
        x = torch.arange(10.0, device="ember") + 1
        event = torch.ember.Event()
        event.record(producer)
    event.wait(consumer)
    with torch.ember.stream(consumer):
        y = x * 2
    assert torch.equal(y.cpu(), (torch.arange(10.0) + 1) * 2)
    assert event.query()


def test_stream_wait_event_wait_stream_record_event():
    first = torch.ember.Stream()
    second = torch.ember.Stream()
    with torch.ember.stream(first):
        x = torch.full((8,), 2.0, device="ember")
    timed = torch.ember.Event(enable_timing=True)
    returned = first.record_event(timed)
    assert returned is timed
    second.wait_event(timed)
    second.wait_stream(first)
    created = second.record_event()
    assert isinstance(created, torch.Event)
    assert created.query()
    # record_event really recorded: elapsed_time needs recorded events.
    later = torch.ember.Event(enable_timing=True)
    later.record(second)
    assert timed.elapsed_time(later) >= 0
    with torch.ember.stream(second):
        y = x + 1
    assert torch.equal(y.cpu(), torch.full((8,), 3.0))


def test_stream_query_after_synchronize():
    stream = torch.ember.Stream()
    with torch.ember.stream(stream):
        x = torch.randn(64, 64, device="ember")
        y = x @ x
    stream.synchronize()
    assert stream.query()
    torch.ember.synchronize()
    assert torch.ember.default_stream().query()
    assert torch.allclose(y.cpu(), x.cpu() @ x.cpu())


def test_generic_torch_event():
    start = torch.Event(device="ember", enable_timing=True)
    end = torch.Event(device="ember", enable_timing=True)
    start.record()
    time.sleep(0.02)
    end.record()
    end.synchronize()
    assert start.query()
    assert start.device == torch.device("ember", 0)
    assert end.elapsed_time(start) <= 0 <= start.elapsed_time(end)
    assert start.elapsed_time(end) >= 20 * 0.5


def test_generic_torch_event_requires_timing():
    start = torch.Event(device="ember")
    end = torch.Event(device="ember")
    start.record()
    end.record()
    with pytest.raises(ValueError):
        start.elapsed_time(end)


@pytest.mark.requires_two_devices
def test_events_and_synchronize_on_second_device():
    stream = torch.ember.Stream(device=1)
    event = torch.Event(device="ember:1")
    event.record(stream)
    assert event.device == torch.device("ember", 1)
    assert event.query()
    torch.ember.synchronize(1)
    torch.accelerator.synchronize(1)
