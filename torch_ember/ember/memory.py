"""Memory of ember devices, with torch.cuda's function names and stat keys."""

import contextlib
import pickle
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch

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


def get_per_process_memory_fraction(device: Any = None) -> float:
    """The device's memory limit as a fraction of its capacity (1.0 by default)."""
    index = _device_index(device, optional=True)
    capacity = _C.device_properties(index)["total_memory"]
    return _C.memory_limit(index) / capacity


def caching_allocator_alloc(size: int, device: Any = None, stream: Any = None) -> int:
    """Allocates ``size`` bytes from the device's caching allocator for
    interoperability; returns the address. Free it with caching_allocator_delete."""
    if stream is not None and not isinstance(stream, torch.Stream | int):
        raise TypeError("Invalid type for stream argument, must be `torch.ember.Stream` or `int`")
    return _C.raw_alloc(int(size), _device_index(device, optional=True))


def caching_allocator_delete(mem_ptr: int) -> None:
    """Frees memory from caching_allocator_alloc."""
    _C.raw_delete(int(mem_ptr))


def _stats_with_pools(device: Any) -> dict[str, Any]:
    """memory_stats plus the per-pool keys memory_summary's table reads.

    ember's allocator keeps its counters per device, not per pool: the pool
    rows carry the current values computed from the snapshot (segments and
    blocks by pool) and 0 where no per-pool counter exists (peak, tot alloc,
    tot freed)."""
    index = _device_index(device, optional=True)
    stats = memory_stats(index)
    pools = {"large_pool": {}, "small_pool": {}}
    for segment in _C.memory_snapshot(False)["segments"]:
        if segment["device"] != index:
            continue
        pool = pools["small_pool" if segment["segment_type"] == "small" else "large_pool"]
        active = [b for b in segment["blocks"] if b["state"] == "active_allocated"]
        split = len(segment["blocks"]) > 1
        inactive = [b for b in segment["blocks"] if b["state"] != "active_allocated" and split]
        for key, value in (
            ("allocated_bytes", sum(b["size"] for b in active)),
            ("active_bytes", sum(b["size"] for b in active)),
            ("requested_bytes", sum(b["requested_size"] for b in active)),
            ("reserved_bytes", segment["total_size"]),
            ("inactive_split_bytes", sum(b["size"] for b in inactive)),
            ("allocation", len(active)),
            ("active", len(active)),
            ("segment", 1),
            ("inactive_split", len(inactive)),
        ):
            pool[key] = pool.get(key, 0) + value
    for name in (
        "allocated_bytes",
        "active_bytes",
        "requested_bytes",
        "reserved_bytes",
        "inactive_split_bytes",
        "allocation",
        "active",
        "segment",
        "inactive_split",
    ):
        for pool_name, pool in pools.items():
            stats[f"{name}.{pool_name}.current"] = pool.get(name, 0)
            for counter in ("peak", "allocated", "freed"):
                stats[f"{name}.{pool_name}.{counter}"] = 0
    for name in ("oversize_allocations", "oversize_segments"):  # no such limit on ember
        for counter in ("current", "peak", "allocated", "freed"):
            stats[f"{name}.{counter}"] = 0
    return stats


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """torch.cuda.memory_summary's table for an ember device.

    The table is torch.cuda's own formatter run on ember's statistics (its
    function, with ember's stats and device index, not a copy); the titles say
    ember. See _stats_with_pools for what the per-pool rows hold."""
    index = _device_index(device, optional=True)
    cuda_summary = torch.cuda.memory.memory_summary
    scope = dict(cuda_summary.__globals__)
    scope["memory_stats"] = lambda device=None: _stats_with_pools(device)
    scope["_get_device_index"] = lambda device, optional=False: index
    summary = types.FunctionType(cuda_summary.__code__, scope, "memory_summary")
    text = summary(index, abbreviated)
    return (
        text.replace(" PyTorch CUDA memory summary", "PyTorch ember memory summary")
        .replace("  CUDA OOMs:", " ember OOMs:")
        .replace("cudaMalloc retries:", "segment retries:   ")
        .replace("GPU reserved memory", "Reserved memory    ")
        .replace("GPU reserved segments", "Reserved segments    ")
        .replace("Oversize GPU segments", "Oversize segments    ")
    )


def memory_snapshot(mempool_id: Any = None, include_traces: bool = True) -> list[dict]:
    """The allocator's segments, each with its blocks (torch.cuda.memory_snapshot).

    ``mempool_id``: only the segments of that pool (a MemPool's ``id``; (0, 0)
    is every device's default pool); None: every segment."""
    segments = _C.memory_snapshot(include_traces)["segments"]
    if mempool_id is None:
        return segments
    wanted = tuple(int(part) for part in mempool_id)
    return [s for s in segments if tuple(s["segment_pool_id"]) == wanted]


