"""``python -m torch_ember.guards report [options] SCRIPT [args...]``

Runs SCRIPT (as ``__main__``, with ``sys.argv = [SCRIPT, *args]``) under the
guard profiler, then prints a report per compiled code object and cache
entry: the guard tree, counts by kind, guard time per call and its most
expensive subtrees, the time of the compiled frame itself, every recompile
with the guard that failed, cache entries against the recompile limit, and
advice. ``--json``/``--html`` also write the report in those formats.

While the script runs, a ``sys.setprofile`` hook watches the frames of
compiled code: at each cache entry's first call it times the entry's guards
on that call's frame locals (the objects they just passed), and it counts and
times the frames.
The hook slows Python-heavy code down; its own cost per event is calibrated
and subtracted from the frame times, and reported.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import time
import traceback
from typing import Any

from . import advice as _advice
from .profiler import GuardProfile, Profiler, _empty_check_us, collect
from .recorder import RecompileLog


def run_script(
    script: str,
    args: list[str],
    *,
    budget: int = 48,
    measure: bool = True,
    breakdown: bool = True,
) -> tuple[GuardProfile, int, dict[str, Any] | None]:
    """Runs ``script`` under the profiler. Returns (profile, exit code, the
    script's globals — kept alive until the report is built)."""
    hook = Profiler(budget=budget, measure=measure, rounds=0, breakdown=breakdown).hook()
    event_ns = hook.calibrate()
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    exit_code = 0
    script_globals: dict[str, Any] | None = None
    wall0 = time.perf_counter()
    log = RecompileLog().start()
    try:
        with hook:
            script_globals = runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code
        exit_code = code if isinstance(code, int) else (0 if code is None else 1)
    except Exception:  # noqa: BLE001  (what ran until the error is still reported)
        traceback.print_exc()
        exit_code = 1
    finally:
        log.stop()
        sys.argv, sys.path[:] = saved_argv, saved_path
    script_s = time.perf_counter() - wall0
    wall1 = time.perf_counter()
    codes = collect(hook, log, with_body=True)
    profile = GuardProfile(
        mode="script",
        codes=codes,
        call_us=None,
        overhead={
            "hook_event_us": event_ns / 1000.0,
            "hook_events": float(hook.events),
            "empty_guard_check_us": _empty_check_us(codes),
            # Guard timing runs at each entry's first call, inside the script.
            "timing_in_script_s": hook.first_call_ns / 1e9,
            "script_wall_s": script_s,
            "profiler_wall_s": 0.0,
        },
        target=script,
    )
    profile.advice = _advice.advise(profile)
    profile.overhead["profiler_wall_s"] = time.perf_counter() - wall1
    return profile, exit_code, script_globals


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m torch_ember.guards",
        description="Guard profiler for torch.compile (see docs/guards.md).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="run a script and report its guards and recompiles")
    rep.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    rep.add_argument("--html", metavar="PATH", help="also write an HTML page with the guard tree")
    rep.add_argument("--text", metavar="PATH", help="write the text report here, not to stdout")
    rep.add_argument("--top", type=int, default=8, help="expensive subtrees listed per entry")
    rep.add_argument("--tree-depth", type=int, default=3, help="guard tree depth in the text")
    rep.add_argument("--budget", type=int, default=48, help="subtrees timed per cache entry")
    rep.add_argument("--no-timing", action="store_true", help="structure and recompiles only")
    rep.add_argument(
        "--no-breakdown",
        action="store_true",
        help="skip guard time by kind/source (about a second per cache entry)",
    )
    rep.add_argument("script", help="Python script to run")
    rep.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    ns = parser.parse_args(argv)

    profile, exit_code, _globals = run_script(
        ns.script,
        ns.args,
        budget=ns.budget,
        measure=not ns.no_timing,
        breakdown=not ns.no_breakdown,
    )
    from .report import to_text

    text = to_text(profile, top=ns.top, tree_depth=ns.tree_depth)
    if ns.text:
        _write(ns.text, text)
    else:
        sys.stdout.write("\n" + "=" * 78 + "\n" + text)
    if ns.json:
        _write(ns.json, profile.to_json())
    if ns.html:
        _write(ns.html, profile.to_html())
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
