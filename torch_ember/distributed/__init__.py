"""The ``"ember"`` c10d backend: torch.distributed collectives on ember tensors,
run by gloo's transport on the tensors' own bytes.

ember memory is host memory, so every ember tensor has a zero-copy CPU alias
(``torch_ember._C.cpu_alias``: a CPU tensor over the same bytes that keeps
the ember storage alive). The backend hands gloo those aliases: gloo reads
and writes ember memory in place, with no staging copy and no transport of
ember's own. Registered at import of torch_ember::

    torch.distributed.init_process_group("cpu:gloo,ember:ember", ...)
    # or init_process_group("ember"): the backend serves CPU tensors too

Covered: allreduce (+ coalesced), broadcast, reduce, allgather (+ base,
coalesced), gather, scatter, reduce_scatter (+ base), alltoall (+ base),
send/recv (+ any source), barrier, monitored_barrier: what DDP and FSDP use.
A collective hands gloo the tensor's bytes through ``_C.cpu_alias``, which
first waits for the work queued on ember (asynchronous execution), so the
bytes it reads are final when it is issued.
"""

import atexit
import gc
import time
import weakref
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future

from torch_ember import _C

BACKEND_NAME = "ember"


# Aliases handed to gloo, weakly: one is alive while a gloo Work (or a gloo
# worker thread finishing one) still holds it. A worker that drops the last
# reference to a Work releases Python tensors, which takes the GIL; if that
# happens after the interpreter began finalising, the process aborts
# ("terminate called without an active exception"). Shutdown and exit wait
# briefly for the workers to let go.
_handed_to_gloo: list[weakref.ref] = []
_prune_at = 256
_RELEASE_WAIT_S = 0.2


def _held_by_gloo() -> int:
    """How many aliases gloo still holds (and forgets the released ones)."""
    _handed_to_gloo[:] = [ref for ref in _handed_to_gloo if ref() is not None]
    return len(_handed_to_gloo)


