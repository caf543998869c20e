"""What the profiler records while compiled code runs.

* Recompiles. Dynamo appends one reason per failed cache entry to
  ``torch._dynamo.utils.guard_failures[code]`` each time it has to compile a
  code object again ("0/0: tensor 'x' size mismatch at index 0. expected 4,
  actual 8"), most recently used entry first. :func:`recompile_events` splits
  that list back into events (a new event starts when an entry's compile id
  repeats). Hitting ``recompile_limit`` is logged as a warning by
  ``torch._dynamo.convert_frame``; :class:`RecompileLog` catches it.
* Frames. :class:`FrameHook` is a ``sys.setprofile`` hook that notices when a
  frame of Dynamo-generated code (the code a cache entry runs) starts and ends:
  it counts calls and times the frame body (its own cost per profiling event
  is calibrated and subtracted). At the first call of each entry it records
  the shapes of the tensor inputs and hands the frame locals to
  ``on_first_call`` *right then*: the guards of that entry have just passed on
  exactly those objects. Measuring later on kept locals is wrong for real
  models: a transformers ``**kwargs`` wrapper adds keys to its ``kwargs``
  dict during the call, a KV cache grows, and the guards no longer pass.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import sys
import time
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any, Self

import torch
from torch._dynamo import convert_frame
from torch._dynamo.utils import guard_failures

_COMPILE_ID = re.compile(r"^\s*\[?(\d+/\d+(?:_\d+)?)\]?:\s?")


@dataclasses.dataclass
class RecompileEvent:
    """One recompilation of a code object: why each cached entry was refused."""

    index: int  # 1 for the first recompile of the code object
    reasons: list[tuple[str, str]]  # (compile id of the refused entry, reason)
    during_profile: bool = False

    @property
    def primary(self) -> str:
        """The reason against the most recently used entry."""
        return self.reasons[0][1] if self.reasons else ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "during_profile": self.during_profile,
            "failed_guards": [{"entry": cid, "reason": reason} for cid, reason in self.reasons],
        }


def _split_reason(text: str) -> tuple[str, str]:
    text = text.split("\nUser stack trace:")[0]
    match = _COMPILE_ID.match(text)
    if not match:
        return "?", text.strip()
    reason = text[match.end() :]
    # Guard code carries a "# user code  # file:line" comment; keep the check.
    check, _, comment = reason.partition("  #")
    check = check.strip()
    if "0/1 specialization" in comment:
        check += "  (0/1 specialization)"
    return match.group(1), check


def recompile_events(code: CodeType, first_new: int | None = None) -> list[RecompileEvent]:
    """The recompiles of ``code`` recorded by Dynamo, oldest first.

    ``first_new``: index into the raw reason list from which reasons were
    recorded during the profile (those events are flagged)."""
    raw = list(guard_failures.get(code, []))
    events: list[RecompileEvent] = []
    current: list[tuple[str, str]] = []
    current_new = False
    seen: set[str] = set()

    def close() -> None:
        nonlocal current, current_new
        events.append(RecompileEvent(len(events) + 1, current, current_new))
        current, current_new = [], False

    for position, text in enumerate(raw):
        cid, reason = _split_reason(text)
        if current and (cid == "?" or cid in {c for c, _ in current}):
            close()
        current.append((cid, reason))
        current_new = current_new or (first_new is not None and position >= first_new)
        seen.add(cid)
        # Dynamo refuses every existing entry before it compiles again, so an
        # event is complete once it names every entry seen so far.
        if cid == "?" or len(current) >= len(seen):
            close()
    if current:
        close()
    return events


class _LimitHandler(logging.Handler):
    def __init__(self, sink: list[dict[str, str]]):
        super().__init__(logging.WARNING)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        if "hit config." not in str(record.msg) or not record.args:
            return
        args = [str(a) for a in record.args]
        while len(args) < 4:
            args.append("")
        self.sink.append(
            {"limit": args[0], "value": args[1], "function": args[2], "last_reason": args[3]}
        )


class RecompileLog:
    """Marks where Dynamo's recompile record stood at ``start`` and collects the
    recompile-limit warnings issued until ``stop``."""

    def __init__(self) -> None:
        self.start_lengths: dict[CodeType, int] = {}
        self.limit_hits: list[dict[str, str]] = []
        self._handler = _LimitHandler(self.limit_hits)
        self._logger = logging.getLogger(convert_frame.__name__)

    def start(self) -> RecompileLog:
        self.start_lengths = {code: len(reasons) for code, reasons in guard_failures.items()}
        self._logger.addHandler(self._handler)
        return self

    def stop(self) -> None:
        self._logger.removeHandler(self._handler)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def codes(self) -> list[CodeType]:
        """Code objects with recompiles, those recorded since ``start`` first."""
        new = [c for c, r in guard_failures.items() if len(r) > self.start_lengths.get(c, 0)]
        old = [c for c in guard_failures if c not in new]
        return new + old

    def events(self, code: CodeType) -> list[RecompileEvent]:
        return recompile_events(code, self.start_lengths.get(code, 0))

    def limit_hit(self, code: CodeType) -> dict[str, str] | None:
        tag = f"'{code.co_name}' ({code.co_filename}:{code.co_firstlineno})"
        for hit in self.limit_hits:
            if hit["function"] == tag:
                return hit
        return None


@dataclasses.dataclass
class FrameStats:
    calls: int = 0
    body_ns: float = 0.0
    f_locals: dict[str, Any] | None = None  # of the first call (kept only if asked)
    grad_enabled: bool = True  # grad mode at that call (part of the GLOBAL_STATE guard)
    # Shapes of the tensor inputs at the first call, by the name Dynamo's
    # recompile reasons use: "x", "kwargs['input_ids']", "args[0]".
    input_shapes: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    # What ``on_first_call`` returned (the profiler: the measured entry).
    measured: Any = None


def input_shapes(f_locals: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Shapes of the tensors among the frame locals and one level inside the
    ``*args`` tuple / ``**kwargs`` dict, named as in Dynamo's guard reasons."""
    out: dict[str, tuple[int, ...]] = {}
    for name, value in f_locals.items():
        if isinstance(value, torch.Tensor):
            out[name] = tuple(value.shape)
        elif type(value) is dict:
            for key, item in value.items():
                if isinstance(key, str) and isinstance(item, torch.Tensor):
                    out[f"{name}[{key!r}]"] = tuple(item.shape)
        elif type(value) in (tuple, list):
            for index, item in enumerate(value):
                if isinstance(item, torch.Tensor):
                    out[f"{name}[{index}]"] = tuple(item.shape)
    return out


