"""Memory of ember devices, with torch.cuda's function names and stat keys."""

from typing import Any

from torch_ember import _C
from torch_ember.ember._utils import _device_index


def memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
    return _C.memory_stats(_device_index(device, optional=True))


def memory_stats(device: Any = None) -> dict[str, Any]:
    """Flat dict with torch.cuda.memory_stats keys, e.g. ``allocated_bytes.all.current``."""
    flat: dict[str, Any] = {}

    def visit(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                visit(f"{prefix}.{key}" if prefix else key, inner)
        else:
            flat[prefix] = value

    visit("", memory_stats_as_nested_dict(device))
    return dict(sorted(flat.items()))


def memory_allocated(device: Any = None) -> int:
    return memory_stats_as_nested_dict(device)["allocated_bytes"]["all"]["current"]


def max_memory_allocated(device: Any = None) -> int:
    return memory_stats_as_nested_dict(device)["allocated_bytes"]["all"]["peak"]


def memory_reserved(device: Any = None) -> int:
    return memory_stats_as_nested_dict(device)["reserved_bytes"]["all"]["current"]


def max_memory_reserved(device: Any = None) -> int:
    return memory_stats_as_nested_dict(device)["reserved_bytes"]["all"]["peak"]


def reset_peak_memory_stats(device: Any = None) -> None:
    _C.reset_peak_memory_stats(_device_index(device, optional=True))


def reset_accumulated_memory_stats(device: Any = None) -> None:
    _C.reset_accumulated_memory_stats(_device_index(device, optional=True))


def empty_cache() -> None:
    """Returns every cached, unused block of every ember device to the OS."""
    _C.empty_cache()


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total) bytes: total is the device's memory limit."""
    return tuple(_C.mem_get_info(_device_index(device, optional=True)))


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    """Limits the device to ``fraction`` of its capacity; beyond it, OutOfMemoryError."""
    if not isinstance(fraction, float | int):
        raise TypeError("Invalid type for fraction argument, must be `float`")
    _C.set_per_process_memory_fraction(float(fraction), _device_index(device, optional=True))
