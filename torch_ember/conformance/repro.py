"""Reproducing one sample of a task (``--repro KEY --sample i``)."""

from __future__ import annotations

from .cases import (
    _backward_sample,
    _forward_sample,
    _iterate_samples,
    _Outcome,
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


def run_sample(task, registry, dtype, device, sample) -> str:
    """Runs one sample of a task; failures raise (Mismatch, Outcome or the device's error)."""
    if task.kind == "forward":
        op = registry.ops[task.name]
        values = sample_values_compared(op, sample)
        return _forward_sample(op, task.variant, sample, device, values)
    if task.kind == "backward":
        return _backward_sample(registry.ops[task.name], sample, device)
    info = registry.modules[task.name]
    training = task.variant == "train"
    return _module_sample(
        info, sample.module_input, dtype, training, device, module_values_compared(info)
    )
