"""ember's ``DeviceInterface``: what Dynamo and Inductor ask of a device at compile time.

Dynamo looks a device type up with ``get_interface_for_device`` to guard on
the current device, to wrap ``torch.ember.*`` calls and streams/events in a
graph, and Inductor asks it for device properties, synchronisation and the
"raw stream" a kernel is launched on. Everything delegates to ``torch.ember``
(the device module); ember kernels run on the host, so the raw stream is 0
and no Triton is involved.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._dynamo.device_interface import DeviceInterface, register_interface_for_device

from torch_ember.ember._utils import _device_index

_worker_properties: list[Any] = []
_worker_current: list[int] = []


class EmberInterface(DeviceInterface):
    device = torch.ember.device  # type: ignore[assignment]
    Event = torch.ember.Event  # type: ignore[assignment]
    Stream = torch.ember.Stream  # type: ignore[assignment]

    class Worker:
        """Properties for compile workers (subprocesses); ember needs no driver
        there, but the answers are cached like CUDA's so a worker never asks."""

        @staticmethod
        def set_device(device: int) -> None:
            _worker_current[:] = [device]

        @staticmethod
        def current_device() -> int:
            return _worker_current[0] if _worker_current else torch.ember.current_device()

        @staticmethod
        def get_device_properties(device: torch.types.Device = None) -> Any:
            if not _worker_properties:
                _worker_properties.extend(
                    torch.ember.get_device_properties(i) for i in range(torch.ember.device_count())
                )
            index = (
                EmberInterface.Worker.current_device()
                if device is None
                else _device_index(device, optional=True)
            )
            return _worker_properties[index]

    current_device = staticmethod(torch.ember.current_device)
    set_device = staticmethod(torch.ember.set_device)
    device_count = staticmethod(torch.ember.device_count)
    stream = staticmethod(torch.ember.stream)  # type: ignore[assignment]
    current_stream = staticmethod(torch.ember.current_stream)
    set_stream = staticmethod(torch.ember.set_stream)  # type: ignore[assignment]
    synchronize = staticmethod(torch.ember.synchronize)
    get_device_properties = staticmethod(torch.ember.get_device_properties)  # type: ignore[assignment]
    memory_allocated = staticmethod(torch.ember.memory_allocated)
    is_available = staticmethod(torch.ember.is_available)

    @staticmethod
    def exchange_device(device: int) -> int:
        previous = torch.ember.current_device()
        if device >= 0 and device != previous:
            torch.ember.set_device(device)
        return previous

    maybe_exchange_device = exchange_device

    @staticmethod
    def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
        torch.ember.set_stream(
            torch.ember.Stream(
                stream_id=stream_id, device_index=device_index, device_type=device_type
            )
        )

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        return 0  # kernels run on the calling host thread

    @staticmethod
    def get_compute_capability(device: torch.types.Device = None) -> str:
        """The ISA Inductor's C++ kernels are vectorised for (e.g. "avx512")."""
        return torch.ember.get_device_properties(device).isa

    @staticmethod
    def is_bf16_supported(including_emulation: bool = False) -> bool:
        return torch.ember.is_bf16_supported(including_emulation)

    @staticmethod
    def is_triton_capable(device: torch.types.Device = None) -> bool:
        return False

    @staticmethod
    def raise_if_triton_unavailable(device: torch.types.Device = None) -> None:
        raise RuntimeError("ember compiles to C++/OpenMP kernels, not Triton")


def register_device_interface() -> None:
    register_interface_for_device("ember", EmberInterface)
    for index in range(torch.ember.device_count()):
        register_interface_for_device(f"ember:{index}", EmberInterface)
    from torch_ember.compile.dynamo_builtins import install

    install()
