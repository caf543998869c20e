"""Renders a :class:`~torch_ember.guards.profiler.GuardProfile` as text, JSON or HTML."""

from __future__ import annotations

import html
import json
import platform
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from .profiler import EntryProfile, GuardProfile
    from .tree import GuardNode

SCHEMA_VERSION = 1


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} us"


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def to_dict(profile: GuardProfile, tree_depth: int | None = None) -> dict[str, Any]:
    share = profile.guard_share
    script = profile.mode == "script"
    return {
        "schema": SCHEMA_VERSION,
        "tool": "torch_ember.guards",
        "mode": profile.mode,
        "target": profile.target,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "summary": {
            "guard_us_per_call": round(profile.guard_us, 4),
            "guard_count_per_call": profile.guard_count,
            "call_us": None if profile.call_us is None else round(profile.call_us, 3),
            "call_skip_guards_us": (
                None
                if profile.call_skip_guards_us is None
                else round(profile.call_skip_guards_us, 3)
            ),
            "guard_in_call_us": (
                None if profile.guard_in_call_us is None else round(profile.guard_in_call_us, 3)
            ),
            "guard_share_of_call": None if share is None else round(share, 5),
            "compiled_calls": sum(e.calls for e in profile.hit_entries),
            # Generate mode: per new token of one generate() call.
            "tokens": profile.tokens,
            "generate_us": _round(profile.generate_us, 3),
            "per_token_us": _round(profile.per_token_us, 3),
            "guard_us_per_token": _round(profile.guard_us_per_token, 4),
            # Script mode: sums over every recorded call (guards, compiled frames).
            "total_guard_us": round(profile.total_guard_us, 3) if script else None,
            "total_compiled_frame_us": round(profile.total_body_us, 3) if script else None,
            "recompiles": profile.recompile_count,
            "code_objects": len(profile.codes),
            "cache_entries": sum(len(c.entries) for c in profile.codes),
        },
        "profiler_overhead": {k: round(v, 4) for k, v in profile.overhead.items()},
        "codes": [code.to_dict(tree_depth) for code in profile.codes],
        "advice": [a.to_dict() for a in profile.advice],
    }


def to_json(profile: GuardProfile, tree_depth: int | None = None) -> str:
    return json.dumps(to_dict(profile, tree_depth), indent=1)


def _tree_lines(node: GuardNode, depth: int, max_depth: int, out: list[str]) -> None:
    timed = f"  [{node.time_us:.3f} us]" if node.time_us is not None else ""
    kinds: dict[str, int] = {}
    for kind, _ in node.leaves:
        kinds[kind] = kinds.get(kind, 0) + 1
    leaf_text = ", ".join(f"{k} x{v}" if v > 1 else k for k, v in kinds.items())
    label = node.source if depth else "(root)"
    count = node.guard_count
    out.append(
        f"{'  ' * depth}{label}  <{node.value_type}>  {count} guard(s){timed}"
        + (f"  : {leaf_text}" if leaf_text else "")
    )
    if depth >= max_depth:
        if node.children:
            out.append(f"{'  ' * (depth + 1)}... {len(node.children)} child node(s)")
        return
    # Expensive and measured children first; unmeasured ones by guard count.
    children = sorted(
        node.children,
        key=lambda c: (c.time_us is None, -(c.time_us or 0.0), -c.guard_count),
    )
    for child in children:
        _tree_lines(child, depth + 1, max_depth, out)


def _entry_text(entry: EntryProfile, top: int, out: list[str]) -> None:
    state = f"ran {entry.calls}x" if entry.calls else "idle"
    out.append(
        f"  entry {entry.compile_id} ({state}): {entry.guard_count} guards,"
        f" guard time {_us(entry.guard_us)}/call"
        + (
            f" (measured {_us(entry.raw_us)} - overhead {_us(entry.overhead_us)})"
            if entry.raw_us is not None
            else ""
        )
    )
    if entry.note:
        out.append(f"    note: {entry.note}")
    kinds = ", ".join(f"{k} {v}" for k, v in entry.counts.items())
    out.append(f"    guards by kind: {kinds}")
    if entry.breakdown is not None:
        _breakdown_text(entry, out)
    if entry.body_us is not None:
        out.append(f"    compiled frame body: {_us(entry.body_us)}/call")
    if entry.module_guard_us is not None and entry.module_guard_count:
        out.append(
            f"    guards on nn.Modules: {entry.module_guard_count}, {_us(entry.module_guard_us)}"
        )
    expensive = entry.expensive(top)
    if expensive:
        out.append(f"    most expensive subtrees ({entry.measured_nodes} timed):")
        for node in expensive:
            out.append(
                f"      {_us(node.time_us):>12}  {node.guard_count:5d} guards  {node.source}"
            )


