"""Comparison of a device result with the CPU result of the same call.

:func:`compare` raises :class:`Mismatch` naming what differs (``cause``, a
short stable phrase used to group failures) and how (``detail``; for values,
also the greatest absolute and relative difference, ``max_abs``/``max_rel``).
The structure is always compared exactly: type, device, dtype, shape,
strides, storage offset, layout, conj/neg bits, requires_grad. What ``values`` says about
the values:

``True``         bitwise (the ``parity`` mode): ``assert_close(rtol=0,
                 atol=0, equal_nan=True)``, then a byte comparison that also
                 catches signed zeros and NaN payloads
a ``Tolerance``  the ``default`` mode: ``assert_close`` with the dtype's
                 default tolerances, raised to the OpInfo's own overrides
                 (see :mod:`.modes`); results that pass but differ bitwise
                 are noted on the Tolerance (the "tolerance only" passes)
``"close"``      ``assert_close``'s default tolerances (results that are not
                 reproducible on CPU itself), in either mode
``False``        structure only (random and uninitialized-memory ops)
"""

from __future__ import annotations

import math
from typing import Any

import torch


class Mismatch(Exception):
    def __init__(self, cause: str, detail: str = "", max_abs=None, max_rel=None):
        super().__init__(f"{cause}: {detail}" if detail else cause)
        self.cause = cause
        self.detail = detail
        # Greatest differences of the values, when values differ.
        self.max_abs = max_abs
        self.max_rel = max_rel

    def renamed(self, cause: str) -> Mismatch:
        """The same mismatch under another cause (the differences kept)."""
        return Mismatch(cause, self.detail, self.max_abs, self.max_rel)


# assert_close's defaults (rtol, atol) by dtype, for when the private helper moves.
_FALLBACK_TOLERANCES = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
    torch.complex32: (1e-3, 1e-5),
    torch.complex64: (1.3e-6, 1e-5),
    torch.complex128: (1e-7, 1e-7),
}


def default_tolerances(dtype: torch.dtype) -> tuple[float, float]:
    """``assert_close``'s default (rtol, atol) for ``dtype`` (0, 0 for exact dtypes)."""
    try:
        from torch.testing._comparison import default_tolerances as torch_defaults

        return torch_defaults(dtype)
    except (ImportError, TypeError):
        return _FALLBACK_TOLERANCES.get(dtype, (0.0, 0.0))


class Tolerance:
    """Values within tolerance (the ``default`` mode).

    For each compared tensor, ``rtol``/``atol`` are ``assert_close``'s
    defaults for its dtype, raised to the overrides (``rtol_override``,
    ``atol_override``) the OpInfo declares for the task's dtype: exactly what
    PyTorch's ``TestCase.assertEqual`` does with a test's
    ``precisionOverride``/``toleranceOverride``. Values that pass but are not
    bitwise equal are noted in ``inexact`` (reset per sample by the caller).
    """

    def __init__(self, atol_override: float = 0.0, rtol_override: float = 0.0):
        self.atol_override = float(atol_override)
        self.rtol_override = float(rtol_override)
        self.inexact: list[tuple[str, float | None, float | None]] = []

    def for_dtype(self, dtype: torch.dtype) -> tuple[float, float]:
        """(rtol, atol) for a tensor of ``dtype`` (assert_close's order)."""
        rtol, atol = default_tolerances(dtype)
        return max(rtol, self.rtol_override), max(atol, self.atol_override)

    def note(self, where: str, max_abs, max_rel) -> None:
        self.inexact.append((where, max_abs, max_rel))

    def __repr__(self) -> str:
        return f"Tolerance(atol_override={self.atol_override}, rtol_override={self.rtol_override})"


