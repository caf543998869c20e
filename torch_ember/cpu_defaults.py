"""Defaults PyTorch keys by device type, given to ember as CPU's.

A few of PyTorch's Python-level policies pick a default from the device
*type* of a tensor ("cuda", "cpu", else a generic fallback). ember runs
CPU's kernels on host memory, so CPU's pick is the right one: the fallback
is tuned for other hardware and, on CPU kernels, slow. Today:

* ``torch.nn.functional.linear_cross_entropy``'s ``"auto"`` options:
  CPU's accumulation policy and fp32 accumulation for fp16/bf16 inputs
  (the fallback's policy runs emulated low-precision matmuls, which the
  table in ``torch/nn/modules/linear_cross_entropy_options.py`` measures
  20-50x slower on CPU), and results equal CPU's.
"""

from __future__ import annotations

import torch

_CPU = torch.device("cpu")


def _share_linear_cross_entropy_defaults() -> None:
    try:
        from torch.nn.modules import linear_cross_entropy_options as options
    except ImportError:  # a PyTorch without linear_cross_entropy
        return
    table = getattr(options, "_AUTO_DEFAULTS", None)
    cls = getattr(options, "LinearCrossEntropyOptions", None)
    resolve = getattr(cls, "_resolve_auto_acc_dtype", None)
    if table is None or resolve is None or getattr(resolve, "_ember", False):
        return
    for (device_type, dtype), default in list(table.items()):
        if device_type == "cpu":
            table.setdefault(("ember", dtype), default)

    def resolve_as_cpu(dtype, device):
        if device is not None and device.type == "ember":
            device = _CPU
        return resolve(dtype, device)

    resolve_as_cpu._ember = True
    cls._resolve_auto_acc_dtype = staticmethod(resolve_as_cpu)


def register() -> None:
    _share_linear_cross_entropy_defaults()
