"""Guard reductions for frozen inference models, verified and measured.

``optimize(model, example_inputs)`` compiles ``model`` twice on the example
inputs, each time through a wrapper function with a code object of its own
(so neither compile shares Dynamo cache entries with other ``torch.compile``
calls of the same model class):

* *before*: plain ``torch.compile`` (all guards);
* *after*: the reductions that are safe for a model nobody modifies after
  compiling (frozen inference):

  - ``guard_filter_fn=torch.compiler.skip_guard_on_all_nn_modules_unsafe``:
    drops the guards on nn.Modules, their attributes, submodules, parameters
    and buffers. Guards on the inputs (shapes, dtypes, devices, strides), on
    globals and on global state (grad mode, autocast...) stay.
  - ``torch._dynamo.config.install_free_tensors=True`` while compiling
    (except for the ``eager``/``aot_eager`` backends, see ``free_tensors``):
    parameters and buffers become attributes of the graph instead of values
    looked up on the module and passed in at every call, so skipping their
    guards does not leave the compiled code reading them unguarded.

It checks that the optimized outputs are bitwise equal to the plain compiled
ones on the example inputs (raising otherwise), measures guard time per call
for both with the profiler, and compares the whole call before and after,
interleaved over rounds (:mod:`~torch_ember.guards.compare`).

What "frozen" means: after ``optimize`` the model's structure, attributes and
parameters are not reassigned (in-place updates of parameter values, e.g.
``load_state_dict``, are seen because the graph holds the same tensors, but a
new submodule, a new float attribute or a new Parameter object is not).
"""

from __future__ import annotations

import dataclasses
import itertools
import types
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch._dynamo
from torch.utils._pytree import tree_flatten

from .compare import CallComparison, compare_calls
from .profiler import GuardProfile, Profiler

_counter = itertools.count()

MODES = ("inference",)

# Backends that run the FX graph in Python: there installed free tensors are
# nn.Module attribute reads on every call (measured: ~45 us more per call on
# benchmarks/guards.py's model), so optimize() does not install them.
_PYTHON_GRAPH_BACKENDS = ("eager", "aot_eager")


@dataclasses.dataclass
class OptimizeResult:
    """Guard cost before and after :func:`optimize`, and the output check."""

    mode: str
    backend: str
    reductions: list[str]
    before: GuardProfile
    after: GuardProfile
    outputs_equal: bool
    max_abs_diff_vs_eager: float | None
    # The plain torch.compile of the same model (all guards), for A/B runs.
    baseline: Callable[..., Any] | None = dataclasses.field(default=None, repr=False)
    # Whole call before/after, interleaved over rounds (None: rounds=0).
    whole_call: CallComparison | None = None

    @property
    def guard_us_before(self) -> float:
        return self.before.guard_us

    @property
    def guard_us_after(self) -> float:
        return self.after.guard_us

    @property
    def guard_cut(self) -> float:
        """Fraction of guard time per call removed (0.9 = 90% less)."""
        if self.guard_us_before <= 0:
            return 0.0
        return 1.0 - self.guard_us_after / self.guard_us_before

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "backend": self.backend,
            "reductions": self.reductions,
            "guard_us_before": round(self.guard_us_before, 4),
            "guard_us_after": round(self.guard_us_after, 4),
            "guard_cut": round(self.guard_cut, 4),
            "guard_count_before": self.before.guard_count,
            "guard_count_after": self.after.guard_count,
            "call_us_before": self.before.call_us,
            "call_us_after": self.after.call_us,
            "outputs_equal": self.outputs_equal,
            "max_abs_diff_vs_eager": self.max_abs_diff_vs_eager,
            "whole_call": None if self.whole_call is None else self.whole_call.to_dict(),
        }

    def __str__(self) -> str:
        b, a = self.before, self.after
        lines = [
            f"guards optimize(mode={self.mode!r}, backend={self.backend!r})",
            f"  guards per call : {b.guard_count} -> {a.guard_count}",
            (
                f"  guard time/call : {b.guard_us:.3f} us -> {a.guard_us:.3f} us"
                f"  ({100 * self.guard_cut:.1f}% less)"
            ),
        ]
        if self.whole_call is not None:
            lines.append(f"  whole call      : {self.whole_call.summary()}")
        lines.append(f"  outputs bitwise equal to plain torch.compile: {self.outputs_equal}")
        if self.max_abs_diff_vs_eager is not None:
            lines.append(f"  max |difference| to eager: {self.max_abs_diff_vs_eager:.3g}")
        lines.append("  applied: " + "; ".join(self.reductions))
        return "\n".join(lines)


