"""Running one module-dtype-mode of ``module_db`` on the device and on CPU:
forward outputs and the module's buffers after the forward (BatchNorm's
running statistics), then gradients of inputs and parameters, compared as in
:mod:`.cases` (bitwise in the ``parity`` sweep; in the ``default`` sweep with
the tolerances ``TestModule.test_cpu_gpu_parity`` runs with, see
:mod:`.modes`)."""

from __future__ import annotations

import copy

import torch

from . import modes
from .cases import (
    SEED,
    CaseResult,
    _call,
    _device_error,
    _error_text,
    _grad_pair,
    _Outcome,
    _run_samples,
)
from .compare import Mismatch, Tolerance, compare
from .op_traits import RANDOM_MODULES, _matches
from .transform import flat_tensors, to_device


def module_inputs(info, dtype, training):
    """The module's samples, generated (seeded) exactly as the sweep does."""
    torch.manual_seed(SEED)
    inputs = info.module_inputs_func(
        info, device="cpu", dtype=dtype, requires_grad=True, training=training
    )
    return [m for m in inputs if m.forward_input is not None]


def module_values_compared(info, dtype=None, device=None, mode: str = modes.DEFAULT_MODE):
    """False (random modules: structure only), True (bitwise, the parity
    mode) or the module's Tolerance (the default mode)."""
    if _matches(info.name, RANDOM_MODULES):
        return False
    if modes.check(mode) == "parity":
        return True
    return modes.module_tolerance(info, dtype, torch.device(device).type)


def _module_sample(info, module_input, dtype, training, device, values):
    ctor, fwd = module_input.constructor_input, module_input.forward_input
    torch.manual_seed(SEED)
    try:
        cpu_module = info.module_cls(*ctor.args, **ctor.kwargs)
        cpu_module.to(dtype)
        cpu_module.train(training)
    except Exception as error:  # noqa: BLE001
        raise _Outcome("cpu_error", "", "constructing: " + _error_text(error)) from None
    try:
        dev_module = copy.deepcopy(cpu_module).to(device)
    except Exception as error:  # noqa: BLE001
        raise _device_error(error, "module.to(device): ") from None
    cpu_args = (
        to_device(fwd.args, torch.device("cpu")),
        to_device(fwd.kwargs, torch.device("cpu")),
    )
    try:
        dev_args = (to_device(fwd.args, device), to_device(fwd.kwargs, device))
    except Exception as error:  # noqa: BLE001
        raise _device_error(error, "copying the input to the device: ") from None

    def call(module):
        def fn(args, kwargs):
            return module(*args, **kwargs)

        return fn

    try:
        cpu_out = _call(call(cpu_module), cpu_args[0], (cpu_args[1],), {})
    except Exception as error:  # noqa: BLE001
        raise _Outcome("cpu_error", "", "forward: " + _error_text(error)) from None
    try:
        dev_out = _call(call(dev_module), dev_args[0], (dev_args[1],), {})
    except Exception as error:  # noqa: BLE001
        raise _device_error(error, "forward: ") from None
    try:
        compare(cpu_out, dev_out, device, values)
    except Mismatch as error:
        raise error.renamed("forward: " + error.cause) from None
    # Buffers the forward updated (BatchNorm's running mean / var and batch
    # count in train mode) are results too.
    compare_buffers(cpu_module, dev_module, device, values)
    # Backward: inputs that require grad and all parameters.
    cpu_params = [p for p in cpu_module.parameters() if p.requires_grad]
    dev_params = [p for p in dev_module.parameters() if p.requires_grad]
    names = [n for n, p in cpu_module.named_parameters() if p.requires_grad]
    cpu_inputs = [t for t in flat_tensors(cpu_args) if t.requires_grad]
    dev_inputs = [t for t in flat_tensors(dev_args) if t.requires_grad]
    if not (cpu_params or cpu_inputs):
        return "pass"
    try:
        cpu_grads, dev_grads = _grad_pair(
            cpu_out, dev_out, cpu_inputs + cpu_params, dev_inputs + dev_params
        )
    except _Outcome as outcome:
        if outcome.outcome == "skipped":
            return "pass"  # forward compared; nothing to differentiate
        raise
    labels = [f"input {i}" for i in range(len(cpu_inputs))] + [f"parameter {n}" for n in names]
    for label, c, d in zip(labels, cpu_grads, dev_grads, strict=True):
        if (c is None) != (d is None):
            raise Mismatch("backward: gradient presence differs", label)
        if c is None:
            continue
        try:
            compare(c, d, device, values, where=f"grad of {label}")
        except Mismatch as error:
            raise error.renamed("backward: gradient " + error.cause) from None
    return "pass"


def compare_buffers(cpu_module, dev_module, device, values) -> None:
    """Raises Mismatch if the modules' buffers differ (names, then each
    buffer as a result: structure exactly, values as ``values`` says)."""
    cpu_buffers = dict(cpu_module.named_buffers())
    dev_buffers = dict(dev_module.named_buffers())
    if list(cpu_buffers) != list(dev_buffers):
        raise Mismatch(
            "forward: module buffers differ", f"{list(dev_buffers)}, CPU {list(cpu_buffers)}"
        )
    for name, cpu_buffer in cpu_buffers.items():
        try:
            compare(cpu_buffer, dev_buffers[name], device, values, where=f"buffer {name}")
        except Mismatch as error:
            raise error.renamed("forward: buffer " + error.cause) from None


class _ModuleSample:
    """Adapts a ModuleInput to the ``summary()`` used in failure records."""

    def __init__(self, module_input):
        self.module_input = module_input

    def summary(self):
        fwd = self.module_input.forward_input
        desc = self.module_input.desc or ""
        ctor = self.module_input.constructor_input
        shapes = [tuple(t.shape) for t in flat_tensors((fwd.args, fwd.kwargs))]
        return f"desc={desc!r} ctor_args={ctor.args!r} ctor_kwargs={ctor.kwargs!r} inputs={shapes}"


def run_module(
    info,
    dtype,
    variant,
    device,
    max_samples=None,
    progress=lambda i, s: None,
    mode: str = modes.DEFAULT_MODE,
) -> dict:
    result = CaseResult()
    training = variant == "train"
    values = module_values_compared(info, dtype, device, mode)
    if values is False:
        result.notes["values_compared"] = False
    try:
        inputs = module_inputs(info, dtype, training)
    except Exception as error:  # noqa: BLE001
        result.sample_error = "generating module inputs failed: " + _error_text(error)
        return result.to_dict()
    if max_samples is not None:
        inputs = inputs[:max_samples]
    samples = ((i, _ModuleSample(m)) for i, m in enumerate(inputs))
    _run_samples(
        result,
        samples,
        lambda s: _module_sample(info, s.module_input, dtype, training, device, values),
        progress,
        values if isinstance(values, Tolerance) else None,
    )
    return result.to_dict()
