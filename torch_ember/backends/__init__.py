"""``torch.backends.ember``: how ops run on ember, in the style of
``torch.backends.cudnn`` / ``torch.backends.mkldnn``.

By default ember runs its fastest correct kernels (prepacked GEMM, skinny
GEMM that streams packed weights, ...): results agree with CPU within the
tolerances PyTorch's device tests use and are reproducible run to run.
``cpu_parity = True`` (or ``EMBER_CPU_PARITY=1``) sends every op to CPU's
own kernel instead, bitwise equal to CPU, at its call (``async_execution``
applies again once parity is off).

Every switch changes what runs (the tests in ``tests/test_backends_*.py``
show each effect)::

    torch.backends.ember.cpu_parity = True          # CPU's kernels, bitwise

    torch.backends.ember.deterministic = True       # bitwise across thread counts
    torch.backends.ember.fuse_elementwise = False   # one pass per elementwise op
    torch.backends.ember.benchmark = True           # autotune conv / matmul
    torch.backends.ember.matmul.fp32_precision = "bf16"
    torch.backends.ember.preferred_blas_library("onednn")
    torch.backends.ember.fallback = "error"         # copying fallbacks raise
    with torch.backends.ember.verbose(1): ...       # log every op
    with torch.backends.ember.flags(deterministic=True, benchmark=False): ...

Values live in the C++ flag store (``csrc/flags/BackendFlags.cpp``) that the
kernels read; this module validates names and values before anything is set.
"""

from __future__ import annotations

import contextlib
import difflib
import sys
import types
from collections.abc import Iterator
from typing import Any, Self

import torch

from torch_ember import _C
from torch_ember.backends._inspect import (
    capabilities,
    get_cpu_capability,
    is_available,
    is_built,
    version,
)

_flags = _C.flags

FP32_PRECISIONS = ("ieee", "bf16", "bf16x3", "none")
# bf16x3 needs an fp32 result per bf16 product, which ATen's convolutions
# do not offer (csrc/flags/BackendFlags.cpp).
CONV_FP32_PRECISIONS = ("ieee", "bf16", "none")
FALLBACK_POLICIES = ("allow", "warn", "error")
BLAS_LIBRARIES = ("default", "mkl", "onednn")