def _generated_code_ids() -> set[int]:
    return convert_frame.output_codes.seen_ids


class FrameHook:
    """``sys.setprofile`` hook watching frames of Dynamo-generated code."""

    def __init__(
        self,
        keep_locals: bool = False,
        on_first_call: Callable[[CodeType, dict[str, Any]], Any] | None = None,
    ) -> None:
        self.keep_locals = keep_locals
        self.on_first_call = on_first_call
        self.first_call_ns = 0  # time spent in on_first_call (not in any frame time)
        self.stats: dict[CodeType, FrameStats] = {}
        self.events = 0
        self._open: list[tuple[FrameType, int, int]] = []
        self._ids = _generated_code_ids()
        self._previous: Any = None
        self.event_cost_ns = 0.0

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        self.events += 1
        if event == "call":
            code = frame.f_code
            if id(code) in self._ids:
                stats = self.stats.get(code)
                if stats is None:
                    stats = self.stats[code] = FrameStats()
                    _outside_dynamo(self._first_call)(code, frame, stats)
                stats.calls += 1
                self._open.append((frame, self.events, time.perf_counter_ns()))
        elif event == "return" and self._open and self._open[-1][0] is frame:
            _, events_at_start, t0 = self._open.pop()
            elapsed = time.perf_counter_ns() - t0
            inner_events = self.events - events_at_start
            correction = inner_events * self.event_cost_ns
            self.stats[frame.f_code].body_ns += max(0.0, elapsed - correction)

    def _first_call(self, code: CodeType, frame: FrameType, stats: FrameStats) -> None:
        t0 = time.perf_counter_ns()
        f_locals = dict(frame.f_locals)
        stats.grad_enabled = torch.is_grad_enabled()
        stats.input_shapes = input_shapes(f_locals)
        if self.keep_locals:
            stats.f_locals = f_locals
        if self.on_first_call is not None:
            # Profiling must never break the program it watches.
            try:
                stats.measured = self.on_first_call(code, f_locals)
            except Exception as exc:  # noqa: BLE001
                stats.measured = exc
        self.first_call_ns += time.perf_counter_ns() - t0

    def calibrate(self, n: int = 20000) -> float:
        """Cost of one profiling event (call or return) seen by this hook."""

        def loop() -> int:
            t0 = time.perf_counter_ns()
            for _ in range(n):
                _noop()
            return time.perf_counter_ns() - t0

        plain = min(loop() for _ in range(3))
        self._install()
        try:
            hooked = min(loop() for _ in range(3))
        finally:
            self._uninstall()
        self.events = 0
        self.event_cost_ns = max(0.0, (hooked - plain) / (2 * n))
        return self.event_cost_ns

    def _install(self) -> None:
        self._previous = sys.getprofile()
        sys.setprofile(self)

    def _uninstall(self) -> None:
        sys.setprofile(self._previous)

    def __enter__(self) -> Self:
        self._install()
        return self

    def __exit__(self, *exc: object) -> None:
        self._uninstall()


def _noop() -> None:
    return None


def _outside_dynamo(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` run with Dynamo's frame evaluation off: the hook fires while a
    compiled call is in progress, where Dynamo would otherwise try to compile
    the profiler's own functions."""
    return torch._dynamo.disable(fn, recursive=True)
