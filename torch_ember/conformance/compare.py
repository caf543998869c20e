"""Comparison of a device result with the CPU result of the same call.

:func:`compare` raises :class:`Mismatch` naming what differs (``cause``, a
short stable phrase used to group failures) and how (``detail``).
Deterministic results must be identical: dtype, shape, strides, conj/neg bits
and values, bit for bit (``assert_close(rtol=0, atol=0, equal_nan=True)``,
then a byte comparison that also catches signed zeros and NaN payloads).
With ``values=False`` (random and uninitialized-memory ops) only the
structure (type, device, dtype, shape, strides) is compared; with
``values="close"`` (results that are not reproducible on CPU itself) values
are compared with ``assert_close``'s default tolerances for the dtype.
"""

from __future__ import annotations

import math
from typing import Any

import torch


class Mismatch(Exception):
    def __init__(self, cause: str, detail: str = ""):
        super().__init__(f"{cause}: {detail}" if detail else cause)
        self.cause = cause
        self.detail = detail


def _plain(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.layout != torch.strided:
        t = t.to_dense()
    return t.resolve_conj().resolve_neg()


def _bits(t: torch.Tensor) -> torch.Tensor:
    flat = torch.empty((t.numel(),), dtype=t.dtype)
    flat.copy_(t.reshape(-1))
    return flat.view(torch.uint8)


def values_equal(cpu: torch.Tensor, dev: torch.Tensor) -> bool:
    """True when the values are bitwise identical (dev already on CPU or not)."""
    c, d = _plain(cpu), _plain(dev).cpu()
    if c.shape != d.shape or c.dtype != d.dtype:
        return False
    if c.numel() == 0:
        return True
    return torch.equal(_bits(c), _bits(d))


def compare_tensor(cpu: torch.Tensor, dev: Any, where: str, device: torch.device, values):
    if not isinstance(dev, torch.Tensor):
        raise Mismatch("result type differs", f"{where}: CPU Tensor, device {type(dev).__name__}")
    expected_device = device.type if cpu.device.type == "cpu" else cpu.device.type
    if dev.device.type != expected_device:
        raise Mismatch(
            "result on wrong device", f"{where}: {dev.device}, expected {expected_device}"
        )
    if dev.dtype != cpu.dtype:
        raise Mismatch("dtype differs", f"{where}: {dev.dtype}, CPU {cpu.dtype}")
    if dev.shape != cpu.shape:
        raise Mismatch("shape differs", f"{where}: {tuple(dev.shape)}, CPU {tuple(cpu.shape)}")
    if dev.layout != cpu.layout:
        raise Mismatch("layout differs", f"{where}: {dev.layout}, CPU {cpu.layout}")
    if cpu.layout == torch.strided and dev.stride() != cpu.stride():
        raise Mismatch("strides differ", f"{where}: {dev.stride()}, CPU {cpu.stride()}")
    if dev.is_conj() != cpu.is_conj() or dev.is_neg() != cpu.is_neg():
        raise Mismatch(
            "conj/neg bit differs",
            f"{where}: conj {dev.is_conj()}/{cpu.is_conj()}, neg {dev.is_neg()}/{cpu.is_neg()}",
        )
    if dev.requires_grad != cpu.requires_grad:
        raise Mismatch(
            "requires_grad differs", f"{where}: {dev.requires_grad}, CPU {cpu.requires_grad}"
        )
    if not values or cpu.is_quantized:
        return
    c, d = _plain(cpu), _plain(dev).cpu()
    tolerance = {} if values == "close" else {"rtol": 0, "atol": 0}
    try:
        torch.testing.assert_close(
            d, c, equal_nan=True, check_device=False, check_stride=False, **tolerance
        )
    except AssertionError as error:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        raise Mismatch("values differ", f"{where}: " + "; ".join(lines[:4])) from None
    if values != "close" and c.numel() and not torch.equal(_bits(c), _bits(d)):
        raise Mismatch("bits differ (signed zero or NaN payload)", where)


def _scalar_equal(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, complex) and isinstance(b, complex):
        return _scalar_equal(a.real, b.real) and _scalar_equal(a.imag, b.imag)
    return type(a) is type(b) and a == b


def compare(cpu: Any, dev: Any, device: torch.device, values=True, where: str = "output"):
    """Raises Mismatch if ``dev`` (a device result) differs from ``cpu``."""
    if isinstance(cpu, torch.Tensor):
        compare_tensor(cpu, dev, where, device, values)
    elif isinstance(cpu, (list, tuple)):
        if not isinstance(dev, (list, tuple)) or len(dev) != len(cpu):
            raise Mismatch("result structure differs", f"{where}: {type(dev).__name__}")
        if type(cpu) is not type(dev):
            raise Mismatch(
                "result type differs", f"{where}: {type(dev).__name__}, CPU {type(cpu).__name__}"
            )
        for index, (c, d) in enumerate(zip(cpu, dev, strict=True)):
            compare(c, d, device, values, f"{where}[{index}]")
    elif isinstance(cpu, dict):
        if not isinstance(dev, dict) or set(dev) != set(cpu):
            raise Mismatch("result structure differs", where)
        for key in cpu:
            compare(cpu[key], dev[key], device, values, f"{where}[{key!r}]")
    elif isinstance(cpu, torch.device):
        expected = device if cpu.type == "cpu" else cpu
        if not isinstance(dev, torch.device) or dev.type != expected.type:
            raise Mismatch("result differs", f"{where}: {dev!r}, expected {expected!r}")
    elif isinstance(cpu, (bool, int, float, complex)):
        if values is True and not _scalar_equal(cpu, dev):
            raise Mismatch("scalar result differs", f"{where}: {dev!r}, CPU {cpu!r}")
    elif cpu is None or isinstance(cpu, (str, torch.dtype, torch.Size)):
        if cpu != dev:
            raise Mismatch("result differs", f"{where}: {dev!r}, CPU {cpu!r}")
    else:
        try:
            equal = bool(cpu == dev)
        except Exception:  # noqa: BLE001 - an incomparable object is reported, not raised
            equal = False
        if values and not equal:
            raise Mismatch("result differs", f"{where}: {type(dev).__name__}")
