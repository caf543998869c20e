"""Reproducing one sample of a task (``--repro KEY --sample i``)."""

from __future__ import annotations

from . import modes
from .cases import (
    _backward_sample,
    _forward_sample,
    _iterate_samples,
    _Outcome,
    op_tolerance,
    sample_values_compared,
)
from .modules import _module_sample, _ModuleSample, module_inputs, module_values_compared

Outcome = _Outcome


def pick_sample(task, registry, dtype, index, device=None):
    """Sample ``index`` of a task, generated exactly as the sweep generates it."""
    if task.kind == "modules":
        info = registry.modules[task.name]
        return _ModuleSample(module_inputs(info, dtype, task.variant == "train")[index])
    op = registry.ops[task.name]
    for i, sample in _iterate_samples(op, dtype, task.kind == "backward", None, device):
        if i == index:
            return sample
    raise IndexError(f"{task.key} has no sample {index}")


def run_sample(task, registry, dtype, device, sample, mode: str = modes.DEFAULT_MODE) -> str:
    """Runs one sample of a task, compared as the ``mode`` sweep compares it
    (the device's switch is the caller's: see :func:`.modes.active`); failures
    raise (Mismatch, Outcome or the device's error). In the default mode a
    pass that is not bitwise is returned as ``pass (within tolerance: ...)``."""
    if task.kind == "modules":
        info = registry.modules[task.name]
        values = module_values_compared(info, dtype, device, mode)
        training = task.variant == "train"
        outcome = _module_sample(info, sample.module_input, dtype, training, device, values)
    else:
        op = registry.ops[task.name]
        values = op_tolerance(op, dtype, device, mode)
        if task.kind == "forward":
            compared = sample_values_compared(op, sample, values)
            outcome = _forward_sample(op, task.variant, sample, device, compared)
        else:
            outcome = _backward_sample(op, sample, device, values)
    inexact = getattr(values, "inexact", None)
    if outcome == "pass" and inexact:
        where, max_abs, max_rel = inexact[0]
        outcome += (
            f" (within tolerance, not bitwise: {where}: max abs {max_abs}, max rel {max_rel})"
        )
    return outcome
