"""Streams and events of ember devices, on PyTorch's generic torch.Stream/Event.

Each stream has a queue run by a worker thread pinned to its device's cores
(see docs/engine.md). Ops run synchronously on the calling thread, after
the work queued on their stream; ``non_blocking`` uploads from pinned memory
are queued. ``query()`` is False while queued work is pending, events complete
when the work before them does, ``wait_event``/``wait_stream`` order streams,
and an error in queued work is raised at the next synchronisation point.
"""

from typing import Any

import torch

from torch_ember import _C
from torch_ember.ember._utils import _device_index


class Stream(torch.Stream):
    """An ember stream. ``Stream()`` creates a new stream on the current device."""

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs):
        if "stream_id" in kwargs:  # rebuilding an existing stream
            return super().__new__(cls, **kwargs)
        index = _device_index(device, optional=True)
        return super().__new__(cls, device=torch.device("ember", index), priority=priority)

    @property
    def priority(self) -> int:
        """The priority the stream was created with (lower is higher, as CUDA's)."""
        return _C.stream_priority(self.device_index, self.stream_id)

    def wait_event(self, event: "Event") -> None:
        event.wait(self)

    def wait_stream(self, stream: torch.Stream) -> None:
        self.wait_event(stream.record_event())

    def record_event(self, event: "Event | None" = None) -> "Event":
        event = event if event is not None else Event()
        event.record(self)
        return event


def _as_ember_stream(stream: torch.Stream) -> Stream:
    return Stream(
        stream_id=stream.stream_id,
        device_index=stream.device_index,
        device_type=stream.device_type,
    )


class Event(torch.Event):
    """An ember event; ``enable_timing=True`` allows ``elapsed_time``."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess=False):
        return super().__new__(
            cls,
            device=torch.device("ember", _device_index(None, optional=True)),
            enable_timing=enable_timing,
            blocking=blocking,
            interprocess=interprocess,
        )

    def record(self, stream: torch.Stream | None = None) -> None:
        super().record(stream if stream is not None else current_stream())

    def wait(self, stream: torch.Stream | None = None) -> None:
        super().wait(stream if stream is not None else current_stream())

    def elapsed_time(self, end_event: torch.Event) -> float:
        """Milliseconds between this event and ``end_event`` (both timed, recorded)."""
        return _C.event_elapsed_time(self, end_event)


def current_stream(device: Any = None) -> Stream:
    return _as_ember_stream(torch.accelerator.current_stream(_device_index(device, optional=True)))


def default_stream(device: Any = None) -> Stream:
    current = torch.accelerator.current_stream(_device_index(device, optional=True))
    return Stream(stream_id=0, device_index=current.device_index, device_type=current.device_type)


def set_stream(stream: torch.Stream) -> None:
    if stream is not None:
        torch.accelerator.set_stream(stream)


class StreamContext:
    """Makes ``stream`` current; restores the previous streams and device on exit.

    As with ``torch.cuda.StreamContext``, the previous current stream is
    remembered on both the current device and the stream's device, so a stream
    of another device leaves the current device unchanged afterwards.
    """

    def __init__(self, stream: torch.Stream | None):
        self.stream = stream
        self.source_previous: torch.Stream | None = None
        self.target_previous: torch.Stream | None = None

    def __enter__(self):
        if self.stream is None:
            return self
        current = _device_index(None, optional=True)
        self.source_previous = torch.accelerator.current_stream(current)
        if self.stream.device_index != current:
            self.target_previous = torch.accelerator.current_stream(self.stream.device_index)
        torch.accelerator.set_stream(self.stream)
        return self

    def __exit__(self, *exc) -> bool:
        if self.stream is None:
            return False
        if self.target_previous is not None:
            torch.accelerator.set_stream(self.target_previous)
        # Restoring the source device's stream also makes that device current.
        torch.accelerator.set_stream(self.source_previous)
        return False


def stream(stream: torch.Stream | None) -> StreamContext:
    return StreamContext(stream)


def use_device_cores(device: Any = None) -> list[int]:
    """Binds the calling thread to ``device``'s cores (``EMBER_DEVICES`` /
    ``EMBER_DEVICE_CORES`` split the process's cores between devices): the
    thread's affinity becomes those cores and its intra-op thread count their
    number, so the ops it runs use exactly the device's cores. For serving one
    model replica per device from one thread per device. Returns the cores.

    Explicit by design: without it a thread's ops follow its own
    ``torch.set_num_threads``, as on CPU."""
    index = _device_index(device, optional=True)
    cores, _ = _C._engine_bind_thread(index)
    core_ids = list(_C.device_properties(index)["core_ids"])
    assert cores == len(core_ids)
    return core_ids
