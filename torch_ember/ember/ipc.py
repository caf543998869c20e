"""ember tensors across processes (``torch.multiprocessing``, ``mp.Queue``,
DataLoader workers), without a copy.

ember's allocator segments are memory files (``memfd_create``, mapped
``MAP_SHARED``). An ember tensor is sent as its segment file's descriptor
(passed like a CPU tensor under the file_descriptor strategy, by
``multiprocessing``'s fd passing, whatever ``get_sharing_strategy()`` says),
the place and size of its storage in that file, and its dtype, offset,
sizes and strides. The receiver maps that range of the file and wraps it as
an ember tensor on the same device index: both processes see the same bytes,
so a write on either side is seen by the other, as with CUDA IPC. The
received storage is owned by its mapping, not by the receiver's caching
allocator: it is not counted in the receiver's ``memory_stats`` (as CUDA does
not count memory opened from IPC handles); ``sharing_stats()`` counts it.

Lifetime (csrc/core/EmberIpc.h): the sender keeps each shared storage, so
its block is not reused, until the receiver's tensor is freed (a counter in
a small shared file, decremented by the receiver); the sender lets go of
released storages at its next share or at ``torch.ember.ipc_collect()``.
Each share is meant to be received once, as a queue item is. A share that
is never received, or a receiver that keeps its tensor, holds the sender's
block until the sender exits; a receiver keeps its mapping valid even after
the sender has exited.

Fallback by copy (counted in ``sharing_stats()["by_copy"]``): memory that
is not in a memory file (``memfd_create`` unavailable or out of descriptors,
segments inherited across ``fork()``, which are private in the child, or a
tensor that was itself received from another process). The sender copies it
to a CPU tensor, which torch's own reduction shares, and the receiver copies
it onto its ember device; the two sides do not share storage then.

Anything that cannot cross (a non-leaf tensor that requires grad, as for
CUDA) is never raised in the sender: there, ``multiprocessing.Queue`` pickles
in a feeder thread that only prints the error and drops the item, so the
receiver would wait forever (the DataLoader hang). The error travels instead
and is raised in the receiving process when it unpickles the item, i.e. in
the main process within the DataLoader's first batch; so is a failure to map
a share there.
"""

from __future__ import annotations

import os
import threading
from multiprocessing.reduction import DupFd, ForkingPickler

import torch
import torch.multiprocessing.reductions as _torch_reductions
from torch.nn.parameter import Parameter

from torch_ember import _C

_NON_LEAF = (
    "Cowardly refusing to serialize non-leaf tensor which requires_grad, since autograd "
    "does not support crossing process boundaries.  If you just want to transfer the data, "
    "call detach() on the tensor before serializing (e.g., putting it on the queue)."
)

_copies_lock = threading.Lock()
_copies = 0  # tensors this process sent by copy


class EmberSharingError(RuntimeError):
    """An ember tensor sent to another process could not be rebuilt there."""


def _raise_in_receiver(message: str):
    raise EmberSharingError(f"ember tensor sent from another process: {message}")


def _finish(tensor: torch.Tensor, requires_grad: bool, parameter: bool):
    if parameter:
        return Parameter(tensor, requires_grad=requires_grad)
    return tensor.requires_grad_(requires_grad)


def _rebuild_ember_tensor(cpu: torch.Tensor, index: int, requires_grad: bool, parameter: bool):
    return _finish(cpu.to(torch.device("ember", index)), requires_grad, parameter)


def _rebuild_shared_ember_tensor(
    share: tuple, view: tuple | None, requires_grad: bool, parameter: bool
):
    segment, segment_size, offset, nbytes, device, counter, counter_offset = share
    try:
        segment_fd = segment.detach()
        try:
            counter_fd = counter.detach()
            try:
                raw = _C._ipc_open(
                    segment_fd, segment_size, offset, nbytes, device, counter_fd, counter_offset
                )
            finally:
                os.close(counter_fd)
        finally:
            os.close(segment_fd)
    except Exception as error:
        raise EmberSharingError(
            f"ember tensor sent from another process: cannot map it here: "
            f"{type(error).__name__}: {error}"
        ) from error
    storage = raw.untyped_storage()
    if view is None:  # an UntypedStorage was sent
        return storage
    dtype, storage_offset, size, stride = view
    tensor = torch.empty((0,), dtype=dtype, device=raw.device)
    tensor.set_(storage, storage_offset, size, stride)
    return _finish(tensor, requires_grad, parameter)