class MemPool:
    """A private pool of ember memory (torch.cuda.MemPool).

    Allocations made on the current thread inside ``use_mem_pool(pool)`` come
    from the pool's own segments; blocks freed go back to the pool, whichever
    thread frees them. ``empty_cache()`` leaves a live pool's cache alone;
    once the pool object is gone (its use count 0), its free segments are
    returned at once and the rest as soon as their blocks are free and
    ``empty_cache()`` runs. Statistics (memory_stats, memory_allocated, ...)
    stay per device and include pool memory, as CUDA's aggregate counters do.

    The pool is created on the current device; ``use_mem_pool(pool, device)``
    on another device makes a pool with the same id there, as CUDA does.

    Only CUDA's defaults are supported: ``allocator`` (a custom allocator),
    ``use_on_oom`` and ``no_split`` raise NotImplementedError."""

    def __init__(self, allocator: Any = None, use_on_oom: bool = False, no_split: bool = False):
        if allocator is not None:
            raise NotImplementedError(
                "torch.ember.MemPool(allocator=...): ember pools are served by ember's caching "
                "allocator only; custom allocators are not supported (pass allocator=None)"
            )
        if use_on_oom:
            raise NotImplementedError("torch.ember.MemPool(use_on_oom=True) is not supported")
        if no_split:
            raise NotImplementedError("torch.ember.MemPool(no_split=True) is not supported")
        self._device = _device_index(None, optional=True)
        self._id = tuple(_C._mempool_create(self._device))

    @property
    def id(self) -> tuple[int, int]:
        """The pool's id, ``(0, n)`` as for CUDA's user-created pools."""
        return self._id

    @property
    def allocator(self) -> None:
        """Always None: ember's caching allocator serves every pool."""
        return None

    def use_count(self) -> int:
        """Holders of the pool: this object and each active use_mem_pool context."""
        return _C._mempool_use_count(self._device, self._id)

    def snapshot(self, include_traces: bool = True) -> list[dict]:
        """This pool's segments, in memory_snapshot's format."""
        return memory_snapshot(self._id, include_traces=include_traces)

    def __del__(self) -> None:
        pool = getattr(self, "_id", None)
        if pool is None:
            return
        with contextlib.suppress(Exception):  # also at interpreter exit
            _C._mempool_release(self._device, pool)
            _C._mempool_empty_cache(pool)


@contextlib.contextmanager
def use_mem_pool(pool: MemPool, device: Any = None) -> Iterator[None]:
    """Routes the current thread's allocations on ``device`` (default: the
    current device) to ``pool`` (torch.cuda.use_mem_pool). Other threads,
    including ones started inside the context (e.g. by backward), allocate as
    before. Nested contexts on one device: the outer (first entered) pool
    serves, as in CUDA's caching allocator, whose first matching route
    wins."""
    if not isinstance(pool, MemPool):
        raise TypeError(f"use_mem_pool expects a torch.ember.MemPool, got {type(pool).__name__}")
    index = _device_index(device, optional=True)
    _C._mempool_begin_allocate(index, pool.id)
    try:
        yield
    finally:
        _C._mempool_end_allocate(index, pool.id)


def _snapshot(device: Any = None) -> dict[str, Any]:
    """torch.cuda.memory._snapshot for ember: ``{"segments", "device_traces"}``,
    the dict torch.cuda._memory_viz renders (trace_plot, segment_plot)."""
    return _C.memory_snapshot(True)


def _dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    """Pickles _snapshot() to ``filename`` (open it in pytorch.org/memory_viz)."""
    with open(filename, "wb") as f:
        pickle.dump(_snapshot(), f)


def _record_memory_history(
    enabled: str | None = "all",
    context: str | None = "all",
    stacks: str = "all",
    max_entries: int = sys.maxsize,
    device: Any = None,
    clear_history: bool = False,
) -> None:
    """torch.cuda.memory._record_memory_history for ember.

    ``enabled``: None (off), "state" (stacks of live allocations), "all" (also
    the alloc/free history, kept to ``max_entries`` per device); ``context``:
    None, "state", "alloc" or "all" (which events keep a stack); ``stacks``:
    "python" or "all" (C++ frames too)."""
    if enabled not in (None, "state", "all"):
        raise ValueError(f"enabled must be None, 'state' or 'all'; got {enabled!r}")
    if context not in (None, "state", "alloc", "all"):
        raise ValueError(f"context must be None, 'state', 'alloc' or 'all'; got {context!r}")
    if stacks not in ("python", "all"):
        raise ValueError(f"stacks must be 'python' or 'all'; got {stacks!r}")
    _C.record_memory_history(
        enabled is not None,
        enabled == "all",
        context in ("alloc", "all"),
        context == "all",
        stacks == "all",
        min(int(max_entries), sys.maxsize),
        clear_history,
    )
