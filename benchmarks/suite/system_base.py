"""What a system of the suite is (systems.py registers them): ``Prepared``
(a workload made ready to run), ``System`` and the registry ``SYSTEMS``,
``Skip``, and the helpers every system uses to run a workload on a device."""

from __future__ import annotations

import contextlib
import copy
import importlib.metadata
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .workloads import Workload


class Skip(Exception):
    """The system cannot run this workload (missing package, unsupported dtype, ...)."""


@dataclass
class Prepared:
    run: Callable[[], tuple]
    notes: list[str] = field(default_factory=list)
    close: Callable[[], None] | None = None
    # a looser tolerance than the workload's, for a system that changes the
    # arithmetic on purpose (bf16 products); None: the workload's
    rtol: float | None = None
    # A mode (flags, a precision) the system runs in, and its run without
    # entering it: ``run`` enters ``mode()`` itself; a timed sample enters it
    # once and calls ``run_in_mode`` back to back, so the switch is not timed
    # (for mlp-b1 a flags() switch around each run cost ~12 us of ~90).
    mode: Callable[[], contextlib.AbstractContextManager] | None = None
    run_in_mode: Callable[[], tuple] | None = None


@dataclass
class System:
    name: str
    fn: Callable[[Workload, int], Prepared]
    version: Callable[[], str]
    config: str  # the configuration, for the report


SYSTEMS: dict[str, System] = {}


def register(name: str, version: Callable[[], str], config: str = ""):
    def wrap(fn: Callable[[Workload, int], Prepared]):
        text = " ".join((config or fn.__doc__ or "").split())
        SYSTEMS[name] = System(name, fn, version, text)
        return fn

    return wrap


def _dist_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


# --------------------------------------------------------------------------- helpers


def run_on(
    w: Workload,
    call: Callable,
    device: str = "cpu",
    sync: Callable[[], None] | None = None,
    notes: list[str] | None = None,
    close: Callable[[], None] | None = None,
) -> Prepared:
    """Prepared for a system whose ``call`` takes and returns torch tensors on ``device``."""
    inputs = tuple(x.to(device) for x in w.inputs)

    def run() -> tuple:
        with torch.inference_mode():
            out = w.driver(call, inputs)
        if sync is not None:
            sync()
        return out

    return Prepared(run=run, notes=list(notes or []), close=close)


def to_device_copy(module: torch.nn.Module, device: str) -> torch.nn.Module:
    """A copy of ``module`` on ``device`` without a transient second CPU copy.

    Parameters and buffers are moved one by one and handed to ``deepcopy``
    through its memo, so tied weights stay tied.
    """
    memo: dict[int, object] = {}
    for t in itertools.chain(module.parameters(), module.buffers()):
        if id(t) not in memo:
            moved = t.detach().to(device)
            if isinstance(t, torch.nn.Parameter):
                moved = torch.nn.Parameter(moved, requires_grad=t.requires_grad)
            memo[id(t)] = moved
    return copy.deepcopy(module, memo)


def dynamic_dims(w: Workload) -> list[set[int]]:
    """Per input of ``w``, the dims that ``w.dynamic_shapes`` declares dynamic."""
    if w.dynamic_shapes is None:
        return [set() for _ in w.inputs]
    dims: list[set[int]] = []
    for spec in w.dynamic_shapes:
        for s in spec if isinstance(spec, (tuple, list)) else (spec,):
            dims.append(set(s or {}))
    if len(dims) != len(w.inputs):
        raise ValueError(f"{w.name}: dynamic_shapes has {len(dims)} inputs, not {len(w.inputs)}")
    return dims


def torch_export(w: Workload) -> torch.export.ExportedProgram:
    with torch.no_grad():
        return torch.export.export(w.module, w.inputs, dynamic_shapes=w.dynamic_shapes)
