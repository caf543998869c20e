"""The two sweeps: ``parity`` (bitwise) and ``default`` (OpInfo's tolerances).

``parity``   the device runs with ``torch.backends.<device>.cpu_parity =
             True`` (ember: ``EMBER_CPU_PARITY=1``, every op on CPU's own
             kernel) and values are compared bitwise.
``default``  the device runs as it does by default (ember: its own kernels,
             e.g. oneDNN / packed-weight GEMM for the matmul family) and
             values are compared the way PyTorch's device-generic tests
             compare a device with CPU: ``torch.testing.assert_close`` with
             the dtype's default ``rtol``/``atol``, raised to the
             ``precisionOverride``/``toleranceOverride`` the OpInfo declares
             (bare in ``op.decorators``, or in a ``DecorateInfo`` active for
             ``TestCommon.test_compare_cpu`` on this device type and dtype;
             for modules, ``TestModule.test_cpu_gpu_parity``).

In both modes the structure (dtype, shape, strides, conj/neg bits,
aliasing, in-place and ``out=`` semantics, inputs after the call) is
compared exactly. A backend without a ``cpu_parity`` switch runs as it is in
both modes; only the comparison differs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from .compare import Tolerance

MODES = ("parity", "default")
DEFAULT_MODE = "parity"
# What the report says each mode compares.
COMPARISON = {
    "parity": "bitwise",
    "default": "assert_close with OpInfo's per-dtype tolerances",
}
# The environment switch read at process start by ember's flag store; the
# runner sets it for its workers (they also set the flag itself).
ENV_SWITCH = "EMBER_CPU_PARITY"
# The PyTorch device-generic tests whose tolerance overrides the default mode
# honours: the ones that compare a device's results with CPU's.
OP_TEST = ("TestCommon", "test_compare_cpu")
MODULE_TEST = ("TestModule", "test_cpu_gpu_parity")


def check(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose from {', '.join(MODES)}")
    return mode


def worker_env(mode: str) -> dict[str, str]:
    """Environment overrides for the worker processes of a sweep in ``mode``."""
    return {ENV_SWITCH: "1" if check(mode) == "parity" else "0"}


def _backend(device_type: str):
    return getattr(torch.backends, device_type, None)


def cpu_parity(device_type: str) -> bool | None:
    """The device's ``cpu_parity`` switch, or None when it has none."""
    backend = _backend(device_type)
    try:
        return bool(backend.cpu_parity) if backend is not None else None
    except AttributeError:
        return None


def apply(device_type: str, mode: str) -> bool | None:
    """Sets the device's ``cpu_parity`` switch for ``mode`` (where it has one)
    and returns its value read back (None: no such switch)."""
    wanted = check(mode) == "parity"
    if cpu_parity(device_type) is None:
        return None
    _backend(device_type).cpu_parity = wanted
    value = cpu_parity(device_type)
    if value != wanted:
        raise RuntimeError(
            f"torch.backends.{device_type}.cpu_parity is {value} after setting it to {wanted}"
        )
    return value


@contextlib.contextmanager
def active(device_type: str, mode: str) -> Iterator[bool | None]:
    """``apply`` for the body, the previous value restored after it."""
    previous = cpu_parity(device_type)
    try:
        yield apply(device_type, mode)
    finally:
        if previous is not None:
            _backend(device_type).cpu_parity = previous


# ---------------------------------------------------------------------------
# OpInfo / ModuleInfo tolerance overrides


def _active_decorators(info, test: tuple[str, str], device_type: str, dtype) -> list:
    """The decorators PyTorch would apply to ``test`` of this op at ``dtype``
    on ``device_type``: bare ones, and those of the active DecorateInfos."""
    from torch.testing._internal.opinfo.core import DecorateInfo

    cls_name, test_name = test
    out = []
    for decorator in getattr(info, "decorators", None) or ():
        if not isinstance(decorator, DecorateInfo):
            out.append(decorator)
            continue
        try:
            on = decorator.is_active(cls_name, test_name, device_type, dtype, {"dtype": dtype})
        except Exception:  # noqa: BLE001 - an active_if that cannot judge: not active
            on = False
        if on:
            out.extend(decorator.decorators)
    return out


def overrides(info, test: tuple[str, str], device_type: str, dtype) -> tuple[float, float]:
    """(atol, rtol) the test runs with, as ``instantiate_device_type_tests``
    sets ``self.precision``/``self.rel_tol``: the last ``precisionOverride``
    gives the atol for the dtype, the last ``toleranceOverride`` (if it names
    the dtype) both; (0, 0) when none applies."""
    from torch.testing._internal.common_device_type import (
        precisionOverride,
        toleranceOverride,
    )

    precisions = tolerances = None
    for decorator in _active_decorators(info, test, device_type, dtype):
        if isinstance(decorator, toleranceOverride):
            tolerances = decorator.d
        elif isinstance(decorator, precisionOverride):
            precisions = decorator.d
    atol = float(precisions.get(dtype, 0.0)) if precisions else 0.0
    rtol = 0.0
    if tolerances and dtype in tolerances:
        atol, rtol = float(tolerances[dtype].atol), float(tolerances[dtype].rtol)
    return atol, rtol


def op_tolerance(op, dtype, device_type: str) -> Tolerance:
    return Tolerance(*overrides(op, OP_TEST, device_type, dtype))


def module_tolerance(info, dtype, device_type: str) -> Tolerance:
    return Tolerance(*overrides(info, MODULE_TEST, device_type, dtype))
