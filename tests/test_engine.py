"""The execution engine seen from PyTorch: queued work on stream workers,
events that complete when the work before them does, cross-stream waits,
asynchronous errors raised at the next synchronisation point, fork, and
devices that own their cores.

Queued work here is the engine's test work (``_engine_enqueue_sleep`` /
``_engine_enqueue_failure``): it shows the semantics without depending on
how long a kernel takes."""

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch

from torch_ember import _C

SLEEP = 0.2


def _sleep_on(stream, seconds=SLEEP):
    _C._engine_enqueue_sleep(stream.device_index, stream.stream_id, seconds)


def _run(code, **env):
    """Runs `code` in a fresh interpreter with `env` added; returns stdout."""
    full_env = {**os.environ, **env}
    for key, value in env.items():
        if value is None:
            full_env.pop(key)
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env,
        capture_output=True,
        check=False,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_queued_work_makes_stream_and_event_incomplete_until_done():
    stream = torch.ember.Stream()
    _sleep_on(stream)
    assert not stream.query()
    event = stream.record_event()
    assert not event.query()
    event.synchronize()
    assert event.query()
    assert stream.query()


def test_event_time_is_when_the_work_before_it_finished():
    stream = torch.ember.Stream()
    start = torch.ember.Event(enable_timing=True)
    end = torch.ember.Event(enable_timing=True)
    start.record(stream)
    _sleep_on(stream)
    end.record(stream)  # returns at once; the time is taken by the worker
    end.synchronize()
    assert start.elapsed_time(end) >= SLEEP * 1000


def test_elapsed_time_before_completion_raises():
    stream = torch.ember.Stream()
    start = torch.ember.Event(enable_timing=True)
    end = torch.ember.Event(enable_timing=True)
    start.record(stream)
    _sleep_on(stream)
    end.record(stream)
    with pytest.raises(RuntimeError, match="completed"):
        start.elapsed_time(end)
    end.synchronize()


def test_wait_stream_orders_the_waiting_stream_after_the_other():
    producer = torch.ember.Stream()
    consumer = torch.ember.Stream()
    _sleep_on(producer)
    consumer.wait_stream(producer)
    assert not consumer.query()  # its queue holds the wait
    consumer.synchronize()
    assert producer.query()


def test_an_op_on_a_stream_runs_after_the_work_queued_on_it():
    stream = torch.ember.Stream()
    x = torch.arange(6.0, device="ember")
    _sleep_on(stream)
    with torch.ember.stream(stream):
        y = x * 2  # runs after the queued sleep (stream order)
        y.add_(1)  # and this after it
        stream.synchronize()
        assert stream.query()
    assert torch.equal(y.cpu(), torch.arange(6.0) * 2 + 1)


def test_streams_of_a_device_run_queued_work_concurrently():
    # Two sleeps on two streams overlap: done in about one sleep, not two.
    a, b = torch.ember.Stream(), torch.ember.Stream()
    begin = time.monotonic()
    _sleep_on(a, 0.4)
    _sleep_on(b, 0.4)
    a.synchronize()
    b.synchronize()
    assert time.monotonic() - begin < 0.75


def test_async_error_is_raised_at_the_next_synchronize_with_the_op_name():
    stream = torch.ember.Stream()
    _C._engine_enqueue_failure(0, stream.stream_id, "aten::my_kernel", "bad input")
    with pytest.raises(RuntimeError, match=r"asynchronous error in aten::my_kernel: bad input"):
        torch.ember.synchronize()
    torch.ember.synchronize()  # reported once
    stream.synchronize()


def test_async_error_is_raised_by_stream_and_event_synchronize():
    stream = torch.ember.Stream()
    _C._engine_enqueue_failure(0, stream.stream_id, "aten::first", "boom")
    with pytest.raises(RuntimeError, match="aten::first"):
        stream.synchronize()
    _C._engine_enqueue_failure(0, stream.stream_id, "aten::second", "boom")
    event = stream.record_event()
    with pytest.raises(RuntimeError, match="aten::second"):
        event.synchronize()