def _count_copy() -> None:
    global _copies
    with _copies_lock:
        _copies += 1


def _share(tensor: torch.Tensor, view: tuple | None, requires_grad: bool, parameter: bool):
    """The zero-copy reduction, or None when the memory cannot be shared."""
    # The receiver reads the bytes as they are when it maps them: work
    # launched on the tensor's device must have written them by then (CUDA
    # asks the same of its users; ember simply waits).
    torch.ember.synchronize(tensor.device)
    shared = _C._ipc_share(tensor)
    if shared is None:
        return None
    segment_fd, segment_size, offset, nbytes, device, counter_fd, counter_offset = shared
    share = (
        DupFd(segment_fd),
        segment_size,
        offset,
        nbytes,
        device,
        DupFd(counter_fd),
        counter_offset,
    )
    return (_rebuild_shared_ember_tensor, (share, view, requires_grad, parameter))


def reduce_ember_tensor(tensor: torch.Tensor):
    """Pickle reduction of an ember tensor (see the module doc)."""
    try:
        if tensor.requires_grad and not tensor.is_leaf:
            raise RuntimeError(_NON_LEAF)
        parameter = isinstance(tensor, Parameter)
        view = (tensor.dtype, tensor.storage_offset(), tuple(tensor.size()), tuple(tensor.stride()))
        reduced = _share(tensor, view, tensor.requires_grad, parameter)
        if reduced is not None:
            return reduced
        if tensor.untyped_storage().nbytes() > 0:
            _count_copy()
        cpu = tensor.detach().to("cpu")
        return (
            _rebuild_ember_tensor,
            (cpu, tensor.device.index or 0, tensor.requires_grad, parameter),
        )
    except Exception as error:  # noqa: BLE001 - raised where it can be seen: the receiver
        return (_raise_in_receiver, (f"{type(error).__name__}: {error}",))


def _reduce_tensor(tensor: torch.Tensor):
    if tensor.device.type == "ember":
        return reduce_ember_tensor(tensor)
    return _torch_reductions.reduce_tensor(tensor)


def _rebuild_storage_by_copy(cpu: torch.Tensor, index: int):
    return cpu.to(torch.device("ember", index)).untyped_storage()


def _reduce_storage(storage):
    if storage.device.type == "ember":
        as_tensor = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
        try:
            reduced = _share(as_tensor, None, False, False)
            if reduced is not None:
                return reduced
            if storage.nbytes() > 0:
                _count_copy()
            return (_rebuild_storage_by_copy, (as_tensor.to("cpu"), storage.device.index or 0))
        except Exception as error:  # noqa: BLE001 - raised in the receiver, as for tensors
            return (_raise_in_receiver, (f"{type(error).__name__}: {error}",))
    return _torch_reductions.reduce_storage(storage)


def ipc_collect() -> int:
    """Lets go of the storages this process shared that every receiver has
    released (torch.cuda.ipc_collect); returns how many are still held."""
    return _C._ipc_collect()


def sharing_stats() -> dict[str, int]:
    """Counters of this process's ember IPC.

    Sender side: ``zero_copy`` (tensors and storages shared without a copy),
    ``held`` (shared storages kept until their receivers release them),
    ``by_copy`` (sent by copy: memory without a memory file, see the module
    doc). Receiver side: ``mappings_open`` / ``mapped_bytes`` (received
    storages alive, not counted in memory_stats), ``mappings_opened``."""
    raw = _C._ipc_stats()
    return {
        "zero_copy": raw["shares_sent"],
        "held": raw["shares_held"],
        "by_copy": _copies,
        "mappings_open": raw["mappings_open"],
        "mapped_bytes": raw["mapped_bytes"],
        "mappings_opened": raw["mappings_opened"],
    }


def register() -> None:
    """Installs the reductions (after torch's own, which it wraps)."""
    for cls in (*torch._tensor_classes, torch.Tensor, Parameter):
        ForkingPickler.register(cls, _reduce_tensor)
    ForkingPickler.register(torch.UntypedStorage, _reduce_storage)