def _plain(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    if t.layout != torch.strided:
        t = t.to_dense()
    return t.resolve_conj().resolve_neg()


def _bits(t: torch.Tensor) -> torch.Tensor:
    flat = torch.empty((t.numel(),), dtype=t.dtype)
    flat.copy_(t.reshape(-1))
    return flat.view(torch.uint8)


def difference(cpu: torch.Tensor, dev: torch.Tensor) -> tuple[float | None, float | None]:
    """Greatest absolute and relative difference of two plain CPU tensors of
    the same shape (NaN against NaN and equal infinities count as equal; a
    NaN against a number, as infinitely far). (None, None) when empty."""
    if cpu.numel() == 0 or cpu.shape != dev.shape:
        return None, None
    wide = torch.complex128 if cpu.dtype.is_complex or dev.dtype.is_complex else torch.float64
    c = cpu.to(torch.int64 if cpu.dtype == torch.bool else cpu.dtype).to(wide)
    d = dev.to(torch.int64 if dev.dtype == torch.bool else dev.dtype).to(wide)
    same = (c == d) | (c.isnan() & d.isnan())
    diff = torch.where(same, 0.0, (d - c).abs().to(torch.float64))
    diff = torch.where(diff.isnan(), math.inf, diff)
    rel = torch.where(diff == 0, 0.0, diff / c.abs().to(torch.float64))
    rel = torch.where(rel.isnan(), math.inf, rel)
    return diff.max().item(), rel.max().item()


def _check_values(c: torch.Tensor, d: torch.Tensor, where: str, values) -> None:
    """Values of plain CPU tensors ``c`` (CPU's) and ``d`` (the device's)."""
    if isinstance(values, Tolerance):
        rtol, atol = values.for_dtype(c.dtype)
        tolerance = {"rtol": rtol, "atol": atol}
    elif values == "close":
        tolerance = {}
    else:
        tolerance = {"rtol": 0, "atol": 0}
    try:
        torch.testing.assert_close(
            d, c, equal_nan=True, check_device=False, check_stride=False, **tolerance
        )
    except AssertionError as error:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        max_abs, max_rel = difference(c, d)
        raise Mismatch(
            "values differ", f"{where}: " + "; ".join(lines[:4]), max_abs, max_rel
        ) from None
    if values == "close" or c.numel() == 0 or torch.equal(_bits(c), _bits(d)):
        return
    if isinstance(values, Tolerance):
        values.note(where, *difference(c, d))
        return
    raise Mismatch("bits differ (signed zero or NaN payload)", where, 0.0, 0.0)


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
    if cpu.layout == torch.strided and dev.storage_offset() != cpu.storage_offset():
        raise Mismatch(
            "storage offset differs",
            f"{where}: {dev.storage_offset()}, CPU {cpu.storage_offset()}",
        )
    if dev.is_conj() != cpu.is_conj() or dev.is_neg() != cpu.is_neg():
        raise Mismatch(
            "conj/neg bit differs",
            f"{where}: conj {dev.is_conj()}/{cpu.is_conj()}, neg {dev.is_neg()}/{cpu.is_neg()}",
        )
    if dev.requires_grad != cpu.requires_grad:
        raise Mismatch(
            "requires_grad differs", f"{where}: {dev.requires_grad}, CPU {cpu.requires_grad}"
        )
    if values is False or cpu.is_quantized:
        return
    _check_values(_plain(cpu), _plain(dev).cpu(), where, values)


def _compare_scalar(cpu: Any, dev: Any, where: str, values) -> None:
    if values is False or _scalar_equal(cpu, dev):
        return
    close = (
        (values == "close" or isinstance(values, Tolerance))
        and isinstance(cpu, (float, complex))
        and type(cpu) is type(dev)
    )
    if not close:
        raise Mismatch("scalar result differs", f"{where}: {dev!r}, CPU {cpu!r}")
    # A Python float or complex is a float64 / complex128 value.
    dtype = torch.complex128 if isinstance(cpu, complex) else torch.float64
    _check_values(torch.tensor(cpu, dtype=dtype), torch.tensor(dev, dtype=dtype), where, values)


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
        _compare_scalar(cpu, dev, where, values)
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
