"""Graph capture errors as CUDA raises them: capture on the default stream,
sync points and host reads inside a capture, capture_end on the wrong stream
or thread, capture_error_mode, cross-stream fork/join, replay before capture
and double capture (the replay tests are in test_graphs.py)."""

import contextlib
import threading

import pytest
import torch

DEV = "ember"


def test_capture_on_the_default_stream_is_refused():
    g = torch.ember.EmberGraph()
    with pytest.raises(RuntimeError, match="non-default stream"):
        g.capture_begin()
    torch.ones(2, device=DEV).add_(1)  # nothing left capturing


@pytest.mark.parametrize(
    "sync_point",
    [
        lambda t: t.sum().item(),
        lambda t: t.cpu(),
        lambda t: torch.ember.synchronize(),
        lambda t: print(t),
    ],
    ids=["item", "cpu", "synchronize", "print"],
)
def test_a_sync_point_inside_capture_raises_and_leaves_ember_usable(sync_point):
    x = torch.ones(4, device=DEV)
    g = torch.ember.EmberGraph()
    with pytest.raises(RuntimeError, match="captur"), torch.ember.graph(g):
        y = x * 2
        sync_point(y)
    assert not torch.ember.is_current_stream_capturing()
    with pytest.raises(RuntimeError, match="no captured graph"):
        g.replay()
    assert (x * 3).cpu().tolist() == [3.0] * 4


def test_a_host_tensor_read_inside_capture_is_refused():
    x = torch.ones(4, device=DEV)
    host = torch.arange(4.0)
    g = torch.ember.EmberGraph()
    with pytest.raises(RuntimeError, match="cannot be captured"), torch.ember.graph(g):
        x.copy_(host)
    assert torch.equal(x.cpu(), torch.ones(4))


def test_capture_must_end_on_its_stream():
    g = torch.ember.EmberGraph()
    s = torch.ember.Stream()
    x = torch.ones(2, device=DEV)
    with torch.ember.stream(s):
        g.capture_begin()
        x.mul_(2)
    with pytest.raises(RuntimeError, match="same stream"):
        g.capture_end()
    assert not torch.ember.is_current_stream_capturing()


def _errors_on_another_thread(fn):
    """The RuntimeErrors fn() raises when it runs on a new thread."""
    errors = []

    def run():
        try:
            fn()
        except RuntimeError as e:
            errors.append(str(e))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return errors


@contextlib.contextmanager
def _capturing_on_a_side_stream(mode):
    """A graph capturing in `mode` on a new stream (current inside the block)."""
    g, s = torch.ember.EmberGraph(), torch.ember.Stream()
    with torch.ember.stream(s):
        g.capture_begin(capture_error_mode=mode)
        yield g, s


@pytest.mark.parametrize(
    "mode, refused_here, refused_elsewhere",
    [("global", True, True), ("thread_local", True, False), ("relaxed", False, False)],
)
def test_capture_error_mode_decides_which_device_waits_raise(mode, refused_here, refused_elsewhere):
    """As cudaStreamCaptureMode: "global" refuses a device-wide wait from any
    thread, "thread_local" only from the capturing thread, "relaxed" none; the
    capture survives an allowed wait and replays what it recorded."""
    x = torch.ones(4, device=DEV)
    with _capturing_on_a_side_stream(mode) as (g, _):
        x.mul_(2)
        if refused_here:
            with pytest.raises(RuntimeError, match=f'capture_error_mode="{mode}"'):
                torch.ember.synchronize()
        else:
            torch.ember.synchronize()
        errors = _errors_on_another_thread(torch.ember.synchronize)
        x.add_(1)
        g.capture_end()
    assert len(errors) == refused_elsewhere
    assert x.cpu().tolist() == [3.0] * 4
    g.replay()
    assert x.cpu().tolist() == [7.0] * 4


@pytest.mark.parametrize("mode", ["global", "thread_local", "relaxed"])
def test_capture_end_on_another_thread_is_refused_and_the_capture_goes_on(mode):
    """ember routes a capture's allocations per thread, so unlike CUDA's
    relaxed mode no capture ends on another thread; the refusal leaves the
    capture underway, to end on its own thread."""
    x = torch.ones(2, device=DEV)
    with _capturing_on_a_side_stream(mode) as (g, s):
        x.mul_(2)

        def end():
            with torch.ember.stream(s):
                g.capture_end()

        errors = _errors_on_another_thread(end)
        assert len(errors) == 1 and "thread that called capture_begin" in errors[0]
        assert torch.ember.is_current_stream_capturing()
        g.capture_end()
    g.replay()
    assert x.cpu().tolist() == [4.0] * 2


def test_capture_across_streams_forks_and_joins_like_cuda():
    """A side stream that waits on an event recorded during the capture joins
    it; the origin waiting on the side stream's event joins it back. The
    replay runs both streams' work in submission order."""
    x = torch.ones(4, device=DEV)
    g = torch.ember.EmberGraph()
    origin, side = torch.ember.Stream(), torch.ember.Stream()
    with torch.ember.stream(origin):
        g.capture_begin()
        a = x * 2
        side.wait_event(origin.record_event())  # fork
        with torch.ember.stream(side):
            assert torch.ember.is_current_stream_capturing()
            b = a + 1
        origin.wait_event(side.record_event())  # join
        c = a * b
        g.capture_end()
        assert not torch.ember.is_current_stream_capturing()
    with torch.ember.stream(side):
        assert not torch.ember.is_current_stream_capturing()
    assert c.cpu().tolist() == [6.0] * 4
    x.fill_(3)
    g.replay()
    assert c.cpu().tolist() == [42.0] * 4  # 6 * 7


def test_capture_with_a_side_stream_not_joined_back_raises_and_ends_it():
    x = torch.ones(4, device=DEV)
    g = torch.ember.EmberGraph()
    origin, side = torch.ember.Stream(), torch.ember.Stream()
    with torch.ember.stream(origin):
        g.capture_begin()
        a = x * 2
        side.wait_event(origin.record_event())
        with torch.ember.stream(side):
            a.add_(1)  # never joined back
        with pytest.raises(RuntimeError, match="not joined back"):
            g.capture_end()
    with torch.ember.stream(side):
        assert not torch.ember.is_current_stream_capturing()
    torch.ember.synchronize()  # nothing capturing any more
    assert a.cpu().tolist() == [3.0] * 4
    with pytest.raises(RuntimeError, match="no captured graph"):
        g.replay()


def test_replay_before_capture_and_double_capture_raise():
    g = torch.ember.EmberGraph()
    with pytest.raises(RuntimeError, match="no captured graph"):
        g.replay()
    x = torch.ones(2, device=DEV)
    with torch.ember.graph(g):
        x.add_(1)
    with (
        pytest.raises(RuntimeError, match="already owns a captured graph"),
        torch.ember.graph(g),
    ):
        x.add_(1)
    g.reset()
    with torch.ember.graph(g):  # reusable after reset
        x.add_(1)
    g.replay()


def test_empty_capture_and_bad_mode_raise():
    g = torch.ember.EmberGraph()
    with pytest.raises(RuntimeError, match="recorded no work"), torch.ember.graph(g):
        pass
    with pytest.raises(ValueError, match="capture_error_mode"):
        g.capture_begin(capture_error_mode="loose")
