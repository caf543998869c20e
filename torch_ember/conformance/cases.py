"""Running one op-dtype-variant (or module-dtype-mode) on the device and on CPU.

Every sample is generated once on CPU (seeded, as PyTorch's own OpInfo tests
do), copied twice with :mod:`.transform` (a CPU copy and a device copy with
the same layout), and the same call is made on both with the global RNG
seeded identically before each call. A sample ends as one of:

``pass``            both ran and the device result equals the CPU result
                    (bitwise in the ``parity`` mode, within tolerance in the
                    ``default`` mode: see :mod:`.modes`)
``mismatch``        both ran and something differs (see :mod:`.compare`), or
                    the device returned a result where CPU raised
``error``           CPU ran, the device raised (error on the device only)
``cpu_error``       CPU raised and so did the device (excluded)
``skipped``         nothing to compare (e.g. no differentiable output)

and the case's status is the worst of its samples: ``mismatch`` over
``error_ember_only`` over ``pass``; ``unsupported_on_cpu`` when no sample ran
on CPU. Crashes and timeouts are decided by the runner, outside the process.
In the ``default`` mode a passing sample whose values differ bitwise from
CPU's is counted in the result's ``inexact`` (tolerance-only passes), and a
values mismatch records the greatest differences (``max_abs``, ``max_rel``).
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from . import modes
from .compare import Mismatch, Tolerance, compare, values_equal
from .op_traits import (
    IRREPRODUCIBLE_ON_CPU,
    SOMETIMES_RANDOM_OPS,
    _uninitialized,
    values_compared,
)
from .transform import (
    flat_tensors,
    placement_of,
    sample_involves_device,
    sample_to,
    to_device,
)

SEED = 20240601

# Set by --repro: device errors propagate with their traceback instead of
# being recorded.
DEBUG = False

SAMPLE_OUTCOMES = ("pass", "mismatch", "error", "harness_error", "cpu_error", "skipped")
MAX_FAILURES = 3
MAX_TEXT = 700


def _short(text: str, limit: int = MAX_TEXT) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _error_text(error: BaseException) -> str:
    return _short(f"{type(error).__name__}: {error}")


def _call(fn: Callable, inp: Any, args: tuple, kwargs: dict) -> Any:
    torch.manual_seed(SEED)
    return fn(inp, *args, **kwargs)


class _Outcome(Exception):
    """Ends a sample early with the given outcome."""

    def __init__(self, outcome: str, cause: str, detail: str = ""):
        super().__init__(detail or cause)
        self.outcome = outcome
        self.cause = cause
        self.detail = detail


class CaseResult:
    def __init__(self):
        self.counts = dict.fromkeys(SAMPLE_OUTCOMES, 0)
        self.failures: list[dict] = []
        self.notes: dict[str, Any] = {}
        self.sample_error: str | None = None
        # default mode: passing samples whose values are not bitwise CPU's.
        self.inexact: dict[str, Any] = {}
        # Greatest value differences over the mismatching samples.
        self.max_abs: float | None = None
        self.max_rel: float | None = None

    def add_inexact(self, notes: list[tuple[str, Any, Any]]) -> None:
        """A passing sample with values that differ bitwise (where, max_abs, max_rel)."""
        inexact = self.inexact
        inexact["samples"] = inexact.get("samples", 0) + 1
        inexact.setdefault("where", notes[0][0])
        for _, max_abs, max_rel in notes:
            inexact["max_abs"] = _max(inexact.get("max_abs"), max_abs)
            inexact["max_rel"] = _max(inexact.get("max_rel"), max_rel)

    def add(
        self,
        index: int,
        outcome: str,
        sample=None,
        cause: str = "",
        detail: str = "",
        error: Mismatch | None = None,
    ):
        self.counts[outcome] += 1
        if error is not None and error.max_abs is not None:
            self.max_abs = _max(self.max_abs, error.max_abs)
            self.max_rel = _max(self.max_rel, error.max_rel)
        same = sum(1 for f in self.failures if f["outcome"] == outcome)
        if outcome in ("mismatch", "error", "harness_error") and same < MAX_FAILURES:
            summary = ""
            if sample is not None:
                try:
                    summary = _short(sample.summary(), 400)
                except Exception:  # noqa: BLE001 - a summary is best effort
                    summary = "?"
            failure = {
                "sample": index,
                "outcome": outcome,
                "cause": cause,
                "error": _short(detail or cause),
                "input": summary,
            }
            if error is not None and error.max_abs is not None:
                failure["max_abs"], failure["max_rel"] = error.max_abs, error.max_rel
            self.failures.append(failure)

    def status(self) -> str:
        if self.counts["mismatch"]:
            return "mismatch"
        if self.counts["error"]:
            return "error_ember_only"
        if self.counts["harness_error"]:
            return "harness_error"
        if self.counts["pass"]:
            return "pass"
        return "unsupported_on_cpu"

    def to_dict(self) -> dict:
        out: dict[str, Any] = {"status": self.status(), "samples": sum(self.counts.values())}
        out["counts"] = {k: v for k, v in self.counts.items() if v}
        if self.failures:
            outcome = {"mismatch": "mismatch", "error_ember_only": "error"}.get(
                out["status"], "harness_error"
            )
            first = next((f for f in self.failures if f["outcome"] == outcome), self.failures[0])
            out["cause"] = first["cause"]
            out["error"] = first["error"]
            out["failures"] = self.failures
        elif out["status"] == "unsupported_on_cpu":
            out["error"] = self.sample_error or self.notes.pop("cpu_error", "no sample ran on CPU")
        if self.max_abs is not None:
            out["max_abs"], out["max_rel"] = self.max_abs, self.max_rel
        if self.inexact:
            out["inexact"] = dict(self.inexact)
        out.update(self.notes)
        return out


def _max(a, b):
    """The greater of two optional numbers (JSON-safe: no NaN)."""
    values = [v for v in (a, b) if v is not None and not math.isnan(v)]
    return max(values) if values else None


def _device_error(error: BaseException, context: str = "") -> _Outcome:
    if DEBUG:
        raise error
    return _Outcome("error", context + type(error).__name__, _error_text(error))


def _check_aliasing(cpu_inputs, dev_inputs, cpu_out, dev_out):
    """Outputs that are (or view) an input on CPU must be (or view) it on the device."""
    c_outs, d_outs = flat_tensors(cpu_out), flat_tensors(dev_out)
    for i, (c, d) in enumerate(zip(c_outs, d_outs, strict=False)):
        for j, (ci, di) in enumerate(zip(cpu_inputs, dev_inputs, strict=True)):
            if (c is ci) != (d is di):
                which = "is" if c is ci else "is not"
                raise Mismatch(
                    "returned object identity differs",
                    f"on CPU output {i} {which} input {j}; on the device it is the opposite",
                )
            if _same_storage(c, ci) != _same_storage(d, di):
                which = "aliases" if _same_storage(c, ci) else "does not alias"
                raise Mismatch(
                    "aliasing differs",
                    f"on CPU output {i} {which} input {j}'s storage; on the device the opposite",
                )


def _storage_ptr(t: torch.Tensor) -> int:
    try:
        if t.layout != torch.strided or t.untyped_storage().nbytes() == 0:
            return 0
        return t.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 - tensors without storage never alias
        return 0


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    pa = _storage_ptr(a)
    return pa != 0 and pa == _storage_ptr(b)


def _compare_inputs(cpu_inputs, dev_inputs, device, values):
    for j, (c, d) in enumerate(zip(cpu_inputs, dev_inputs, strict=True)):
        try:
            # Inputs stay where they were put (some deliberately on CPU).
            compare(c, d, d.device, values, where=f"input {j} after the call")
        except Mismatch as error:
            raise error.renamed("input after the call differs: " + error.cause) from None


def _run_pair(cpu_fn, cpu_args, dev_args, dev_fn=None):
    """Runs cpu_fn on the CPU copies and dev_fn (default: the same function) on
    the device copies; returns (cpu_out, dev_out)."""
    dev_fn = cpu_fn if dev_fn is None else dev_fn
    try:
        cpu_out = _call(cpu_fn, *cpu_args)
    except Exception as cpu_error:  # noqa: BLE001 - any CPU failure excludes the sample
        try:
            _call(dev_fn, *dev_args)
        except Exception:  # noqa: BLE001
            raise _Outcome("cpu_error", "", _error_text(cpu_error)) from None
        raise _Outcome(
            "mismatch",
            "device returned a result where CPU raised",
            "CPU raised " + _error_text(cpu_error),
        ) from None
    try:
        dev_out = _call(dev_fn, *dev_args)
    except Exception as error:  # noqa: BLE001
        raise _device_error(error) from None
    return cpu_out, dev_out


class _Sample:
    """A CPU-generated SampleInput plus where the device generation put its tensors."""

    __slots__ = ("placement", "sample")

    def __init__(self, sample, placement):
        self.sample = sample
        self.placement = placement

    def __getattr__(self, name):
        return getattr(self.sample, name)


def _iterate_samples(op, dtype, requires_grad, max_samples, device=None):
    torch.manual_seed(SEED)
    samples = op.sample_inputs("cpu", dtype, requires_grad=requires_grad)
    probes = None
    if device is not None:
        try:
            torch.manual_seed(SEED)
            probes = iter(op.sample_inputs(device, dtype, requires_grad=requires_grad))
        except Exception:  # noqa: BLE001 - without a probe every tensor goes to the device
            probes = None
    for index, sample in enumerate(samples):
        if max_samples is not None and index >= max_samples:
            break
        probe = None
        if probes is not None:
            try:
                probe = next(probes)
            except Exception:  # noqa: BLE001
                probes = None
        yield index, _Sample(sample, placement_of(sample, probe))


def _copy_sample(sample, device):
    cpu_args = sample_to(sample, torch.device("cpu"))
    try:
        dev_args = sample_to(sample, device, getattr(sample, "placement", None))
    except Exception as error:  # noqa: BLE001
        raise _device_error(error, "copying the sample to the device: ") from None
    return cpu_args, dev_args


def _forward_sample(op, variant, sample, device, values):
    if variant == "out":
        return _out_sample(op, sample, device, values)
    cpu_args, dev_args = _copy_sample(sample, device)
    fn = op.get_inplace() if variant == "inplace" else op.get_op()
    if not sample_involves_device(sample):
        cpu_args, dev_args = _factory_args(fn, cpu_args, device)
    cpu_inputs, dev_inputs = flat_tensors(cpu_args), flat_tensors(dev_args)
    cpu_out, dev_out = _run_pair(fn, cpu_args, dev_args)
    compare(cpu_out, dev_out, device, values)
    _check_aliasing(cpu_inputs, dev_inputs, cpu_out, dev_out)
    _compare_inputs(cpu_inputs, dev_inputs, device, values)
    if not values:
        tensors = list(zip(flat_tensors(cpu_out), flat_tensors(dev_out), strict=False))
        if not all(values_equal(c, d) for c, d in tensors):
            return "random_value_diff"
    return "pass"


def _factory_args(fn, cpu_args, device):
    """A sample with no tensor and no device argument (a factory call such
    as ``arange(5)``) would create CPU tensors on both sides, comparing CPU
    with CPU: both calls name their device instead. A function that takes no
    ``device`` runs nothing on the device, so its sample is skipped."""
    inp, args, kwargs = cpu_args
    try:
        _call(fn, inp, args, {**kwargs, "device": torch.device("cpu")})
    except TypeError as error:
        if "device" in str(error):
            raise _Outcome(
                "skipped",
                "no tensor and no device argument",
                "the call takes no device= and so never runs on the device",
            ) from None
    except Exception:  # noqa: BLE001, S110 - CPU's own failure is reported by _run_pair
        pass
    return (inp, args, {**kwargs, "device": torch.device("cpu")}), (
        inp,
        args,
        {**kwargs, "device": device},
    )


def _out_template(expected, mode):
    def make(t):
        if mode == "resize":
            # Sparse compressed tensors have at least two dimensions.
            return t.new_empty(0 if t.layout == torch.strided else (0,) * t.dim())
        return torch.zeros_like(t)

    if isinstance(expected, torch.Tensor):
        return make(expected)
    return tuple(make(t) for t in expected)


def _out_sample(op, sample, device, values):
    """out= variant: a pre-sized out and an empty out the kernel must resize."""
    cpu_args = sample_to(sample, torch.device("cpu"))
    try:
        expected = _call(op.get_op(), *cpu_args)
    except Exception as error:  # noqa: BLE001
        raise _Outcome("cpu_error", "", _error_text(error)) from None
    if not (
        isinstance(expected, torch.Tensor)
        or (
            isinstance(expected, (tuple, list))
            and expected
            and all(isinstance(t, torch.Tensor) for t in expected)
        )
    ):
        raise _Outcome("skipped", "", "the op does not return tensors")
    ran = False
    for mode in ("presized", "resize"):
        template = _out_template(expected, mode)
        cpu_args, dev_args = _copy_sample(sample, device)
        cpu_out_arg = to_device(template, torch.device("cpu"))
        try:
            dev_out_arg = to_device(template, device)
        except Exception as error:  # noqa: BLE001
            raise _device_error(error) from None
        cpu_inputs, dev_inputs = flat_tensors(cpu_args), flat_tensors(dev_args)

        def with_out(out):
            def fn(inp, *args, **kwargs):
                return op.get_op()(inp, *args, **kwargs, out=out)

            return fn

        try:
            cpu_res, dev_res = _run_pair(
                with_out(cpu_out_arg), cpu_args, dev_args, with_out(dev_out_arg)
            )
        except _Outcome as outcome:
            if outcome.outcome == "cpu_error":
                continue
            outcome.cause = f"out= ({mode}): {outcome.cause}"
            raise
        ran = True
        try:
            compare(cpu_res, dev_res, device, values, where="result")
            compare(cpu_out_arg, dev_out_arg, device, values, where="out")
            _check_aliasing(
                cpu_inputs + flat_tensors(cpu_out_arg),
                dev_inputs + flat_tensors(dev_out_arg),
                cpu_res,
                dev_res,
            )
            _compare_inputs(cpu_inputs, dev_inputs, device, values)
        except Mismatch as error:
            raise error.renamed(f"out= ({mode}): {error.cause}") from None
    if not ran:
        raise _Outcome("cpu_error", "", "out= raised on CPU")
    return "pass"


def forward_variants(op) -> list[str]:
    variants = ["op"]
    if op.get_inplace() is not None:
        variants.append("inplace")
    if op.supports_out:
        variants.append("out")
    return variants


def _run_samples(result, samples, body, progress, tolerance: Tolerance | None = None):
    """Runs ``body`` on every sample and records each outcome in ``result``;
    ``tolerance`` (default mode) collects the bitwise differences of a
    sample that passes."""
    try:
        for index, sample in samples:
            progress(index, sample)
            if tolerance is not None:
                tolerance.inexact = []
            try:
                outcome = body(sample)
            except _Outcome as error:
                result.add(index, error.outcome, sample, error.cause, error.detail)
                if error.outcome == "cpu_error" and "cpu_error" not in result.notes:
                    result.notes["cpu_error"] = error.detail
                continue
            except Mismatch as error:
                result.add(index, "mismatch", sample, error.cause, str(error), error)
                continue
            except Exception as error:  # noqa: BLE001 - a harness problem on this sample
                detail = _error_text(error) + "\n" + traceback.format_exc(limit=-3)
                cause = "harness error: " + type(error).__name__
                result.add(index, "harness_error", sample, cause, detail)
                continue
            if outcome == "random_value_diff":
                result.notes["random_value_diffs"] = result.notes.get("random_value_diffs", 0) + 1
                outcome = "pass"
            if outcome == "pass" and tolerance is not None and tolerance.inexact:
                result.add_inexact(tolerance.inexact)
            result.add(index, outcome, sample)
    except Exception as error:  # noqa: BLE001 - generating samples failed
        result.sample_error = "generating samples failed: " + _error_text(error)


def sample_values_compared(op, sample, tolerance: Tolerance | None = None):
    """How a sample's values are compared (see :mod:`.compare`): bitwise
    (True), or ``tolerance`` when given (the default mode), False (structure
    only) or "close" (not reproducible on CPU itself)."""
    if not values_compared(op):
        return False
    random = SOMETIMES_RANDOM_OPS.get(op.full_name)
    if random and random(sample):
        return False
    irreproducible = IRREPRODUCIBLE_ON_CPU.get(op.full_name)
    if irreproducible and irreproducible(sample):
        return "close"
    return True if tolerance is None else tolerance


def op_tolerance(op, dtype, device, mode: str) -> Tolerance | None:
    """The task's Tolerance in the default mode; None (bitwise) in parity."""
    if modes.check(mode) == "parity":
        return None
    return modes.op_tolerance(op, dtype, torch.device(device).type)


