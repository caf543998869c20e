"""The guard profiler: what Dynamo's guards cost and why code recompiled.

:func:`profile` runs one compiled callable on example inputs and returns a
:class:`GuardProfile`; :func:`collect` builds the same record from whatever a
:class:`~torch_ember.guards.recorder.FrameHook` and a
:class:`~torch_ember.guards.recorder.RecompileLog` saw (the CLI uses it around
a whole script).

Per compiled code object and cache entry the profile holds the guard tree,
guard counts by kind, the measured guard-evaluation time per call (whole tree
and its most expensive subtrees), the recompiles with the guard that failed,
the number of cache entries against ``recompile_limit``, and advice.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from types import CodeType
from typing import Any

import torch
import torch._dynamo
from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.utils import orig_code_map

from . import advice as _advice
from .breakdown import Breakdown, peel
from .recorder import FrameHook, RecompileEvent, RecompileLog
from .timing import GuardTimer, loop_overhead_ns, module_guard_cost, time_per_call_ns, time_subtrees
from .tree import GuardNode, build_tree, count_by_kind


@dataclasses.dataclass
class EntryProfile:
    """One cache entry of a code object: a compiled graph and its guards."""

    compile_id: str
    position: int  # in Dynamo's lookup order (0 = checked first)
    tree: GuardNode
    calls: int = 0  # calls seen while profiling
    guard_us: float | None = None  # per check, profiler overhead excluded
    raw_us: float | None = None  # per check as measured, overhead included
    overhead_us: float | None = None  # the overhead that was subtracted
    module_guard_us: float | None = None  # cost of the guards on nn.Modules
    module_guard_count: int = 0
    body_us: float | None = None  # mean time of the compiled frame body (CLI)
    # The guards Dynamo still runs under skip_guard_eval_unsafe (the ones that
    # tell cache entries apart), timed like guard_us.
    diff_guard_us: float | None = None
    measured_nodes: int = 0
    breakdown: Breakdown | None = None  # guard time by kind and by source
    # Shapes of the tensor inputs at the entry's first recorded call.
    input_shapes: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    note: str = ""

    @property
    def guard_count(self) -> int:
        return self.tree.guard_count

    @property
    def counts(self) -> dict[str, int]:
        return count_by_kind(self.tree)

    def expensive(self, top: int = 8) -> list[GuardNode]:
        """The measured subtrees that cost the most. A node whose cost is
        mostly (>= 70%) one measured child is left out in favour of that
        child, so chains of single accessors (``L['self']`` ->
        ``L['self'].__dict__`` -> ...) are named once, at their end."""
        nodes = [n for n in self.tree.walk() if n is not self.tree and n.time_us is not None]
        picked = []
        for node in nodes:
            child_times = [c.time_us for c in node.children if c.time_us is not None]
            if child_times and max(child_times) >= 0.7 * (node.time_us or 0.0):
                continue
            picked.append(node)
        picked.sort(key=lambda n: n.time_us or 0.0, reverse=True)
        return picked[:top]

    def to_dict(self, tree_depth: int | None = None) -> dict[str, Any]:
        return {
            "compile_id": self.compile_id,
            "position": self.position,
            "calls": self.calls,
            "guard_count": self.guard_count,
            "counts_by_kind": self.counts,
            "guard_us": _round(self.guard_us),
            "raw_check_us": _round(self.raw_us),
            "overhead_subtracted_us": _round(self.overhead_us),
            "module_guard_us": _round(self.module_guard_us),
            "module_guard_count": self.module_guard_count,
            "body_us": _round(self.body_us),
            "diff_guard_us": _round(self.diff_guard_us),
            "measured_subtrees": self.measured_nodes,
            "breakdown": None if self.breakdown is None else self.breakdown.to_dict(),
            "input_shapes": {k: list(v) for k, v in self.input_shapes.items()},
            "expensive_subtrees": [
                {"source": n.source, "time_us": _round(n.time_us), "guard_count": n.guard_count}
                for n in self.expensive()
            ],
            "note": self.note,
            "tree": self.tree.to_dict(tree_depth),
        }


@dataclasses.dataclass
class CodeProfile:
    """A code object Dynamo compiled, with its cache entries and recompiles."""

    name: str
    filename: str
    firstlineno: int
    entries: list[EntryProfile]
    recompiles: list[RecompileEvent]
    recompile_limit: int
    limit_hit: dict[str, str] | None = None
    # The profiled call ran none of the cache entries (profile mode): it ran
    # eagerly, e.g. because the recompile limit was hit.
    ran_eagerly: bool = False

    @property
    def location(self) -> str:
        return f"{self.name} ({self.filename}:{self.firstlineno})"

    def to_dict(self, tree_depth: int | None = None) -> dict[str, Any]:
        return {
            "name": self.name,
            "filename": self.filename,
            "firstlineno": self.firstlineno,
            "cache_entries": len(self.entries),
            "recompile_limit": self.recompile_limit,
            "recompile_limit_hit": self.limit_hit is not None,
            "ran_eagerly": self.ran_eagerly,
            "recompiles": [event.to_dict() for event in self.recompiles],
            "entries": [entry.to_dict(tree_depth) for entry in self.entries],
        }


@dataclasses.dataclass
class GuardProfile:
    """Everything the profiler found; render with :mod:`torch_ember.guards.report`."""

    mode: str  # "profile" (one callable) or "script" (the CLI)
    codes: list[CodeProfile]
    call_us: float | None  # whole compiled call, per call (profile mode)
    overhead: dict[str, float]
    # The same call with guard evaluation skipped but the differentiating
    # guards (profile mode).
    call_skip_guards_us: float | None = None
    advice: list[_advice.Advice] = dataclasses.field(default_factory=list)
    target: str = ""
    # Generate mode (decode): new tokens per generate() call, and the time of
    # one generate() call (median over rounds, without the profiler's hook).
    tokens: int | None = None
    generate_us: float | None = None

    @property
    def per_token_us(self) -> float | None:
        if not self.tokens or self.generate_us is None:
            return None
        return self.generate_us / self.tokens

    @property
    def guard_us_per_token(self) -> float | None:
        """Guard time of one generate() call (every compiled forward it ran:
        prefill and decode steps) per new token."""
        if not self.tokens:
            return None
        return self.total_guard_us / self.tokens

    @property
    def hit_entries(self) -> list[EntryProfile]:
        return [e for code in self.codes for e in code.entries if e.calls > 0]

    @property
    def guard_us(self) -> float:
        """Guard-evaluation time per call. Profile mode: sum over the entries
        the one profiled call ran (one per compiled frame). Script and
        generate modes, where calls hit different entries: mean per
        compiled call (sum of guard time over every recorded call / calls)."""
        if self.mode == "profile":
            return sum(e.guard_us or 0.0 for e in self.hit_entries)
        calls = sum(e.calls for e in self.hit_entries)
        return self.total_guard_us / calls if calls else 0.0

    @property
    def guard_count(self) -> int:
        """Guards evaluated per call, counted like :attr:`guard_us`."""
        if self.mode == "profile":
            return sum(e.guard_count for e in self.hit_entries)
        calls = sum(e.calls for e in self.hit_entries)
        total = sum(e.guard_count * e.calls for e in self.hit_entries)
        return round(total / calls) if calls else 0

    @property
    def guard_in_call_us(self) -> float | None:
        """Guard cost inside the real call: whole call minus the call with guard
        evaluation skipped, plus the differentiating guards that still ran
        (measured in isolation). Includes what the isolated figure cannot see
        (guard data evicted from the CPU caches by the call itself), and the
        noise of a difference of two call times."""
        if self.call_us is None or self.call_skip_guards_us is None:
            return None
        diff = sum(e.diff_guard_us or 0.0 for e in self.hit_entries)
        return max(0.0, self.call_us - self.call_skip_guards_us) + diff

    @property
    def total_guard_us(self) -> float:
        """Guard time summed over every recorded call of every entry."""
        return sum((e.guard_us or 0.0) * e.calls for e in self.hit_entries)

    @property
    def total_body_us(self) -> float:
        """Time in compiled frames summed over every recorded call (script mode)."""
        return sum((e.body_us or 0.0) * e.calls for e in self.hit_entries)

    @property
    def guard_share(self) -> float | None:
        """Guard time as a fraction of the whole compiled call."""
        if not any(e.guard_us is not None for e in self.hit_entries):
            return None
        if self.tokens and self.per_token_us:
            return (self.guard_us_per_token or 0.0) / self.per_token_us
        if self.call_us:
            return self.guard_us / self.call_us
        whole = self.total_guard_us + self.total_body_us
        if self.total_body_us > 0:
            return self.total_guard_us / whole
        return None

    @property
    def recompile_count(self) -> int:
        return sum(len(code.recompiles) for code in self.codes)

    def to_dict(self, tree_depth: int | None = None) -> dict[str, Any]:
        from .report import to_dict

        return to_dict(self, tree_depth)

    def to_json(self, tree_depth: int | None = None) -> str:
        from .report import to_json

        return to_json(self, tree_depth)

    def to_text(self, top: int = 8) -> str:
        from .report import to_text

        return to_text(self, top)

    def to_html(self) -> str:
        from .report import to_html

        return to_html(self)

    def __str__(self) -> str:
        return self.to_text()


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def _original_code(code: CodeType) -> CodeType | None:
    return orig_code_map.get(code)


def _cache_entry_of(code: CodeType) -> tuple[Any, int] | None:
    """(cache entry, position) whose compiled code is ``code``."""
    original = _original_code(code)
    if original is None:
        return None
    for position, entry in enumerate(_debug_get_cache_entry_list(original)):
        if entry.code is code:
            return entry, position
    return None


def measure_entry(
    entry: Any, f_locals: dict[str, Any], *, budget: int, breakdown: bool = True
) -> EntryProfile:
    """Times the guards of cache ``entry`` on ``f_locals``, the locals of a
    call those guards have just passed (see :class:`FrameHook`): whole tree,
    the most expensive subtrees, the nn.Module guards, the differentiating
    guards, and the breakdown by kind and by source."""
    root = entry.guard_manager.root
    tree = build_tree(root)
    profile = EntryProfile(compile_id=str(entry.compile_id), position=-1, tree=tree)
    if not root.check(f_locals):
        failed = "; ".join(root.check_verbose(f_locals).verbose_code_parts)
        profile.note = f"guards fail on the locals of the call ({failed}): not timed"
        return profile
    timer = GuardTimer(f_locals)
    profile.overhead_us = timer.overhead_us
    profile.raw_us = timer.raw_us(root)
    profile.guard_us = max(0.0, profile.raw_us - timer.overhead_us)
    tree.time_us = profile.guard_us
    if breakdown:
        profile.breakdown = peel(root, tree, timer, profile.raw_us)
    profile.measured_nodes = time_subtrees(root, tree, timer, budget=budget)
    profile.module_guard_us, profile.module_guard_count = module_guard_cost(root, tree, timer)
    diff_root = getattr(entry.guard_manager, "diff_guard_root", None)
    if diff_root is not None and diff_root.check(f_locals):
        profile.diff_guard_us = timer.time_us(diff_root)
    return profile


def call_time_measurer(
    *, budget: int, breakdown: bool = True
) -> Callable[[CodeType, dict[str, Any]], EntryProfile | None]:
    """The ``on_first_call`` of a :class:`FrameHook` that measures the entry
    whose compiled code starts running, on the locals it was called with."""

    def measure(code: CodeType, f_locals: dict[str, Any]) -> EntryProfile | None:
        found = _cache_entry_of(code)
        if found is None:
            return None
        return measure_entry(found[0], f_locals, budget=budget, breakdown=breakdown)

    return measure


def _entry_profile(entry: Any, position: int, stats: Any, *, with_body: bool) -> EntryProfile:
    measured = stats.measured if stats is not None else None
    if isinstance(measured, EntryProfile) and measured.compile_id == str(entry.compile_id):
        profile = measured
        # Failure counts grow after the call that measured the entry.
        fresh = build_tree(entry.guard_manager.root)
        for node, now in zip(profile.tree.walk(), fresh.walk()):
            node.fail_count = now.fail_count
    else:
        profile = EntryProfile(
            compile_id=str(entry.compile_id), position=position,
            tree=build_tree(entry.guard_manager.root),
        )  # fmt: skip
        if stats is None:
            profile.note = "not run while profiling"
        elif isinstance(measured, Exception):
            profile.note = f"not timed: {type(measured).__name__}: {measured}"
    profile.position = position
    if stats is None:
        return profile
    profile.calls = stats.calls
    profile.input_shapes = dict(stats.input_shapes)
    if with_body and stats.calls and stats.body_ns:
        profile.body_us = stats.body_ns / stats.calls / 1000.0
    return profile


def collect(
    hook: FrameHook,
    log: RecompileLog,
    *,
    only_seen: bool = False,
    with_body: bool = False,
    extra_codes: tuple[CodeType, ...] = (),
) -> list[CodeProfile]:
    """Builds the per-code records from what ``hook`` and ``log`` saw (the
    guard timings were taken by the hook's ``on_first_call``, if it had one).

    ``only_seen``: keep only code objects whose compiled frames ran under the
    hook or that recompiled since ``log`` started (the :func:`profile` case);
    otherwise every code object with recompiles is included too."""
    stats_by_code = {code: stats for code, stats in hook.stats.items()}
    originals: list[CodeType] = []
    for code in stats_by_code:
        original = _original_code(code)
        if original is not None and original not in originals:
            originals.append(original)
    for code in extra_codes:
        if code not in originals and (code in log.start_lengths or _has_entries(code)):
            originals.append(code)
    for code in log.codes():
        if code in originals:
            continue
        if only_seen and not any(e.during_profile for e in log.events(code)):
            continue
        originals.append(code)

    limit = int(torch._dynamo.config.recompile_limit)
    out = []
    for code in originals:
        entries = []
        for position, entry in enumerate(_debug_get_cache_entry_list(code)):
            stats = stats_by_code.get(entry.code)
            entries.append(_entry_profile(entry, position, stats, with_body=with_body))
        entries.sort(key=lambda e: _compile_order(e.compile_id))
        events = log.events(code)
        limit_hit = log.limit_hit(code)
        if limit_hit is None and len(entries) >= limit and len(events) >= limit:
            # Hit before the log started: the last recompile attempt found
            # the cache full.
            limit_hit = {"limit": "recompile_limit", "value": str(limit), "inferred": "yes"}
        out.append(
            CodeProfile(
                name=code.co_name,
                filename=code.co_filename,
                firstlineno=code.co_firstlineno,
                entries=entries,
                recompiles=events,
                recompile_limit=limit,
                limit_hit=limit_hit,
            )
        )
    return out


def _has_entries(code: CodeType) -> bool:
    return bool(_debug_get_cache_entry_list(code))


def _target_codes(fn: Callable[..., Any]) -> tuple[CodeType, ...]:
    """Code objects ``torch.compile`` compiles first for ``fn``: the forward of
    a compiled module, the function of a compiled function."""
    inner = getattr(fn, "_orig_mod", None)
    if inner is not None:
        inner = getattr(inner, "forward", None)
    else:
        inner = getattr(fn, "_torchdynamo_orig_callable", None)
    inner = getattr(inner, "__func__", inner)
    code = getattr(inner, "__code__", None)
    return (code,) if isinstance(code, CodeType) else ()


def _compile_order(compile_id: str) -> tuple[int, ...]:
    digits = [int(part) for part in compile_id.replace("_", "/").split("/") if part.isdigit()]
    return tuple(digits)


class Profiler:
    """Guard profiler with options; :func:`profile` uses the defaults.

    ``budget``: subtrees timed per cache entry. ``warmup``: plain calls made
    before recording (the first one compiles). ``measure``: time the guards
    (otherwise only structure and recompiles). ``rounds``: alternations of
    the whole-call timing with and without guard evaluation (0: no whole-call
    timing). ``breakdown``: guard time by kind and by source (see
    :mod:`~torch_ember.guards.breakdown`)."""

    def __init__(
        self,
        *,
        budget: int = 48,
        warmup: int = 1,
        measure: bool = True,
        rounds: int = 4,
        breakdown: bool = True,
    ):
        self.budget = budget
        self.warmup = warmup
        self.measure = measure
        self.rounds = rounds
        self.breakdown = breakdown

    def hook(self) -> FrameHook:
        """A frame hook that times each entry's guards at its first call."""
        if not self.measure:
            return FrameHook()
        return FrameHook(
            on_first_call=call_time_measurer(budget=self.budget, breakdown=self.breakdown)
        )

    def profile(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> GuardProfile:
        wall0 = time.perf_counter()
        with RecompileLog() as log:
            for _ in range(self.warmup):
                fn(*args, **kwargs)
            hook = self.hook()
            with hook:
                fn(*args, **kwargs)
        call_ns: float | None = None
        skipped_ns: float | None = None
        if self.rounds > 0:
            call_ns, skipped_ns = _call_times(
                lambda: fn(*args, **kwargs), self.rounds, skip=bool(hook.stats)
            )
        loop_ns = loop_overhead_ns()
        codes = collect(hook, log, only_seen=True, extra_codes=_target_codes(fn))
        for code in codes:
            if code.entries and not any(e.calls for e in code.entries):
                code.ran_eagerly = True
        result = GuardProfile(
            mode="profile",
            codes=codes,
            call_us=None if call_ns is None else max(0.0, call_ns - loop_ns) / 1000.0,
            call_skip_guards_us=(
                None if skipped_ns is None else max(0.0, skipped_ns - loop_ns) / 1000.0
            ),
            overhead={
                "timing_loop_us": loop_ns / 1000.0,
                "empty_guard_check_us": _empty_check_us(codes),
                "profiler_wall_s": 0.0,
            },
            target=_describe(fn),
        )
        result.advice = _advice.advise(result)
        result.overhead["profiler_wall_s"] = time.perf_counter() - wall0
        return result


def _empty_check_us(codes: list[CodeProfile]) -> float:
    overheads = [e.overhead_us for c in codes for e in c.entries if e.overhead_us is not None]
    return min(overheads) if overheads else 0.0


def _call_times(call: Callable[[], Any], rounds: int, skip: bool) -> tuple[float, float | None]:
    """(ns per call, ns per call with guard evaluation skipped), alternating
    ``rounds`` times; minimum of each. Skipping uses the compiler stance
    ``skip_guard_eval_unsafe`` (only the guards that tell cache entries apart
    run), safe here because the inputs are the ones that just passed. Dynamo
    refuses that stance for a call that would compile (e.g. one that runs
    eagerly because the recompile limit was hit): then the second is None."""
    with_guards: list[float] = []
    skipped: list[float] = []
    for _ in range(max(1, rounds)):
        with_guards.append(time_per_call_ns(call, batch_s=0.005, repeats=3))
        if not skip:
            continue
        try:
            with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                skipped.append(time_per_call_ns(call, batch_s=0.005, repeats=3))
        except RuntimeError:
            skip = False
            skipped.clear()
    return min(with_guards), (min(skipped) if skipped else None)


def profile(compiled_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> GuardProfile:
    """Profiles the guards of ``compiled_fn(*args, **kwargs)``.

    ``compiled_fn`` is anything ``torch.compile`` returned (a function or an
    ``OptimizedModule``), or any callable that calls compiled code. It is
    called a few times with the given arguments: once to warm up (compiling
    if needed), once under a frame hook that records which cache entries run
    and their frame locals, then in a timing loop for the whole-call time.
    The guards of every entry that ran are then timed on those locals.
    """
    return Profiler().profile(compiled_fn, *args, **kwargs)


def _describe(fn: Callable[..., Any]) -> str:
    orig = getattr(fn, "_orig_mod", None)
    if orig is not None:
        return f"compiled {type(orig).__name__}"
    inner = getattr(fn, "_torchdynamo_orig_callable", fn)
    return getattr(inner, "__qualname__", type(inner).__name__)