def test_async_error_is_raised_by_the_next_op_on_the_stream():
    stream = torch.ember.Stream()
    x = torch.ones(3, device="ember")
    _C._engine_enqueue_failure(0, stream.stream_id, "aten::broken", "boom")
    # The failure is reported by the first launch or synchronisation after
    # it ran (as CUDA reports a kernel error at the next API call).
    with torch.ember.stream(stream), pytest.raises(RuntimeError, match="aten::broken"):
        x + 1
        stream.synchronize()
    with torch.ember.stream(stream):
        assert torch.equal((x + 1).cpu(), torch.full((3,), 2.0))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_child_of_an_idle_engine_gets_fresh_workers():
    stream = torch.ember.Stream()
    _sleep_on(stream, 0.01)
    stream.synchronize()
    pid = os.fork()
    if pid == 0:  # child: a fresh worker runs the queued work
        code = 1
        try:
            _sleep_on(stream, 0.01)
            stream.synchronize()
            x = torch.arange(3.0, device="ember") + 1
            code = 0 if x.cpu().tolist() == [1.0, 2.0, 3.0] else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_with_work_in_flight_raises_in_the_child_instead_of_hanging():
    out = _run(
        """
        import os, torch
        from torch_ember import _C
        s = torch.ember.Stream()
        x = torch.ones(2, device="ember")
        _C._engine_enqueue_sleep(0, s.stream_id, 1.0)
        pid = os.fork()
        if pid == 0:
            try:
                x + 1
                os._exit(1)
            except RuntimeError as e:
                os._exit(0 if "forked" in str(e) and "spawn" in str(e) else 2)
        _, status = os.waitpid(pid, 0)
        print("child", os.WEXITSTATUS(status))
        s.synchronize()
        print("parent", (x + 1).cpu().tolist())
        """
    )
    assert "child 0" in out
    assert "parent [2.0, 2.0]" in out


def test_devices_own_disjoint_cores():
    allowed = sorted(os.sched_getaffinity(0))
    count = torch.ember.device_count()
    seen = []
    for i in range(count):
        props = torch.ember.get_device_properties(i)
        assert props.cores == len(props.core_ids) >= 1
        assert set(props.core_ids) <= set(allowed)
        seen.extend(props.core_ids)
    if count <= len(allowed):
        assert sorted(seen) == allowed  # a partition: disjoint, covering
    else:
        assert set(seen) == set(allowed)  # more devices than cores: shared


def test_workers_are_pinned_and_run_with_their_device_thread_count():
    # A fresh stream's worker: pinned, with its device's thread count (ops
    # launched on it then run with min(launching thread's count, cores)).
    for i in range(torch.ember.device_count()):
        cores = torch.ember.get_device_properties(i).core_ids
        stream = torch.ember.Stream(f"ember:{i}")
        threads, cpus = _C._engine_worker_threads(i, stream.stream_id)
        assert cpus == cores
        assert threads == len(cores)


def test_inline_ops_follow_the_thread_count_unless_the_thread_is_bound():
    # Ops follow torch.set_num_threads (as on CPU: cpu_parity stays bitwise
    # CPU's); a thread bound with use_device_cores runs them on its device's
    # cores. Bound in a fresh thread: the binding is the thread's.
    threads = torch.get_num_threads()
    assert _C._engine_inline_threads(0) == threads
    seen = {}

    def bound():
        seen["cores"] = torch.ember.use_device_cores(0)
        seen["affinity"] = sorted(os.sched_getaffinity(0))
        seen["threads"] = _C._engine_inline_threads(0)

    t = threading.Thread(target=bound)
    t.start()
    t.join()
    cores = torch.ember.get_device_properties(0).core_ids
    assert seen == {"cores": cores, "affinity": cores, "threads": len(cores)}
    assert _C._engine_inline_threads(0) == threads  # this thread unchanged


def test_ember_devices_partitions_the_process_cores():
    out = _run(
        """
        import os, torch
        from torch_ember import _C
        print(sorted(os.sched_getaffinity(0)))
        for i in range(torch.ember.device_count()):
            print(torch.ember.get_device_properties(i).core_ids, _C._engine_worker_threads(i, 0))
        """,
        EMBER_DEVICES="2",
        EMBER_DEVICE_CORES=None,
    )
    allowed, *devices = out.strip().splitlines()
    allowed = eval(allowed)
    if len(allowed) < 2:
        pytest.skip("needs 2 cores")
    cores = [eval(line.split("] ")[0] + "]") for line in devices]
    half = (len(allowed) + 1) // 2
    assert cores == [allowed[:half], allowed[half:]]