def run_forward(
    op,
    dtype,
    variant,
    device,
    max_samples=None,
    progress=lambda i, s: None,
    mode: str = modes.DEFAULT_MODE,
) -> dict:
    result = CaseResult()
    if not values_compared(op):
        result.notes["values_compared"] = False
    tolerance = op_tolerance(op, dtype, device, mode)

    def body(sample):
        values = sample_values_compared(op, sample, tolerance)
        outcome = _forward_sample(op, variant, sample, device, values)
        if outcome == "random_value_diff" and _uninitialized(op):
            outcome = "pass"  # uninitialized memory: nothing to note
        return outcome

    samples = _iterate_samples(op, dtype, False, max_samples, device)
    _run_samples(result, samples, body, progress, tolerance)
    return result.to_dict()


def _differentiable(outputs) -> list[torch.Tensor]:
    return [
        t
        for t in flat_tensors(outputs)
        if t.requires_grad and (t.dtype.is_floating_point or t.dtype.is_complex)
    ]


def _grad_outputs(outputs: list[torch.Tensor]) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(SEED)
    grads = []
    for t in outputs:
        g = torch.randn(t.shape, generator=generator, dtype=torch.float64)
        grads.append(g.to(t.dtype) if not t.dtype.is_complex else (g * (1 + 1j)).to(t.dtype))
    return grads