def _breakdown_text(entry: EntryProfile, out: list[str]) -> None:
    breakdown = entry.breakdown
    assert breakdown is not None
    by_kind = sorted(breakdown.by_kind.items(), key=lambda kv: -kv[1])
    out.append(
        f"    guard time by kind (each node's check and lookup under its principal guard;"
        f" {breakdown.steps} peeling steps, sum {breakdown.total_us:.3f} us): "
        + ", ".join(f"{kind} {us:.2f}" for kind, us in by_kind)
    )
    by_source = sorted(breakdown.by_source.items(), key=lambda kv: -kv[1])
    out.append(
        "    guard time by source: "
        + ", ".join(
            f"{group} {us:.2f} us ({breakdown.guards_by_source.get(group, 0)} guards)"
            for group, us in by_source
        )
    )


def to_text(profile: GuardProfile, top: int = 8, tree_depth: int = 3) -> str:
    out = [f"Guard profile ({profile.mode}{': ' + profile.target if profile.target else ''})"]
    if profile.tokens:
        calls = sum(e.calls for e in profile.hit_entries)
        out.append(
            f"  per token: guards {profile.guard_us_per_token or 0.0:.3f} us of"
            f" {profile.per_token_us or 0.0:.1f} us ({100 * (profile.guard_share or 0.0):.2f}%);"
            f" one generate(): {profile.tokens} new tokens, {calls} compiled forward calls,"
            f" {profile.total_guard_us:.1f} us of guards in {profile.generate_us or 0.0:.0f} us"
        )
    elif profile.call_us is not None:
        share = profile.guard_share or 0.0
        out.append(
            f"  per call: guards {profile.guard_us:.3f} us of {profile.call_us:.3f} us"
            f" ({100 * share:.2f}%), {profile.guard_count} guards evaluated"
        )
        if profile.guard_in_call_us is not None:
            out.append(
                f"  guards inside the real call: {profile.guard_in_call_us:.3f} us (call"
                f" {profile.call_us:.3f} us - call with guard evaluation skipped"
                f" {profile.call_skip_guards_us:.3f} us + differentiating guards)"
            )
    else:
        calls = sum(e.calls for e in profile.hit_entries)
        share = profile.guard_share
        share_text = f" ({100 * share:.2f}% of compiled-call time)" if share is not None else ""
        out.append(
            f"  {calls} compiled call(s): guards {profile.total_guard_us:.1f} us in total"
            f" ({profile.guard_us:.2f} us, {profile.guard_count} guards per call on average),"
            f" compiled frames {profile.total_body_us:.1f} us{share_text}"
        )
    over = profile.overhead
    out.append(
        "  profiler overhead (excluded): "
        + ", ".join(f"{k.replace('_', ' ')} {v:.3f}" for k, v in over.items())
    )
    out.append(f"  recompiles: {profile.recompile_count}")
    for code in profile.codes:
        out.append("")
        out.append(
            f"{code.location}: {len(code.entries)} cache entr{'y' if len(code.entries) == 1 else 'ies'}"
            f" (recompile limit {code.recompile_limit}"
            + (", LIMIT HIT" if code.limit_hit else "")
            + (", the profiled call ran EAGERLY" if code.ran_eagerly else "")
            + f"), {len(code.recompiles)} recompile(s)"
        )
        for event in code.recompiles:
            flag = " [during profile]" if event.during_profile and profile.mode != "script" else ""
            cid, reason = event.reasons[0] if event.reasons else ("?", "")
            out.append(f"  recompile #{event.index}{flag}: entry {cid} failed: {reason}")
            for other_cid, other in event.reasons[1:]:
                out.append(f"      entry {other_cid} failed: {other}")
        for entry in code.entries:
            _entry_text(entry, top, out)
        busiest = max(code.entries, key=lambda e: e.calls, default=None)
        if busiest is not None and busiest.calls:
            out.append(
                f"  guard tree of entry {busiest.compile_id}, the most called"
                f" (depth <= {tree_depth}; full tree in JSON/HTML):"
            )
            lines: list[str] = []
            _tree_lines(busiest.tree, 0, tree_depth, lines)
            out.extend("    " + line for line in lines)
    out.append("")
    if profile.advice:
        out.append("Advice:")
        for item in profile.advice:
            out.append(f"  [{item.severity}] {item.where}: {item.message}")
            if item.fix:
                out.append(f"      fix: {item.fix}")
            if item.saving:
                out.append(f"      saves: {item.saving}")
    else:
        out.append("Advice: none (no recompiles, no guard cost worth cutting)")
    return "\n".join(out) + "\n"


