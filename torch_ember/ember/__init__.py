"""``torch.ember``: the device module, in the shape of ``torch.cuda``."""

import warnings
from typing import Any

import torch

from torch_ember import _C
from torch_ember.ember import ipc as _ipc
from torch_ember.ember._utils import _device_index
from torch_ember.ember.graphs import (
    EmberGraph,
    graph,
    graph_pool_handle,
    is_current_stream_capturing,
    make_graphed_callables,
)
from torch_ember.ember.memory import (
    MemPool,
    caching_allocator_alloc,
    caching_allocator_delete,
    empty_cache,
    get_per_process_memory_fraction,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_snapshot,
    memory_stats,
    memory_stats_as_nested_dict,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_peak_memory_stats,
    set_per_process_memory_fraction,
    use_mem_pool,
)
from torch_ember.ember.random import (
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from torch_ember.ember.streams import (
    Event,
    Stream,
    StreamContext,
    current_stream,
    default_stream,
    set_stream,
    stream,
    use_device_cores,
)

OutOfMemoryError = torch.OutOfMemoryError  # as torch.cuda.OutOfMemoryError

_ipc.register()  # ember tensors through torch.multiprocessing (zero-copy)
ipc_collect = _ipc.ipc_collect


def __getattr__(name: str) -> Any:
    if name == "default_generators":  # made at first use (ember.random)
        from torch_ember.ember import random

        return random.default_generators
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_available() -> bool:
    """False, with a warning naming the setting, when an EMBER_* variable is
    invalid (as torch.cuda.is_available when CUDA cannot initialize); using
    ember then raises that error."""
    error = _C._configuration_error()
    if error is not None:
        warnings.warn(f"ember is not available: {error}", stacklevel=2)
        return False
    return _C.device_count() > 0


def is_initialized() -> bool:
    return True  # the runtime initialises at import


def _is_in_bad_fork() -> bool:
    """ember keeps no state that a fork breaks (no driver context)."""
    return False


def _lazy_init() -> None:
    """Present for PyTorch code that calls it on device modules."""


def device_count() -> int:
    return _C.device_count()


def current_device() -> int:
    return _C.current_device()


def set_device(device) -> None:
    index = _device_index(device, optional=True)
    if index >= 0:
        _C.set_device(index)


class device:
    """Context manager that makes ``device`` current and restores the previous one."""

    def __init__(self, device: Any):
        self.idx = _device_index(device, optional=True)
        self.prev_idx = -1

    def __enter__(self):
        self.prev_idx = _C.current_device()
        if self.idx >= 0 and self.idx != self.prev_idx:
            _C.set_device(self.idx)

    def __exit__(self, *exc) -> bool:
        if self.idx >= 0 and self.idx != self.prev_idx:
            _C.set_device(self.prev_idx)
        return False


class device_of(device):
    """Makes the device of tensor ``obj`` current (no-op for CPU tensors)."""

    def __init__(self, obj: torch.Tensor):
        super().__init__(obj.get_device() if obj.device.type == "ember" else -1)


def synchronize(device: Any = None) -> None:
    """Waits for all work queued on every stream of ``device``."""
    _C.synchronize(_device_index(device, optional=True))


class EmberDeviceProperties:
    """What ``get_device_properties`` reports: cores, NUMA node, memory, ISA."""

    def __init__(self, raw: dict):
        self.name: str = raw["name"]
        self.index: int = raw["index"]
        self.cores: int = raw["cores"]
        # The CPU ids this device's workers run on (EMBER_DEVICES /
        # EMBER_DEVICE_CORES partition the process's cores).
        self.core_ids: list[int] = list(raw["core_ids"])
        self.multi_processor_count: int = raw["cores"]  # CUDA's name for it
        self.numa_node: int = raw["numa_node"]
        self.total_memory: int = raw["total_memory"]
        self.isa: str = raw["isa"]

    def __repr__(self) -> str:
        return (
            f"EmberDeviceProperties(name='{self.name}', cores={self.cores}, "
            f"numa_node={self.numa_node}, total_memory={self.total_memory >> 20}MB, "
            f"isa='{self.isa}')"
        )


def get_device_properties(device: Any = None) -> EmberDeviceProperties:
    return EmberDeviceProperties(_C.device_properties(_device_index(device, optional=True)))


def get_device_name(device: Any = None) -> str:
    return get_device_properties(device).name


def get_device_capability(device: Any = None) -> dict[str, Any]:
    """torch.accelerator's form, ``{"supported_dtypes": {...}}`` (every dtype
    but the quantized ones), plus ``"cpu_features"``: the host CPU's ISA
    features, the closest thing to a compute capability."""
    index = _device_index(device, optional=True)
    capability = dict(torch._C._accelerator_getDeviceCapability(index))
    capability["cpu_features"] = _C.cpu_features()
    return capability


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


__all__ = [
    "EmberGraph",
    "Event",
    "MemPool",
    "OutOfMemoryError",
    "Stream",
    "StreamContext",
    "caching_allocator_alloc",
    "caching_allocator_delete",
    "current_device",
    "current_stream",
    "default_generators",
    "default_stream",
    "device",
    "device_count",
    "device_of",
    "empty_cache",
    "get_amp_supported_dtype",
    "get_device_capability",
    "get_device_name",
    "get_device_properties",
    "get_per_process_memory_fraction",
    "get_rng_state",
    "get_rng_state_all",
    "graph",
    "graph_pool_handle",
    "initial_seed",
    "ipc_collect",
    "is_available",
    "is_bf16_supported",
    "is_current_stream_capturing",
    "make_graphed_callables",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "memory_snapshot",
    "memory_stats",
    "memory_stats_as_nested_dict",
    "memory_summary",
    "reset_accumulated_memory_stats",
    "reset_peak_memory_stats",
    "seed",
    "seed_all",
    "set_device",
    "set_per_process_memory_fraction",
    "set_rng_state",
    "set_rng_state_all",
    "set_stream",
    "stream",
    "synchronize",
    "use_device_cores",
    "use_mem_pool",
]