def test_ember_device_cores_sets_them_explicitly():
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs 2 cores")
    spec = f"{allowed[1]},{allowed[0]}"
    out = _run(
        """
        import torch
        from torch_ember import _C
        print(torch.ember.device_count())
        for i in range(torch.ember.device_count()):
            print(torch.ember.get_device_properties(i).core_ids, _C._engine_worker_threads(i, 0)[1])
        """,
        EMBER_DEVICES=None,
        EMBER_DEVICE_CORES=spec,
    )
    lines = out.strip().splitlines()
    assert lines[0] == "2"
    assert lines[1] == f"[{allowed[1]}] [{allowed[1]}]"
    assert lines[2] == f"[{allowed[0]}] [{allowed[0]}]"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0-1,1", "core 1 is given to ember:0 and ember:1"),
        ("0,4096", "core 4096 is not available to this process"),
        ("0,,1", "device 1 has no cores"),
        ("zero", "'zero' is not a core number"),
    ],
)
def test_invalid_ember_device_cores_is_raised_at_first_use_not_import(value, message):
    out = _run(
        """
        import warnings
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            import torch  # never fails
            available = torch.ember.is_available()
        print("available", available)
        try:
            torch.ones(1, device="ember")
        except RuntimeError as e:
            print("error", e)
        """,
        EMBER_DEVICE_CORES=value,
        EMBER_DEVICES=None,
    )
    assert "available False" in out
    assert f"EMBER_DEVICE_CORES='{value}' is invalid: {message}" in out


def test_ember_device_cores_must_agree_with_ember_devices():
    out = _run(
        """
        import torch
        try:
            torch.ones(1, device="ember")
        except RuntimeError as e:
            print("error", e)
        """,
        EMBER_DEVICE_CORES="0",
        EMBER_DEVICES="2",
    )
    assert "gives 1 device(s) but EMBER_DEVICES=2" in out


def test_launch_blocking_runs_queued_work_at_the_call():
    out = _run(
        """
        import time, torch
        from torch_ember import _C
        s = torch.ember.Stream()
        begin = time.monotonic()
        _C._engine_enqueue_sleep(0, s.stream_id, 0.2)
        print("blocked", time.monotonic() - begin >= 0.2, "idle", s.query())
        try:
            _C._engine_enqueue_failure(0, s.stream_id, "aten::bad", "at the call")
        except RuntimeError as e:
            print("raised", e)
        """,
        EMBER_LAUNCH_BLOCKING="1",
    )
    assert "blocked True idle True" in out
    assert "raised at the call" in out


def test_invalid_launch_blocking_is_raised_at_first_use():
    out = _run(
        """
        import torch
        try:
            torch.ones(1, device="ember")
        except RuntimeError as e:
            print("error", e)
        """,
        EMBER_LAUNCH_BLOCKING="2",
    )
    assert "EMBER_LAUNCH_BLOCKING='2' is invalid: expected 0 or 1" in out


def test_stress_threads_devices_streams_with_events_match_cpu():
    """8 Python threads x 2 devices x 2 streams: each thread runs a random
    chain of uploads (non_blocking from pinned memory: queued), ops and
    cross-stream event waits on its own data, then compares with the same
    chain on CPU (bitwise: these ops run CPU's kernels). Bounded: a fixed
    number of steps per thread."""
    import random

    devices = list(range(min(2, torch.ember.device_count())))
    streams = {d: [torch.ember.default_stream(d), torch.ember.Stream(device=d)] for d in devices}
    failures = []

    def worker(seed):
        rng = random.Random(seed)
        gen = torch.Generator().manual_seed(seed)
        expected = torch.randn(257, generator=gen)
        device = rng.choice(devices)
        x = expected.to(f"ember:{device}")
        event = None
        try:
            for _ in range(40):
                d = rng.choice(devices)
                s = rng.choice(streams[d])
                if d != device:
                    torch.ember.synchronize(device)  # cross-device: a host-visible read
                    x = x.to(f"ember:{d}")
                    device = d
                    event = None
                with torch.ember.stream(s):
                    if event is not None:
                        s.wait_event(event)
                    delta = torch.randn(257, generator=gen).pin_memory()
                    up = delta.to(f"ember:{d}", non_blocking=True)
                    k = rng.choice([0, 1, 2])
                    if k == 0:
                        x = x * 0.5 + up
                        expected = expected * 0.5 + delta
                    elif k == 1:
                        x = torch.where(up > 0, x - up, x.clamp(-2.0, 2.0))
                        expected = torch.where(
                            delta > 0, expected - delta, expected.clamp(-2.0, 2.0)
                        )
                    else:
                        x = (x + up).mul_(0.25)
                        expected = (expected + delta).mul_(0.25)
                    event = s.record_event()
            if not torch.equal(x.cpu(), expected):
                failures.append(f"thread {seed}: differs from CPU")
        except Exception as e:  # noqa: BLE001 -- reported below
            failures.append(f"thread {seed}: {e!r}")

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert failures == []
