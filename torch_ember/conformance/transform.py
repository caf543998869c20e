"""Deep copies of sample inputs onto a device, keeping their memory layout.

A strided tensor is copied together with its whole storage and re-viewed with
the same sizes, strides and storage offset, so the device copy and the CPU
copy of a sample are laid out identically: non-contiguous, expanded (stride 0)
and offset views stay what they are, conj/neg bits are kept and
``requires_grad`` is preserved (the copy is a leaf). Non-tensors are left as
they are, except that the device ``"cpu"`` (as a string or ``torch.device``)
becomes the target device, so factory ops create their result there.
"""

from __future__ import annotations

from typing import Any

import torch


def _copy_strided(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    base = t.detach()
    conj, neg = base.is_conj(), base.is_neg()
    if conj:
        base = base.conj()  # a view without the conj bit
    if neg:
        base = base._neg_view()  # a view without the neg bit
    storage = base.untyped_storage()
    elements = storage.nbytes() // base.element_size()
    flat = base.new_empty(0).set_(storage, 0, (elements,), (1,))
    if device.type == "cpu":
        flat = flat.clone()
    else:
        flat = flat.to(device, copy=True)
    out = flat.as_strided(base.shape, base.stride(), base.storage_offset())
    if neg:
        out = out._neg_view()
    if conj:
        out = out.conj()
    return out


def copy_tensor(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A leaf copy of ``t`` on ``device`` with the same layout and requires_grad."""
    if (
        t.layout == torch.strided
        and not t.is_quantized
        and type(t)
        in (
            torch.Tensor,
            torch.nn.Parameter,
        )
    ):
        out = _copy_strided(t, device)
    elif device.type == "cpu":
        out = t.detach().clone()
    else:
        out = t.detach().to(device)
    out = out.detach()
    if t.requires_grad:
        out.requires_grad_(True)
    return out


def map_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.device) and value.type == "cpu":
        return device
    if isinstance(value, str) and value == "cpu":
        return str(device)
    return value


def to_device(value: Any, device: torch.device, placement=None) -> Any:
    """Deep transform: tensors copied to ``device``, containers rebuilt.

    ``placement``, an iterator of booleans (one per tensor, in
    :func:`flat_tensors` order), says which tensors go to ``device``; the
    others are copied to CPU (e.g. index tensors an op wants on CPU).
    """
    if isinstance(value, torch.Tensor):
        on_device = True if placement is None else next(placement, True)
        return copy_tensor(value, device if on_device else torch.device("cpu"))
    if isinstance(value, torch.Size):
        return value
    if isinstance(value, tuple):
        items = [to_device(v, device, placement) for v in value]
        if hasattr(value, "_fields"):  # namedtuple
            return type(value)(*items)
        return type(value)(items) if type(value) is not tuple else tuple(items)
    if isinstance(value, list):
        return [to_device(v, device, placement) for v in value]
    if isinstance(value, dict):
        return {k: to_device(v, device, placement) for k, v in value.items()}
    return map_device(value, device)


def sample_to(sample, device: torch.device, placement: list[bool] | None = None):
    """(input, args, kwargs) of an OpInfo SampleInput, copied to ``device``."""
    it = None if placement is None else iter(placement)
    return (
        to_device(sample.input, device, it),
        to_device(tuple(sample.args), device, it),
        to_device(dict(sample.kwargs), device, it),
    )


def placement_of(cpu_sample, device_sample) -> list[bool] | None:
    """Which tensors the sample function put on the device when asked for it.

    Sample functions keep some tensors on CPU whatever the device (index
    tensors of ``tensor_split``, for instance); generating the sample for the
    device too and reading where its tensors are keeps that. None when the
    two samples do not have the same tensors.
    """
    if device_sample is None:
        return None
    cpu = flat_tensors((cpu_sample.input, tuple(cpu_sample.args), dict(cpu_sample.kwargs)))
    dev = flat_tensors((device_sample.input, tuple(device_sample.args), dict(device_sample.kwargs)))
    if len(cpu) != len(dev) or any(c.shape != d.shape for c, d in zip(cpu, dev, strict=True)):
        return None
    return [d.device.type != "cpu" for d in dev]


def involves_device(value: Any) -> bool:
    """Whether copying ``value`` to a device changes anything (tensors or a device)."""
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (list, tuple)):
        return any(involves_device(v) for v in value)
    if isinstance(value, dict):
        return any(involves_device(v) for v in value.values())
    return (
        isinstance(value, (str, torch.device)) and map_device(value, torch.device("meta")) != value
    )


def sample_involves_device(sample) -> bool:
    return involves_device((sample.input, tuple(sample.args), dict(sample.kwargs)))


def flat_tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor of a nested structure, in a deterministic order."""
    out: list[torch.Tensor] = []

    def walk(v: Any) -> None:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            for item in v:
                walk(item)
        elif isinstance(v, dict):
            for item in v.values():
                walk(item)

    walk(value)
    return out
