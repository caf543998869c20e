"""The units of work of a sweep: one op-dtype-variant (or module-dtype-mode) each.

A task's key, ``kind|name|dtype|variant``, identifies its result in the
results file, which is what makes a sweep resumable.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import asdict, dataclass

import torch

from . import _db
from .cases import forward_variants

KINDS = ("forward", "backward", "modules")
MODULE_VARIANTS = ("train", "eval")


@dataclass(frozen=True)
class Task:
    kind: str
    name: str
    dtype: str
    variant: str

    @property
    def key(self) -> str:
        return f"{self.kind}|{self.name}|{self.dtype}|{self.variant}"

    def to_dict(self) -> dict:
        return {**asdict(self), "key": self.key}

    @classmethod
    def from_key(cls, key: str) -> Task:
        kind, name, dtype, variant = key.split("|")
        return cls(kind, name, dtype, variant)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.strip().removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"unknown dtype {name!r}")
    return dtype


def name_matches(name: str, patterns: list[str] | None) -> bool:
    """fnmatch or full regex match against any of the patterns (None: all)."""
    if not patterns:
        return True
    for pattern in patterns:
        if fnmatch.fnmatchcase(name, pattern):
            return True
        try:
            if re.fullmatch(pattern, name):
                return True
        except re.error:
            pass
    return False


class Registry:
    """Name -> OpInfo / ModuleInfo, with the optional extra ops first."""

    def __init__(self, extra_ops: str | None = None, load_modules: bool = True):
        self.ops = {}
        if extra_ops:
            for op in _db.load_extra_ops(extra_ops):
                self.ops[op.full_name] = op
        for op in _db.op_db():
            self.ops.setdefault(op.full_name, op)
        self.modules = {}
        if load_modules:
            for info in _db.module_db():
                self.modules.setdefault(info.name, info)

    def tasks(
        self,
        kinds=KINDS,
        patterns: list[str] | None = None,
        dtypes: list[torch.dtype] | None = None,
        variants: list[str] | None = None,
    ) -> list[Task]:
        wanted = set(dtypes) if dtypes else None
        forward: list[Task] = []
        backward: list[Task] = []
        modules: list[Task] = []

        def keep(dtype, variant):
            return (wanted is None or dtype in wanted) and (not variants or variant in variants)

        for name, op in self.ops.items():
            if not name_matches(name, patterns):
                continue
            if "forward" in kinds:
                for dtype in sorted(op.supported_dtypes("cpu"), key=dtype_name):
                    for variant in forward_variants(op):
                        if keep(dtype, variant):
                            forward.append(Task("forward", name, dtype_name(dtype), variant))
            if "backward" in kinds and op.supports_autograd:
                for dtype in sorted(op.supported_backward_dtypes("cpu"), key=dtype_name):
                    if keep(dtype, "grad"):
                        backward.append(Task("backward", name, dtype_name(dtype), "grad"))
        if "modules" in kinds:
            for name, info in self.modules.items():
                if not name_matches(name, patterns):
                    continue
                for dtype in sorted(info.supported_dtypes("cpu"), key=dtype_name):
                    for variant in MODULE_VARIANTS:
                        if keep(dtype, variant):
                            modules.append(Task("modules", name, dtype_name(dtype), variant))
        return forward + backward + modules