def _alias(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU tensor over the bytes of ``tensor`` (ember), or ``tensor`` itself."""
    if tensor.device.type == "ember":
        global _prune_at
        alias = _C.cpu_alias(tensor)
        if len(_handed_to_gloo) >= _prune_at:
            _prune_at = 2 * _held_by_gloo() + 256
        _handed_to_gloo.append(weakref.ref(alias))
        return alias
    return tensor


def _wait_for_gloo_release(timeout_s: float = _RELEASE_WAIT_S) -> None:
    """Sleeps (GIL released) until gloo holds none of ember's aliases, at most
    ``timeout_s``: a user may keep a Work, and with it its aliases, to the end."""
    deadline = time.monotonic() + timeout_s
    while _held_by_gloo() and time.monotonic() < deadline:
        time.sleep(0.001)


@atexit.register
def _release_at_exit() -> None:
    if _held_by_gloo():
        gc.collect()  # Works in reference cycles: released here, with the GIL
        _wait_for_gloo_release()


def _aliases(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [_alias(t) for t in tensors]


def _nested(lists: list[list[torch.Tensor]]) -> list[list[torch.Tensor]]:
    return [_aliases(inner) for inner in lists]


class _Work(dist.Work):
    """gloo's work on the aliases (one or several, for coalesced calls); its
    future yields the caller's ember tensors (DDP's reducer reads the result
    from there)."""

    def __init__(self, inner: "dist.Work | list[dist.Work]", result: Any):
        super().__init__()
        self._works = inner if isinstance(inner, list) else [inner]
        self._result = result
        self._future: Future | None = None

    def wait(self, timeout: timedelta | None = None) -> bool:
        for work in self._works:
            if timeout is None:
                work.wait()
            else:
                work.wait(timeout)
        return True

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self._works)

    def is_success(self) -> bool:
        return all(work.is_success() for work in self._works)

    def exception(self):
        for work in self._works:
            if work.exception() is not None:
                return work.exception()
        return None

    def source_rank(self) -> int:
        return self._works[0].source_rank()

    def result(self):
        return self._result

    def get_future(self) -> Future:
        if self._future is None:
            future: Future = Future()
            result = self._result

            def done(inner: Future) -> None:
                try:
                    inner.value()
                    future.set_result(result)
                except Exception as error:  # noqa: BLE001 (handed to the future)
                    future.set_exception(error)

            futures = [work.get_future() for work in self._works]
            combined = futures[0] if len(futures) == 1 else torch.futures.collect_all(futures)
            combined.add_done_callback(done)
            self._future = future
        return self._future


class ProcessGroupEmber(dist.ProcessGroup):
    """c10d backend for ember tensors over a gloo process group."""

    def __init__(
        self,
        store: dist.Store,
        rank: int,
        size: int,
        timeout: timedelta,
        group_name: str | None = None,
    ):
        super().__init__(rank, size)
        self._gloo = dist.ProcessGroupGloo(dist.PrefixStore("ember/", store), rank, size, timeout)
        # A group's name lives on its C++ backends (DeviceMesh, FSDP and the
        # functional collectives look groups up by name): gloo is this
        # group's backend for CPU tensors.
        self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, self._gloo)
        if group_name:
            self._set_group_name(group_name)

    def getBackendName(self) -> str:
        return BACKEND_NAME

    # destroy_process_group(): gloo's workers let go of ember's aliases
    # before it returns (see _handed_to_gloo).
    def shutdown(self) -> None:
        self._gloo.shutdown()
        _wait_for_gloo_release()

    def abort(self) -> None:
        self._gloo.abort()

    def _get_backend_name(self) -> str:
        return BACKEND_NAME

    @property
    def name(self) -> str:  # type: ignore[override]
        return BACKEND_NAME

    def _wrap(self, work: dist.Work, result: Any) -> _Work:
        return _Work(work, result)

    # -- collectives DDP and FSDP use -------------------------------------
    def allreduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceOptions()
        return self._wrap(self._gloo.allreduce(_aliases(tensors), opts), tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        return self._wrap(self._gloo.allreduce_coalesced(_aliases(tensors), opts), tensors)

    def broadcast(self, tensors, opts=None):
        opts = opts if opts is not None else dist.BroadcastOptions()
        return self._wrap(self._gloo.broadcast(_aliases(tensors), opts), tensors)

    def reduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.ReduceOptions()
        return self._wrap(self._gloo.reduce(_aliases(tensors), opts), tensors)

    def allgather(self, output_lists, input_tensors, opts=None):
        opts = opts if opts is not None else dist.AllgatherOptions()
        work = self._gloo.allgather(_nested(output_lists), _aliases(input_tensors), opts)
        return self._wrap(work, output_lists)

    def _allgather_base(self, output, input, opts=None):
        opts = opts if opts is not None else dist.AllgatherOptions()
        return self._wrap(self._gloo._allgather_base(_alias(output), _alias(input), opts), [output])

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        # gloo has no coalesced form: one collective per pair, issued in order.
        opts = opts if opts is not None else dist.AllgatherOptions()
        works = [
            self._gloo._allgather_base(_alias(out), _alias(inp), opts)
            for out, inp in zip(outputs, inputs, strict=True)
        ]
        return self._wrap(works, outputs)

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        opts = opts if opts is not None else dist.AllgatherOptions()
        work = self._gloo.allgather_coalesced(_nested(output_lists), _aliases(input_tensors), opts)
        return self._wrap(work, output_lists)

    def gather(self, output_lists, input_tensors, opts=None):
        opts = opts if opts is not None else dist.GatherOptions()
        work = self._gloo.gather(_nested(output_lists), _aliases(input_tensors), opts)
        return self._wrap(work, output_lists)

    def scatter(self, output_tensors, input_lists, opts=None):
        opts = opts if opts is not None else dist.ScatterOptions()
        work = self._gloo.scatter(_aliases(output_tensors), _nested(input_lists), opts)
        return self._wrap(work, output_tensors)

    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        work = self._gloo.reduce_scatter(_aliases(output_tensors), _nested(input_lists), opts)
        return self._wrap(work, output_tensors)

    def _reduce_scatter_base(self, output, input, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        work = self._gloo._reduce_scatter_base(_alias(output), _alias(input), opts)
        return self._wrap(work, [output])

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        works = [
            self._gloo._reduce_scatter_base(_alias(out), _alias(inp), opts)
            for out, inp in zip(outputs, inputs, strict=True)
        ]
        return self._wrap(works, outputs)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        opts = opts if opts is not None else dist.AllToAllOptions()
        work = self._gloo.alltoall_base(
            _alias(output), _alias(input), output_split_sizes, input_split_sizes, opts
        )
        return self._wrap(work, [output])

    def alltoall(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.AllToAllOptions()
        work = self._gloo.alltoall(_aliases(output_tensors), _aliases(input_tensors), opts)
        return self._wrap(work, output_tensors)

    # The names torch.distributed's Python functions call on a group.
    def all_gather_single(self, output, input, opts=None):
        return self._allgather_base(output, input, opts)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        return self.allgather_into_tensor_coalesced(outputs, inputs, opts)

    def reduce_scatter_single(self, output, input, opts=None):
        return self._reduce_scatter_base(output, input, opts)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        return self.reduce_scatter_tensor_coalesced(outputs, inputs, opts)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

    # -- point to point ---------------------------------------------------
    def send(self, tensors, dst_rank, tag=0):
        return self._wrap(self._gloo.send(_aliases(tensors), dst_rank, tag), tensors)

    def recv(self, tensors, src_rank, tag=0):
        return self._wrap(self._gloo.recv(_aliases(tensors), src_rank, tag), tensors)

    def recv_anysource(self, tensors, tag=0):
        return self._wrap(self._gloo.recv_anysource(_aliases(tensors), tag), tensors)

    # -- synchronisation --------------------------------------------------
    def barrier(self, opts=None):
        opts = opts if opts is not None else dist.BarrierOptions()
        return self._wrap(self._gloo.barrier(opts), [])

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        return self._gloo.monitored_barrier(timeout, wait_all_ranks)


def _create(options, backend_options=None):
    return ProcessGroupEmber(
        options.store, options.group_rank, options.group_size, options.timeout, options.group_id
    )


def register() -> None:
    """Registers the backend as "ember" for ember devices (idempotent)."""
    if not dist.is_available():
        return
    if BACKEND_NAME in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=[BACKEND_NAME])


__all__ = ["BACKEND_NAME", "ProcessGroupEmber", "register"]
