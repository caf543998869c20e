"""Before/after whole-call timings that say whether a difference is real.

A whole compiled call of a real model takes hundreds of microseconds to
milliseconds and, on a shared machine, varies by more than the guard time a
reduction removes: two one-off figures (784 -> 1015 us in one run, 1350 ->
982 us in the next) cannot tell a user whether the cut helped.
:func:`compare_calls` therefore times *before* and *after* interleaved, over
``rounds`` rounds (ABBA order, so neither side always runs first), one batch
of calls per side and round. Each round gives a paired difference
(after - before, taken a few milliseconds apart, so slow drifts of the
machine cancel). The result reports each side's median and interquartile
range, the median difference and a distribution-free confidence interval for
it (order statistics of the paired differences, as in a sign test), and calls
the change *measurable* only if that interval excludes zero.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

from .timing import loop_overhead_ns

CONFIDENCE = 0.95


def _batch_size(call: Callable[[], Any], batch_s: float) -> int:
    """Calls per batch so that one batch lasts about ``batch_s``."""
    n = 1
    while True:
        t0 = time.perf_counter_ns()
        for _ in range(n):
            call()
        elapsed = time.perf_counter_ns() - t0
        if elapsed >= batch_s * 1e9 or n >= 1 << 16:
            return n
        n = max(n + 1, int(n * 1.5 * batch_s * 1e9 / max(elapsed, 1)))


def _batch_us(call: Callable[[], Any], n: int, loop_ns: float) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(n):
        call()
    return max(0.0, (time.perf_counter_ns() - t0) / n - loop_ns) / 1000.0


def median_interval(values: list[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Distribution-free confidence interval for the median of ``values``:
    the k-th smallest and k-th largest value, k the largest rank whose
    binomial tail keeps the coverage >= ``confidence``. With fewer than 6
    values no interval reaches 95%: then (min, max)."""
    ordered = sorted(values)
    n = len(ordered)
    k = 0
    while k + 1 <= n // 2:
        # P(fewer than k+1 of n values below the median) for a fair coin.
        tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
        if 1.0 - 2.0 * tail < confidence:
            break
        k += 1
    k = max(k, 1)
    return ordered[k - 1], ordered[n - k]


def _quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


@dataclasses.dataclass
class CallComparison:
    """Per-call times (us) of two callables, measured interleaved."""

    before_us: list[float]
    after_us: list[float]
    calls_per_batch: int
    confidence: float = CONFIDENCE
    unit: str = "call"  # what one figure is the time of ("call", "token")

    @property
    def differences_us(self) -> list[float]:
        return [a - b for b, a in zip(self.before_us, self.after_us)]

    @property
    def before_median_us(self) -> float:
        return statistics.median(self.before_us)

    @property
    def after_median_us(self) -> float:
        return statistics.median(self.after_us)

    @property
    def change_us(self) -> float:
        """Median paired difference, after - before (negative: faster)."""
        return statistics.median(self.differences_us)

    @property
    def change_interval_us(self) -> tuple[float, float]:
        return median_interval(self.differences_us, self.confidence)

    @property
    def measurable(self) -> bool:
        low, high = self.change_interval_us
        return low > 0.0 or high < 0.0

    @property
    def relative_change(self) -> float:
        return self.change_us / self.before_median_us if self.before_median_us else 0.0

    def verdict(self) -> str:
        low, high = self.change_interval_us
        interval = f"{self.confidence:.0%} interval {low:+.1f}..{high:+.1f} us"
        if not self.measurable:
            return f"no measurable change ({interval} covers 0)"
        word = "faster" if self.change_us < 0 else "slower"
        return (
            f"{abs(self.change_us):.1f} us ({abs(100 * self.relative_change):.1f}%) {word}"
            f" per {self.unit} ({interval})"
        )

    def summary(self) -> str:
        b_lo, b_hi = _quartiles(self.before_us)
        a_lo, a_hi = _quartiles(self.after_us)
        return (
            f"{self.before_median_us:.1f} us (IQR {b_lo:.1f}..{b_hi:.1f}) -> "
            f"{self.after_median_us:.1f} us (IQR {a_lo:.1f}..{a_hi:.1f}) per {self.unit},"
            f" {len(self.before_us)} interleaved rounds: {self.verdict()}"
        )

    def to_dict(self) -> dict[str, Any]:
        low, high = self.change_interval_us
        return {
            "unit": self.unit,
            "rounds": len(self.before_us),
            "calls_per_batch": self.calls_per_batch,
            "before_median_us": round(self.before_median_us, 3),
            "after_median_us": round(self.after_median_us, 3),
            "before_iqr_us": [round(v, 3) for v in _quartiles(self.before_us)],
            "after_iqr_us": [round(v, 3) for v in _quartiles(self.after_us)],
            "change_us": round(self.change_us, 3),
            "change_interval_us": [round(low, 3), round(high, 3)],
            "confidence": self.confidence,
            "measurable": self.measurable,
            "verdict": self.verdict(),
            "before_us": [round(v, 3) for v in self.before_us],
            "after_us": [round(v, 3) for v in self.after_us],
        }

    def __str__(self) -> str:
        return self.summary()


def compare_calls(
    before: Callable[[], Any],
    after: Callable[[], Any],
    *,
    rounds: int = 15,
    batch_s: float = 0.02,
    per: int = 1,
    unit: str = "call",
) -> CallComparison:
    """Times ``before()`` and ``after()`` interleaved (see the module doc).

    ``batch_s``: length of one side's batch in a round. ``per``: divide each
    figure by this (e.g. the tokens one ``generate()`` call produces)."""
    before(), after()  # warm: neither side pays a first-call cost in round 1
    n = max(_batch_size(before, batch_s), 1)
    loop_ns = loop_overhead_ns()
    b_us: list[float] = []
    a_us: list[float] = []
    for r in range(max(2, rounds)):
        first_before = r % 4 in (0, 3)  # ABBA ABBA ...
        order = ((b_us, before), (a_us, after)) if first_before else ((a_us, after), (b_us, before))
        for sink, call in order:
            sink.append(_batch_us(call, n, loop_ns) / per)
    return CallComparison(b_us, a_us, n, unit=unit)