def _backward(outputs, leaves):
    """Gradients of ``sum(outputs * grad_outputs)`` with respect to the leaves."""
    outs = _differentiable(outputs)
    if not outs:
        return None
    grads = _grad_outputs(outs)
    grads = [g.to(o.device) for g, o in zip(grads, outs, strict=True)]
    return torch.autograd.grad(outs, leaves, grads, allow_unused=True)


def _grad_pair(cpu_outputs, dev_outputs, cpu_leaves, dev_leaves):
    try:
        cpu_grads = _backward(cpu_outputs, cpu_leaves)
    except Exception as cpu_error:  # noqa: BLE001
        raise _Outcome("cpu_error", "", "backward: " + _error_text(cpu_error)) from None
    if cpu_grads is None:
        raise _Outcome("skipped", "", "no differentiable output")
    try:
        dev_grads = _backward(dev_outputs, dev_leaves)
    except Exception as error:  # noqa: BLE001
        raise _device_error(error, "backward: ") from None
    if dev_grads is None:
        raise Mismatch("backward: no differentiable output on the device")
    return cpu_grads, dev_grads


def _backward_sample(op, sample, device, tolerance: Tolerance | None = None):
    values = sample_values_compared(op, sample, tolerance)
    cpu_args, dev_args = _copy_sample(sample, device)
    cpu_leaves = [t for t in flat_tensors(cpu_args) if t.requires_grad]
    dev_leaves = [t for t in flat_tensors(dev_args) if t.requires_grad]
    if not cpu_leaves:
        raise _Outcome("skipped", "", "no input requires grad")
    cpu_out, dev_out = _run_pair(op.get_op(), cpu_args, dev_args)
    try:
        cpu_out = sample.output_process_fn_grad(cpu_out)
    except Exception as error:  # noqa: BLE001
        raise _Outcome("cpu_error", "", _error_text(error)) from None
    try:
        dev_out = sample.output_process_fn_grad(dev_out)
    except Exception as error:  # noqa: BLE001
        raise _device_error(error) from None
    cpu_grads, dev_grads = _grad_pair(cpu_out, dev_out, cpu_leaves, dev_leaves)
    for index, (c, d) in enumerate(zip(cpu_grads, dev_grads, strict=True)):
        if c is None or d is None:
            if (c is None) != (d is None):
                raise Mismatch("gradient presence differs", f"input {index}")
            continue
        try:
            compare(c, d, device, values, where=f"grad of input {index}")
        except Mismatch as error:
            raise error.renamed("gradient " + error.cause) from None
    return "pass"


def run_backward(
    op,
    dtype,
    device,
    max_samples=None,
    progress=lambda i, s: None,
    mode: str = modes.DEFAULT_MODE,
) -> dict:
    result = CaseResult()
    tolerance = op_tolerance(op, dtype, device, mode)
    samples = _iterate_samples(op, dtype, True, max_samples, device)

    def body(sample):
        return _backward_sample(op, sample, device, tolerance)

    _run_samples(result, samples, body, progress, tolerance)
    return result.to_dict()


def timed(fn, *args, **kwargs) -> dict:
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    out["seconds"] = round(time.perf_counter() - start, 3)
    return out
