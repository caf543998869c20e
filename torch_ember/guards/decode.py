"""Guards in token-by-token generation (``model.generate()`` with a KV cache).

A compiled decoder runs one compiled forward per new token, so its guards are
paid once per token: on a small model they are a visible share of the
per-token time. The usual recipe compiles the forward and lets ``generate()``
drive it::

    model.forward = torch.compile(model.forward)
    report = guards.profile_generate(model, input_ids, max_new_tokens=32)
    print(report)            # guard time per token, as a share of per-token time

and :func:`optimize_generate` compiles the forward with the nn.Module guards
skipped (as :func:`~torch_ember.guards.optimize` does for one call), checks
that the generated tokens are identical to a plain ``torch.compile`` and to
eager, and compares the time per token before and after, interleaved.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch._dynamo

from . import advice as _advice
from .compare import CallComparison, compare_calls
from .optimize import _own_code_wrapper
from .profiler import GuardProfile, Profiler, _empty_check_us, collect
from .recorder import RecompileLog


def _generate(model: Any, input_ids: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(input_ids, **kwargs)


def _generate_kwargs(max_new_tokens: int, extra: dict[str, Any]) -> dict[str, Any]:
    # Greedy and exactly max_new_tokens: the token count (the divisor of every
    # per-token figure) and the tokens themselves must not vary between runs.
    kwargs = {"max_new_tokens": max_new_tokens, "min_new_tokens": max_new_tokens}
    kwargs["do_sample"] = False
    kwargs.update(extra)
    return kwargs


def profile_generate(
    model: Any,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int = 16,
    profiler: Profiler | None = None,
    rounds: int = 5,
    warmup: int = 2,
    **generate_kwargs: Any,
) -> GuardProfile:
    """Guard profile of ``model.generate(input_ids, ...)`` whose forward is
    compiled (``model.forward = torch.compile(model.forward)``).

    ``warmup`` generate() calls compile the prefill and decode graphs (the
    KV cache length recompiles once before it turns dynamic); one call then
    runs under the profiler's frame hook, which times every entry's guards
    at its first call; ``rounds`` plain calls give the time of one
    generate() (median). The report gives guard time per new token and its
    share of the time per token."""
    profiler = profiler or Profiler(budget=16)
    kwargs = _generate_kwargs(max_new_tokens, generate_kwargs)
    wall0 = time.perf_counter()
    with RecompileLog() as log:
        for _ in range(warmup):
            _generate(model, input_ids, kwargs)
        hook = profiler.hook()
        with hook:
            out = _generate(model, input_ids, kwargs)
    tokens = int(out.shape[-1] - input_ids.shape[-1])
    times = []
    for _ in range(max(1, rounds)):
        t0 = time.perf_counter_ns()
        _generate(model, input_ids, kwargs)
        times.append((time.perf_counter_ns() - t0) / 1000.0)
    codes = collect(hook, log, only_seen=True)
    result = GuardProfile(
        mode="generate",
        codes=codes,
        call_us=None,
        overhead={"empty_guard_check_us": _empty_check_us(codes), "profiler_wall_s": 0.0},
        target=f"{type(model).__name__}.generate(max_new_tokens={max_new_tokens})",
        tokens=tokens,
        generate_us=statistics.median(times),
    )
    result.advice = _advice.advise(result)
    result.overhead["profiler_wall_s"] = time.perf_counter() - wall0
    return result


def _decode_entry_guards(profile: GuardProfile) -> int:
    """Guards of the entry that ran most often: the decode step's."""
    busiest = max(profile.hit_entries, key=lambda e: e.calls, default=None)
    return 0 if busiest is None else busiest.guard_count