_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;max-width:1200px}
code,.mono{font-family:ui-monospace,monospace;font-size:90%}
details{margin-left:1.2em} summary{cursor:pointer}
.t{color:#a33;font-weight:600} .k{color:#555} .adv-high{color:#a00} .adv-medium{color:#a60}
table{border-collapse:collapse} td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}
"""


def _html_node(node: GuardNode, depth: int) -> str:
    esc = html.escape
    timed = f' <span class="t">{node.time_us:.3f} us</span>' if node.time_us is not None else ""
    label = esc(node.source) if depth else "(root)"
    summary = (
        f'<span class="mono">{label}</span> <span class="k">&lt;{esc(node.value_type)}&gt;'
        f" {node.guard_count} guards</span>{timed}"
    )
    leaves = "".join(
        f'<li class="mono"><b>{esc(kind)}</b> {esc(code)}</li>' for kind, code in node.leaves
    )
    children = sorted(
        node.children, key=lambda c: (c.time_us is None, -(c.time_us or 0.0), -c.guard_count)
    )
    inner = (f"<ul>{leaves}</ul>" if leaves else "") + "".join(
        _html_node(child, depth + 1) for child in children
    )
    opened = " open" if depth < 2 else ""
    return f"<details{opened}><summary>{summary}</summary>{inner}</details>"


def to_html(profile: GuardProfile) -> str:
    esc = html.escape
    data = to_dict(profile, tree_depth=0)
    summary = data["summary"]
    rows = "".join(
        f"<tr><th>{esc(k.replace('_', ' '))}</th><td>{esc(str(v))}</td></tr>"
        for k, v in list(summary.items()) + list(data["profiler_overhead"].items())
    )
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>Guard profile</title>",
        f"<style>{_CSS}</style></head><body>",
        (
            f"<h1>Guard profile</h1><p>{esc(profile.mode)} {esc(profile.target)}"
            f" &middot; torch {esc(torch.__version__)}</p><table>{rows}</table>"
        ),
    ]
    if profile.advice:
        parts.append("<h2>Advice</h2><ul>")
        for item in profile.advice:
            parts.append(
                f'<li class="adv-{item.severity}"><b>[{item.severity}]</b> {esc(item.where)}:'
                f" {esc(item.message)}"
                + (f"<br><code>{esc(item.fix)}</code>" if item.fix else "")
                + (f"<br>saves: {esc(item.saving)}" if item.saving else "")
                + "</li>"
            )
        parts.append("</ul>")
    for code in profile.codes:
        parts.append(
            f"<h2 class='mono'>{esc(code.location)}</h2><p>{len(code.entries)} cache entries,"
            f" recompile limit {code.recompile_limit}"
            + (" &mdash; <b>limit hit</b>" if code.limit_hit else "")
            + "</p>"
        )
        if code.recompiles:
            parts.append("<ol>")
            for event in code.recompiles:
                reasons = "<br>".join(
                    f"entry {esc(cid)}: <code>{esc(reason)}</code>" for cid, reason in event.reasons
                )
                parts.append(f"<li>{reasons}</li>")
            parts.append("</ol>")
        for entry in code.entries:
            kinds = ", ".join(f"{esc(k)} {v}" for k, v in entry.counts.items())
            parts.append(
                f"<h3>entry {esc(entry.compile_id)} &middot; {entry.guard_count} guards &middot;"
                f" {esc(_us(entry.guard_us))}/call &middot; ran {entry.calls}x</h3>"
                f"<p class='k'>{kinds}</p>"
            )
            if entry.note:
                parts.append(f"<p>{esc(entry.note)}</p>")
            if entry.breakdown is not None:
                for title, values in (
                    ("guard kind", entry.breakdown.by_kind),
                    ("source", entry.breakdown.by_source),
                ):
                    rows = "".join(
                        f"<tr><td class='mono'>{esc(name)}</td><td>{us:.3f}</td></tr>"
                        for name, us in sorted(values.items(), key=lambda kv: -kv[1])
                    )
                    parts.append(f"<table><tr><th>{title}</th><th>us/call</th></tr>{rows}</table>")
            expensive = entry.expensive(8)
            if expensive:
                parts.append(
                    "<table><tr><th>most expensive subtrees</th><th>us/call</th>"
                    "<th>guards</th></tr>"
                )
                for node in expensive:
                    parts.append(
                        f"<tr><td class='mono'>{esc(node.source)}</td>"
                        f"<td>{node.time_us or 0.0:.3f}</td><td>{node.guard_count}</td></tr>"
                    )
                parts.append("</table>")
            parts.append(_html_node(entry.tree, 0))
    parts.append("</body></html>")
    return "\n".join(parts)