def _own_code_wrapper(model: Callable[..., Any], label: str) -> Callable[..., Any]:
    """``lambda *a, **k: model(*a, **k)`` with a code object used by no one
    else, so that its Dynamo cache entries are its own."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return model(*args, **kwargs)

    name = f"{label}_{next(_counter)}"
    code = call.__code__.replace(co_name=name, co_qualname=name)
    fn = types.FunctionType(code, call.__globals__, name, None, call.__closure__)
    fn.__wrapped_model__ = model  # type: ignore[attr-defined]
    return fn


def _leaves_equal(a: Any, b: Any) -> bool:
    flat_a, spec_a = tree_flatten(a)
    flat_b, spec_b = tree_flatten(b)
    if spec_a != spec_b:
        return False
    for x, y in zip(flat_a, flat_b):
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor)):
                return False
            if x.dtype != y.dtype or x.shape != y.shape or x.device != y.device:
                return False
            if not torch.equal(x.cpu(), y.cpu()):
                # NaNs in the same places are equal for this purpose.
                xc, yc = x.cpu(), y.cpu()
                if not (xc.is_floating_point() and torch.equal(xc.isnan(), yc.isnan())):
                    return False
                if not torch.equal(xc.nan_to_num(0.0), yc.nan_to_num(0.0)):
                    return False
        elif x != y:
            return False
    return True


def _max_abs_diff(a: Any, b: Any) -> float | None:
    flat_a, _ = tree_flatten(a)
    flat_b, _ = tree_flatten(b)
    worst = 0.0
    for x, y in zip(flat_a, flat_b):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape:
                return None
            if x.numel() and (x.is_floating_point() or x.is_complex()):
                worst = max(worst, (x.cpu() - y.cpu()).abs().max().item())
    return worst


def optimize(
    model: Callable[..., Any],
    example_inputs: Sequence[Any] | None = None,
    *,
    mode: str = "inference",
    example_kwargs: dict[str, Any] | None = None,
    backend: Any = "inductor",
    dynamic: bool | None = None,
    free_tensors: bool | None = None,
    profiler: Profiler | None = None,
    rounds: int = 15,
) -> Callable[..., Any]:
    """Compiles ``model`` with the guard reductions that are safe for ``mode``.

    Returns the compiled callable (call it like ``model``); its attribute
    ``guard_report`` is an :class:`OptimizeResult` with guard time and count
    per call before and after, and the output check. Raises ``RuntimeError``
    if the optimized outputs differ from plain ``torch.compile`` outputs on
    the example inputs.

    ``example_inputs`` (positional arguments of one typical call) and
    ``example_kwargs`` are required: the reductions are verified and measured
    on them. ``backend``/``dynamic`` are passed to ``torch.compile``; guards do
    not depend on the backend, so ``"eager"`` or ``"aot_eager"`` work for any
    device. ``free_tensors``: install free tensors while compiling (default:
    yes, except for the backends that run the graph op by op in Python,
    ``"eager"`` and ``"aot_eager"``, where reading the installed tensors as
    graph-module attributes costs more per call than it saves).
    ``profiler`` measures the guards before and after (default:
    ``Profiler(budget=16, rounds=0)``). ``rounds``: interleaved rounds of the
    whole-call comparison (:func:`~torch_ember.guards.compare_calls`; 0 to
    skip it), reported as medians, spreads and "no measurable change" when
    the confidence interval of the difference covers zero.
    """
    if mode not in MODES:
        raise ValueError(f"optimize: mode must be one of {MODES}, got {mode!r}")
    if example_inputs is None:
        raise TypeError("optimize: example_inputs are required (the change is verified on them)")
    args = tuple(example_inputs)
    kwargs = dict(example_kwargs or {})
    if isinstance(model, torch.nn.Module) and model.training:
        warnings.warn(
            "optimize(mode='inference'): the model is in training mode; call model.eval() "
            "first so that dropout/batch-norm behave as in inference",
            stacklevel=2,
        )

    eager_out = model(*args, **kwargs)
    profiler = profiler or Profiler(budget=16, rounds=0)

    plain = torch.compile(
        _own_code_wrapper(model, "ember_guards_plain"), backend=backend, dynamic=dynamic
    )
    plain_out = plain(*args, **kwargs)
    before = profiler.profile(plain, *args, **kwargs)

    if free_tensors is None:
        free_tensors = not (isinstance(backend, str) and backend in _PYTHON_GRAPH_BACKENDS)
    reductions = ["guard_filter_fn=torch.compiler.skip_guard_on_all_nn_modules_unsafe"]
    if free_tensors:
        reductions.append("torch._dynamo.config.install_free_tensors=True (while compiling)")
    fast = torch.compile(
        _own_code_wrapper(model, "ember_guards_frozen"),
        backend=backend,
        dynamic=dynamic,
        options={"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe},
    )
    with torch._dynamo.config.patch(install_free_tensors=free_tensors):
        fast_out = fast(*args, **kwargs)
    after = profiler.profile(fast, *args, **kwargs)

    whole_call = None
    if rounds > 0:
        whole_call = compare_calls(
            lambda: plain(*args, **kwargs), lambda: fast(*args, **kwargs), rounds=rounds
        )
    equal = _leaves_equal(plain_out, fast_out)
    result = OptimizeResult(
        mode=mode,
        backend=backend if isinstance(backend, str) else getattr(backend, "__name__", "custom"),
        reductions=reductions,
        before=before,
        after=after,
        outputs_equal=equal,
        max_abs_diff_vs_eager=_max_abs_diff(eager_out, fast_out),
        baseline=plain,
        whole_call=whole_call,
    )
    if not equal:
        raise RuntimeError(
            "optimize: outputs with reduced guards differ from plain torch.compile on the "
            f"example inputs; not applying.\n{result}"
        )
    fast.guard_report = result  # type: ignore[attr-defined]
    return fast