def _check_choice(what: str, value: Any, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{what} must be one of {', '.join(map(repr, allowed))}; got {value!r}")
    return value


def _check_bool(what: str, value: Any) -> bool:
    if not isinstance(value, bool):
        # ValueError, not TypeError: the contract for any bad value.
        raise ValueError(f"{what} must be True or False; got {value!r}")  # noqa: TRY004
    return value


def _no_such_attribute(owner: str, name: str, known: list[str]) -> AttributeError:
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return AttributeError(f"{owner} has no attribute '{name}'{hint}")


class _Fp32Precision:
    """``torch.backends.ember.matmul`` / ``.conv``: ``fp32_precision`` in
    {"ieee", "bf16", "bf16x3" (matmul only), "none"}. For matmul "none" follows
    ``torch.set_float32_matmul_precision`` ("highest" -> ieee, "medium" ->
    bf16, "high" -> bf16x3 where that beats ieee on this CPU, else ieee); for
    conv it follows what CPU's convolutions follow,
    ``torch.backends.mkldnn.conv.fp32_precision`` (its "none" resolved through
    ``torch.backends.mkldnn.fp32_precision`` and ``torch.backends.fp32_precision``):
    "bf16" -> bf16, anything else ieee. bf16 only where the CPU has bf16
    arithmetic."""

    _NAMES = ("fp32_precision", "effective_fp32_precision")

    def __init__(self, op: str) -> None:
        object.__setattr__(self, "_op", op)

    def _getter(self, kind: str):
        return getattr(_flags, f"{kind}{self._op}_fp32_precision")

    @property
    def fp32_precision(self) -> str:
        return self._getter("")()

    @property
    def effective_fp32_precision(self) -> str:
        """The precision kernels use right now (after following torch's)."""
        return self._getter("effective_")()

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "effective_fp32_precision":
            raise AttributeError(
                f"torch.backends.ember.{self._op}.effective_fp32_precision is read-only; "
                "set fp32_precision"
            )
        if name != "fp32_precision":
            raise _no_such_attribute(f"torch.backends.ember.{self._op}", name, list(self._NAMES))
        value = _check_choice(
            f"torch.backends.ember.{self._op}.fp32_precision", value, FP32_PRECISIONS
        )
        getattr(_flags, f"set_{self._op}_fp32_precision")(value)

    def __getattr__(self, name: str) -> Any:
        raise _no_such_attribute(f"torch.backends.ember.{self._op}", name, list(self._NAMES))

    def __repr__(self) -> str:
        return f"<torch.backends.ember.{self._op} fp32_precision={self.fp32_precision!r}>"


class verbose:
    """Logs ops executed on ember to stderr. Level 1: every op with shapes,
    dtypes, execution path (native / delegated / copied) and time in
    microseconds; level 2 adds allocator events; 0 is off (no cost).

    Applies immediately, so ``torch.backends.ember.verbose(1)`` alone turns
    logging on; used with ``with`` it restores the previous level on exit.
    ``EMBER_VERBOSE=<level>`` sets the level at start-up.
    """

    def __init__(self, level: int) -> None:
        if isinstance(level, bool) or not isinstance(level, int) or level not in (0, 1, 2):
            raise ValueError(f"verbose level must be 0, 1 or 2; got {level!r}")
        self._previous = _flags.verbose()
        _flags.set_verbose(level)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        _flags.set_verbose(self._previous)


def get_verbose() -> int:
    return _flags.verbose()


def preferred_blas_library(backend: str | None = None) -> str:
    """Gets, or sets and returns, the GEMM library of ember's matmul family.

    "default" is ATen's CPU choice (bitwise equal to CPU), "mkl" and "onednn"
    force that library; only libraries present in this build are accepted.
    """
    if backend is not None:
        present = available_blas_libraries()
        if backend not in present:
            raise ValueError(
                f"BLAS library must be one of {', '.join(map(repr, present))}; got {backend!r}"
            )
        _flags.set_blas_library(backend)
    return _flags.blas_library()


def available_blas_libraries() -> tuple[str, ...]:
    present = ["default"]
    if torch.backends.mkl.is_available():
        present.append("mkl")
    if torch.backends.mkldnn.is_available():
        present.append("onednn")
    return tuple(present)


# Attention: the same process-wide switches as torch.backends.cuda's, which
# ember's fused-SDPA choice reads (csrc/ops/kernels/Attention.cpp).
def flash_sdp_enabled() -> bool:
    return torch._C._get_flash_sdp_enabled()


def enable_flash_sdp(enabled: bool) -> None:
    torch._C._set_sdp_use_flash(_check_bool("enable_flash_sdp", enabled))


def math_sdp_enabled() -> bool:
    return torch._C._get_math_sdp_enabled()


def enable_math_sdp(enabled: bool) -> None:
    torch._C._set_sdp_use_math(_check_bool("enable_math_sdp", enabled))


def benchmark_cache_info() -> dict[str, Any]:
    """Autotuning cache: ``{"entries": n, "limit": k, "choices": [...]}`` with
    one ``{"op", "signature", "algorithm", "timings_us"}`` per tuned call."""
    return _C.benchmark_cache_info()


def packed_weights_info() -> dict[str, int | str]:
    """The prepacked-weight cache of the default GEMM route:
    ``{"entries", "bytes", "limit", "hits", "packs", "invalidations",
    "evictions", "admissions_refused"}`` (counts;
    ``admissions_refused``: packs not made because the budget was full of
    packs used as often, docs/backends.md) and ``"library"``:
    whose packed GEMM runs fp32 GEMMs of more than 16 rows on this CPU
    (``"mkl"`` on Intel CPUs, ``"panels"`` -- ember's own panel kernel --
    on other CPUs with AVX-512, ``"onednn"`` elsewhere). ``"bytes"`` is what
    the byte budget (``packed_weights_limit``) counts: the packed data (MKL's
    packs also reserve room they never write, which memory statistics count).
    A GEMM operand that comes
    back unchanged (a weight) is packed on its second use; packs live in ember
    memory (counted in ``torch.ember.memory_stats()``, key
    ``packed_weight_bytes``) and go with ``torch.ember.empty_cache()``, a write
    to the weight or its release (writes to inference tensors, which have no
    version counter, included: ember's write paths report them)."""
    return dict(_C.pack_cache_info())


# Counts stored in C++ as int64: larger values are out of range, not a type
# error from the binding.
_INT64_MAX = 2**63 - 1


def _check_count(what: str, value: Any, unit: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _INT64_MAX:
        raise ValueError(f"{what} must be an int in [0, 2**63 - 1] ({unit}); got {value!r}")
    return value


def _set_packed_weights_limit(value: Any) -> None:
    _C.set_pack_cache_limit(_check_count("packed_weights_limit", value, "bytes"))


# name -> (getter, setter-with-validation)
_PROPERTIES: dict[str, tuple[Any, Any]] = {
    "async_execution": (
        _flags.async_execution,
        lambda v: _flags.set_async_execution(_check_bool("async_execution", v)),
    ),
    "fuse_elementwise": (
        _flags.fuse_elementwise,
        lambda v: _flags.set_fuse_elementwise(_check_bool("fuse_elementwise", v)),
    ),
    "cpu_parity": (
        _flags.cpu_parity,
        lambda v: _flags.set_cpu_parity(_check_bool("cpu_parity", v)),
    ),
    "deterministic": (
        _flags.deterministic,
        lambda v: _flags.set_deterministic(_check_bool("deterministic", v)),
    ),
    "benchmark": (
        _flags.benchmark,
        lambda v: _flags.set_benchmark(_check_bool("benchmark", v)),
    ),
    "benchmark_limit": (_flags.benchmark_limit, None),
    "fallback": (
        _flags.fallback,
        lambda v: _flags.set_fallback(_check_choice("fallback", v, FALLBACK_POLICIES)),
    ),
}


def _set_benchmark_limit(value: Any) -> None:
    _flags.set_benchmark_limit(_check_count("benchmark_limit", value, "0 = unbounded"))


_PROPERTIES["benchmark_limit"] = (_flags.benchmark_limit, _set_benchmark_limit)
_PROPERTIES["packed_weights_limit"] = (
    lambda: _C.pack_cache_info()["limit"],
    _set_packed_weights_limit,
)

# flags() keywords beyond the plain properties.
_FLAG_KEYWORDS = {
    "matmul_fp32_precision": (
        lambda: matmul.fp32_precision,
        lambda v: setattr(matmul, "fp32_precision", v),
    ),
    "conv_fp32_precision": (
        lambda: conv.fp32_precision,
        lambda v: setattr(conv, "fp32_precision", v),
    ),
    "blas_library": (preferred_blas_library, preferred_blas_library),
    "verbose": (get_verbose, lambda v: verbose(v)),
    "flash_sdp": (flash_sdp_enabled, enable_flash_sdp),
    "math_sdp": (math_sdp_enabled, enable_math_sdp),
}


def _switches() -> dict[str, tuple[Any, Any]]:
    return {**_PROPERTIES, **_FLAG_KEYWORDS}


def current_flags() -> dict[str, Any]:
    """Every switch's value, keyed by its flags() keyword."""
    return {name: getter() for name, (getter, _) in _switches().items()}


def set_flags(**settings: Any) -> dict[str, Any]:
    """Sets several switches at once and returns their previous values (as
    flags() keywords, so ``set_flags(**previous)`` undoes it). Every name is
    checked first and a bad value undoes what was already set: nothing is
    ever half-applied."""
    known = _switches()
    for name in settings:
        if name not in known:
            raise _no_such_attribute("torch.backends.ember.flags()", name, sorted(known))
    previous = {name: known[name][0]() for name in settings}
    applied: list[str] = []
    try:
        for name, value in settings.items():
            known[name][1](value)
            applied.append(name)
    except Exception:
        for name in reversed(applied):
            known[name][1](previous[name])
        raise
    return previous


@contextlib.contextmanager
def flags(**settings: Any) -> Iterator[None]:
    """Sets several switches for the body and restores all of them on exit,
    also when the body raises. Keywords: async_execution, cpu_parity, deterministic, benchmark,
    benchmark_limit, packed_weights_limit, fallback, matmul_fp32_precision, conv_fp32_precision,
    blas_library, verbose, flash_sdp, math_sdp.

    Every name and value is validated before anything changes, so a bad
    keyword leaves all switches as they were.
    """
    previous = set_flags(**settings)
    try:
        yield
    finally:
        set_flags(**previous)


# How to change what an assignment to a protected name would have replaced.
_ASSIGNMENT_HINTS = {
    "matmul": "set torch.backends.ember.matmul.fp32_precision",
    "conv": "set torch.backends.ember.conv.fp32_precision",
    "verbose": "call torch.backends.ember.verbose(level)",
    "flags": "use torch.backends.ember.flags(...) or set_flags(...)",
    "preferred_blas_library": "call torch.backends.ember.preferred_blas_library(name)",
}


class _EmberBackendModule(types.ModuleType):
    """Module type whose switches are validated properties. Only those
    (``_PROPERTIES``) are assignable; every other name of the module --
    ``matmul``, ``verbose``, ``flags``, ``version``, ... -- is protected from
    assignment and deletion (replacing one would break the flag API), and an
    unknown name raises AttributeError with the closest known name."""

    def __getattr__(self, name: str) -> Any:
        if name in _PROPERTIES:
            return _PROPERTIES[name][0]()
        raise _no_such_attribute("torch.backends.ember", name, self._known())

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _PROPERTIES:
            _PROPERTIES[name][1](value)
            return
        if name.startswith("__") and name.endswith("__"):
            # Module machinery (importlib sets __spec__, __loader__, ...).
            super().__setattr__(name, value)
            return
        if name in self.__dict__:
            raise self._protected(name, "assigned")
        raise _no_such_attribute("torch.backends.ember", name, self._known())

    def __delattr__(self, name: str) -> None:
        if name in _PROPERTIES or name in self.__dict__:
            raise self._protected(name, "deleted")
        raise _no_such_attribute("torch.backends.ember", name, self._known())

    @staticmethod
    def _protected(name: str, what: str) -> AttributeError:
        hint = _ASSIGNMENT_HINTS.get(name)
        settable = ", ".join(sorted(_PROPERTIES))
        how = hint if hint is not None else f"the assignable switches are {settable}"
        return AttributeError(f"torch.backends.ember.{name} cannot be {what}; {how}")

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(_PROPERTIES))

    def _known(self) -> list[str]:
        return [n for n in self.__dict__ if not n.startswith("_")] + list(_PROPERTIES)


matmul = _Fp32Precision("matmul")
conv = _Fp32Precision("conv")

__all__ = [
    "available_blas_libraries",
    "benchmark_cache_info",
    "capabilities",
    "conv",
    "current_flags",
    "enable_flash_sdp",
    "enable_math_sdp",
    "flags",
    "flash_sdp_enabled",
    "get_cpu_capability",
    "get_verbose",
    "is_available",
    "is_built",
    "math_sdp_enabled",
    "matmul",
    "packed_weights_info",
    "preferred_blas_library",
    "set_flags",
    "verbose",
    "version",
]

sys.modules[__name__].__class__ = _EmberBackendModule
