"""Running a program on ember and on CPU, comparing, shrinking, reproducing.

Values are compared as the conformance kit compares them
(:func:`torch_ember.conformance.compare.compare`): structure exactly (dtype,
shape, strides, storage offset, requires_grad), values bitwise in the
``parity`` mode (``torch.backends.ember.cpu_parity = True``) and within
OpInfo's default per-dtype tolerances in the ``default`` mode. In the default
mode a result that passes within tolerance is then overwritten with CPU's
bits on ember, so the next op starts from the same inputs and differences
are judged per op, as OpInfo's tolerances are meant (not amplified along
the chain); where that cannot be done (a tensor that requires grad), later
values are not compared in that program, only structure.
"""

from __future__ import annotations

import contextlib
import inspect
import re
import warnings
from dataclasses import dataclass

import torch

from torch_ember.conformance.compare import Mismatch, Tolerance, compare, values_equal
from torch_ember.fuzz.program import Program, make

MODES = ("parity", "default")
_ASSIGNED = re.compile(r"^(\w+) = ")


@dataclass
class Failure:
    line: int  # index into Program.lines
    cause: str
    detail: str

    def __str__(self) -> str:
        return f"line {self.line + 1}: {self.cause}: {self.detail}"[:600]


class InvalidOnCpu(Exception):
    """CPU refused a line it accepted while the program was generated."""


def _env(device: str) -> dict:
    return {"torch": torch, "make": make, "D": device}


@contextlib.contextmanager
def mode_flags(mode: str):
    with torch.backends.ember.flags(cpu_parity=mode == "parity"):
        yield


def _tensors(env: dict) -> list[str]:
    return [n for n, v in env.items() if isinstance(v, (torch.Tensor, tuple))]


def _resync(cpu, dev) -> bool:
    """Default mode: gives the ember tensor CPU's bits (see the module doc).
    False when it differs and cannot be overwritten (it requires grad, or
    its elements overlap): later values then depend on an inexact input."""
    if isinstance(cpu, tuple):
        return all(_resync(c, d) for c, d in zip(cpu, dev, strict=True))
    if not isinstance(cpu, torch.Tensor) or values_equal(cpu, dev):
        return True
    if dev.requires_grad:
        return False
    try:
        with torch.no_grad():
            dev.copy_(cpu)
    except RuntimeError:
        return False
    return values_equal(cpu, dev)


def run(program: Program, mode: str) -> Failure | None:
    """Runs ``program`` on CPU and on ember line by line; the first
    difference, or None. Raises InvalidOnCpu if CPU refuses a line."""
    values = True if mode == "parity" else Tolerance()
    # Default mode, once a result differs within tolerance and cannot be
    # resynced: its errors may grow along the chain past any per-op
    # tolerance, so from there on only structure is compared.
    inexact = False
    device = torch.device("ember")
    cpu_env, dev_env = _env("cpu"), _env("ember")
    with mode_flags(mode), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for index, line in enumerate(program.lines):
            try:
                exec(line, cpu_env)  # noqa: S102 - generated program text
            except Exception as error:  # noqa: BLE001
                raise InvalidOnCpu(f"line {index + 1}: {type(error).__name__}: {error}") from None
            try:
                exec(line, dev_env)  # noqa: S102
            except Exception as error:  # noqa: BLE001
                detail = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300]}"
                return Failure(index, "ember raised where CPU did not", detail)
            assigned = _ASSIGNED.match(line)
            # An in-place line may write through views into any variable.
            names = [assigned.group(1)] if assigned else _tensors(cpu_env)
            if index == len(program.lines) - 1:
                names = _tensors(cpu_env)
            for name in names:
                if name not in cpu_env:
                    continue
                try:
                    compare(
                        cpu_env[name], dev_env[name], device, False if inexact else values, name
                    )
                except Mismatch as error:
                    return Failure(index, error.cause, error.detail or error.cause)
                if mode == "default" and not _resync(cpu_env[name], dev_env[name]):
                    inexact = True
    return None


def _same_failure(program: Program, mode: str, cause: str) -> bool:
    try:
        failure = run(program, mode)
    except InvalidOnCpu:
        return False
    return failure is not None and failure.cause == cause


def shrink(program: Program, mode: str, failure: Failure) -> Program:
    """The program with every line removed whose removal keeps the failure
    (same cause): greedy, from the last line back, until nothing goes."""
    lines = list(program.lines[: failure.line + 1])
    changed = True
    while changed:
        changed = False
        for index in reversed(range(len(lines))):
            candidate = Program(program.seed, program.autograd, lines[:index] + lines[index + 1 :])
            if candidate.lines and _same_failure(candidate, mode, failure.cause):
                lines = candidate.lines
                changed = True
    return Program(program.seed, program.autograd, lines)


def reproducer(program: Program, mode: str, failure: Failure | None = None) -> str:
    """A standalone script: the program on both devices, compared as the
    fuzzer compares (it fails where the fuzzer found a difference)."""
    body = "\n".join("    " + line for line in program.lines)
    tolerance = "rtol=0, atol=0, " if mode == "parity" else ""
    note = f"# {failure}\n" if failure is not None else ""
    bitwise = (
        """
    if isinstance(expected, torch.Tensor) and expected.is_floating_point():
        bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[expected.element_size()]
        assert torch.equal(got.detach().view(bits), expected.detach().view(bits)), name"""
        if mode == "parity"
        else ""
    )
    return f"""# ember fuzz reproducer: seed {program.seed}, {mode} mode
{note}import torch
import torch_ember  # noqa: F401

torch.backends.ember.cpu_parity = {mode == "parity"}


{inspect.getsource(make)}

def program(D):
{body}
    return {{k: v for k, v in locals().items() if k != "D"}}


cpu, ember = program("cpu"), program("ember")
for name, expected in cpu.items():
    got = ember[name]
    if isinstance(expected, torch.Tensor):
        assert got.device.type == "ember", name
        assert got.stride() == expected.stride(), (name, got.stride(), expected.stride())
        assert got.storage_offset() == expected.storage_offset(), name
        got = got.cpu()
    torch.testing.assert_close(got, expected, {tolerance}equal_nan=True, msg=name){bitwise}
print("no difference")
"""
