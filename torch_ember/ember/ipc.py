"""ember tensors across processes (``torch.multiprocessing``, ``mp.Queue``,
DataLoader workers).

CUDA tensors cross processes by IPC handles to the same device memory. ember
memory is host memory in anonymous private segments (copy-on-write across
fork, so a forked child's writes never reach its parent), which another
process cannot map. So an ember tensor crosses by value: the sender copies
it to a CPU tensor, which torch's own reduction puts in shared memory (file
descriptor passing), and the receiver copies that onto its ember device.
The receiver gets the values, shape, strides, dtype, device index,
``requires_grad`` and Parameter-ness; it does not share storage with the
sender (a later in-place write on one side is not seen by the other, and
views sent separately do not alias each other).

Anything that cannot cross (a non-leaf tensor that requires grad, as for
CUDA) is never raised in the sender: there, ``multiprocessing.Queue`` pickles
in a feeder thread that only prints the error and drops the item, so the
receiver would wait forever (the DataLoader hang). The error travels instead
and is raised in the receiving process when it unpickles the item, i.e. in
the main process within the DataLoader's first batch.
"""

from __future__ import annotations

from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing.reductions as _torch_reductions
from torch.nn.parameter import Parameter

_NON_LEAF = (
    "Cowardly refusing to serialize non-leaf tensor which requires_grad, since autograd "
    "does not support crossing process boundaries.  If you just want to transfer the data, "
    "call detach() on the tensor before serializing (e.g., putting it on the queue)."
)


class EmberSharingError(RuntimeError):
    """An ember tensor sent to another process could not be rebuilt there."""


def _raise_in_receiver(message: str):
    raise EmberSharingError(f"ember tensor sent from another process: {message}")


def _rebuild_ember_tensor(cpu: torch.Tensor, index: int, requires_grad: bool, parameter: bool):
    tensor = cpu.to(torch.device("ember", index))
    if parameter:
        return Parameter(tensor, requires_grad=requires_grad)
    return tensor.requires_grad_(requires_grad)


def reduce_ember_tensor(tensor: torch.Tensor):
    """Pickle reduction of an ember tensor (see the module doc)."""
    try:
        if tensor.requires_grad and not tensor.is_leaf:
            raise RuntimeError(_NON_LEAF)
        cpu = tensor.detach().to("cpu")
        return (
            _rebuild_ember_tensor,
            (cpu, tensor.device.index or 0, tensor.requires_grad, isinstance(tensor, Parameter)),
        )
    except Exception as error:  # noqa: BLE001 - raised where it can be seen: the receiver
        return (_raise_in_receiver, (f"{type(error).__name__}: {error}",))


def _reduce_tensor(tensor: torch.Tensor):
    if tensor.device.type == "ember":
        return reduce_ember_tensor(tensor)
    return _torch_reductions.reduce_tensor(tensor)


def _reduce_storage(storage):
    if storage.device.type == "ember":
        as_tensor = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
        return reduce_ember_tensor(as_tensor)
    return _torch_reductions.reduce_storage(storage)


def register() -> None:
    """Installs the reductions (after torch's own, which it wraps)."""
    for cls in (*torch._tensor_classes, torch.Tensor, Parameter):
        ForkingPickler.register(cls, _reduce_tensor)
    ForkingPickler.register(torch.UntypedStorage, _reduce_storage)