@dataclasses.dataclass
class GenerateOptimizeResult:
    """Guard cost per token before/after :func:`optimize_generate`."""

    backend: str
    reductions: list[str]
    before: GuardProfile
    after: GuardProfile
    per_token: CallComparison  # time per token, plain vs optimized, interleaved
    tokens_equal: bool  # optimized == plain torch.compile
    tokens_equal_eager: bool  # optimized == eager generate()
    plain_forward: Callable[..., Any] | None = dataclasses.field(default=None, repr=False)
    fast_forward: Callable[..., Any] | None = dataclasses.field(default=None, repr=False)

    @property
    def guard_us_per_token_before(self) -> float:
        return self.before.guard_us_per_token or 0.0

    @property
    def guard_us_per_token_after(self) -> float:
        return self.after.guard_us_per_token or 0.0

    @property
    def guard_cut(self) -> float:
        before = self.guard_us_per_token_before
        return 1.0 - self.guard_us_per_token_after / before if before > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "reductions": self.reductions,
            "tokens": self.before.tokens,
            "decode_guard_count_before": _decode_entry_guards(self.before),
            "decode_guard_count_after": _decode_entry_guards(self.after),
            "guard_us_per_token_before": round(self.guard_us_per_token_before, 4),
            "guard_us_per_token_after": round(self.guard_us_per_token_after, 4),
            "guard_share_before": self.before.guard_share,
            "guard_share_after": self.after.guard_share,
            "guard_cut": round(self.guard_cut, 4),
            "per_token": self.per_token.to_dict(),
            "tokens_equal": self.tokens_equal,
            "tokens_equal_eager": self.tokens_equal_eager,
        }

    def __str__(self) -> str:
        b, a = self.before, self.after
        return "\n".join(
            [
                f"guards optimize_generate(backend={self.backend!r}), {b.tokens} new tokens",
                (
                    f"  guards per decode step: {_decode_entry_guards(b)} ->"
                    f" {_decode_entry_guards(a)}"
                ),
                (
                    f"  guard time/token   : {self.guard_us_per_token_before:.3f} us ->"
                    f" {self.guard_us_per_token_after:.3f} us ({100 * self.guard_cut:.1f}% less;"
                    f" share of a token {100 * (b.guard_share or 0):.2f}% ->"
                    f" {100 * (a.guard_share or 0):.2f}%)"
                ),
                f"  time per token     : {self.per_token.summary()}",
                (
                    f"  tokens identical to plain torch.compile: {self.tokens_equal},"
                    f" to eager: {self.tokens_equal_eager}"
                ),
                "  applied: " + "; ".join(self.reductions),
            ]
        )


def optimize_generate(
    model: Any,
    input_ids: torch.Tensor,
    *,
    max_new_tokens: int = 16,
    backend: Any = "inductor",
    free_tensors: bool | None = None,
    rounds: int = 9,
    profiler: Profiler | None = None,
    **generate_kwargs: Any,
) -> GenerateOptimizeResult:
    """Compiles ``model.forward`` for generation with the nn.Module guards
    skipped (frozen inference, see :func:`~torch_ember.guards.optimize`),
    verifies the generated tokens and measures guard time and time per token
    before (plain ``torch.compile``) and after.

    ``model`` is a transformers ``GenerationMixin`` model in eval mode whose
    forward is *not* compiled yet. On return ``model.forward`` is the
    optimized compiled forward (the plain one is ``result.plain_forward``).
    Raises ``RuntimeError`` if the tokens differ from plain ``torch.compile``.
    """
    if "forward" in vars(model):
        raise ValueError("optimize_generate: model.forward is already replaced; pass the model")
    kwargs = _generate_kwargs(max_new_tokens, generate_kwargs)
    eager_tokens = _generate(model, input_ids, kwargs)
    forward = model.forward  # the bound method of the class
    profiler = profiler or Profiler(budget=8, rounds=0)

    plain = torch.compile(_own_code_wrapper(forward, "ember_guards_plain"), backend=backend)
    model.forward = plain
    plain_tokens = _generate(model, input_ids, kwargs)
    before = profile_generate(
        model, input_ids, max_new_tokens=max_new_tokens, profiler=profiler, **generate_kwargs
    )

    if free_tensors is None:
        free_tensors = not (isinstance(backend, str) and backend in ("eager", "aot_eager"))
    reductions = ["guard_filter_fn=torch.compiler.skip_guard_on_all_nn_modules_unsafe"]
    if free_tensors:
        reductions.append("torch._dynamo.config.install_free_tensors=True (while compiling)")
    fast = torch.compile(
        _own_code_wrapper(forward, "ember_guards_frozen"),
        backend=backend,
        options={"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe},
    )
    model.forward = fast
    # Prefill, first decode step and the step where the cache length turns
    # dynamic all compile here, with free tensors installed.
    with torch._dynamo.config.patch(install_free_tensors=free_tensors):
        for _ in range(2):
            fast_tokens = _generate(model, input_ids, kwargs)
    after = profile_generate(
        model, input_ids, max_new_tokens=max_new_tokens, profiler=profiler, **generate_kwargs
    )

    def run_with(compiled: Callable[..., Any]) -> Callable[[], Any]:
        def run() -> Any:
            model.forward = compiled
            return _generate(model, input_ids, kwargs)

        return run

    per_token = compare_calls(
        run_with(plain),
        run_with(fast),
        rounds=rounds,
        batch_s=0.05,
        per=max(1, before.tokens or 1),
        unit="token",
    )
    model.forward = fast
    result = GenerateOptimizeResult(
        backend=backend if isinstance(backend, str) else getattr(backend, "__name__", "custom"),
        reductions=reductions,
        before=before,
        after=after,
        per_token=per_token,
        tokens_equal=torch.equal(plain_tokens, fast_tokens),
        tokens_equal_eager=torch.equal(eager_tokens, fast_tokens),
        plain_forward=plain,
        fast_forward=fast,
    )
    if not result.tokens_equal:
        del model.forward
        raise RuntimeError(
            "optimize_generate: tokens with reduced guards differ from plain torch.compile;"
            f" not applying.\n{result}"
        )
    return result
