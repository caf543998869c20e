"""Concrete advice drawn from a guard profile.

Each rule reads what the profiler saw (recompile reasons, cache sizes, guard
costs) and names the value to change and how. Structured fields (``data``)
carry the diagnosis itself, e.g. the tensor and dimension that keeps changing,
so that tools and tests need not parse the message.
"""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .profiler import CodeProfile, GuardProfile

_SIZE = re.compile(
    r"tensor '(?P<name>[^']+)' size mismatch at index (?P<dim>\d+)\. "
    r"expected (?P<expected>\d+), actual (?P<actual>\d+)"
)
_SYMBOLIC_SIZE = re.compile(r"(?P<name>[A-Za-z_][\w\.\[\]'\"]*)\.size\(\)\[(?P<dim>\d+)\]")
_TENSOR_PROPERTY = re.compile(
    r"tensor '(?P<name>[^']+)' (?P<what>dtype|device|requires_grad|stride|dispatch key set)"
    r" mismatch(?P<rest>.*)"
)
_CONSTANT = re.compile(
    r"^(?P<name>[A-Za-z_][\w\.\[\]'\"]*) == (?P<value>-?(?:\d+\.?\d*(?:e[+-]?\d+)?|inf|nan)|True|False)$"
)
_GLOBAL_STATE = re.compile(r"GLOBAL_STATE changed: (?P<what>.*)")
_IDENTITY = re.compile(r"___check_(?:obj|type)_id\((?P<name>[^,]+),")

SEVERITIES = ("high", "medium", "info")


@dataclasses.dataclass
class Advice:
    kind: str
    severity: str
    where: str
    message: str
    fix: str = ""
    data: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _values(pairs: list[tuple[str, str]]) -> list[str]:
    out: list[str] = []
    for expected, actual in pairs:
        for value in (expected, actual):
            if value not in out:
                out.append(value)
    return out


def _recompile_advice(code: CodeProfile) -> list[Advice]:
    where = code.location
    dims: dict[tuple[str, int], list[tuple[str, str]]] = {}
    dim_events: dict[tuple[str, int], set[int]] = {}
    zero_one: set[tuple[str, int]] = set()
    constants: dict[str, list[str]] = {}
    properties: dict[tuple[str, str], list[str]] = {}
    global_state: dict[str, int] = {}
    identities: dict[str, int] = {}
    other: dict[str, int] = {}

    for event in code.recompiles:
        # The reason against the most recent entry explains the recompile;
        # older entries usually fail on the same value.
        for position, (_, reason) in enumerate(event.reasons):
            primary = position == 0
            if match := _SIZE.search(reason):
                # Sizes come from every refused entry; the recompile counts
                # for this dimension only if it caused it.
                key = (match["name"], int(match["dim"]))
                dims.setdefault(key, []).append((match["expected"], match["actual"]))
                dim_events.setdefault(key, set())
                if primary:
                    dim_events[key].add(event.index)
            elif primary and (match := _SYMBOLIC_SIZE.search(reason)):
                key = (match["name"], int(match["dim"]))
                dims.setdefault(key, [])
                dim_events.setdefault(key, set()).add(event.index)
                if "0/1 specialization" in reason:
                    zero_one.add(key)
            elif not primary:
                continue
            elif match := _TENSOR_PROPERTY.search(reason):
                key = (match["name"], match["what"])
                properties.setdefault(key, []).append(match["rest"].strip(". "))
            elif match := _CONSTANT.match(reason):
                constants.setdefault(match["name"], []).append(match["value"])
            elif match := _GLOBAL_STATE.search(reason):
                what = match["what"].strip() or "global state"
                global_state[what] = global_state.get(what, 0) + 1
            elif match := _IDENTITY.search(reason):
                name = match["name"].strip()
                identities[name] = identities.get(name, 0) + 1
            else:
                other[reason] = other.get(reason, 0) + 1

    out = []
    for (name, dim), pairs in sorted(dims.items(), key=lambda kv: -len(dim_events[kv[0]])):
        count = len(dim_events[(name, dim)])
        if count == 0:
            continue
        values = _values(pairs)
        seen = f" (sizes seen: {', '.join(values)})" if values else ""
        fix = f"torch._dynamo.mark_dynamic({name}, {dim})  # before the first compiled call"
        extra = ""
        if (name, dim) in zero_one or any(v in ("0", "1") for v in values):
            extra = (
                " Sizes 0 and 1 are specialized even for dynamic dimensions: if they occur, use"
                f" torch._dynamo.decorators.mark_unbacked({name}, {dim}) instead."
            )
        out.append(
            Advice(
                kind="dynamic_dimension",
                severity="high" if count >= 2 else "medium",
                where=where,
                message=(
                    f"dimension {dim} of `{name}` keeps changing{seen}: {count} recompile(s)."
                    f" Mark it dynamic so that one graph serves every size, or compile with"
                    f" dynamic=True.{extra}"
                ),
                fix=fix,
                data={"tensor": name, "dim": dim, "recompiles": count, "sizes": values},
            )
        )
    for name, values in constants.items():
        is_float = any(("." in v or "e" in v or v in ("inf", "nan")) for v in values)
        attribute = "." in name or "[" in name
        kind_name = "float" if is_float else "int/bool"
        if attribute:
            fix = (
                f"store `{name}` as a tensor (e.g. register_buffer) instead of a Python {kind_name}"
            )
        elif is_float:
            fix = f"pass torch.tensor({name}) instead of a Python float"
        else:
            fix = f"pass `{name}` as a tensor, or mark it dynamic (dynamic=True)"
        out.append(
            Advice(
                kind="float_to_tensor" if is_float else "specialized_constant",
                severity="high" if len(values) >= 2 else "medium",
                where=where,
                message=(
                    f"`{name}` is a Python {kind_name} baked into the graph as a constant;"
                    f" each new value recompiles (guard {name} == {', '.join(values)})."
                ),
                fix=fix,
                data={"name": name, "values": values, "attribute": attribute},
            )
        )
    for (name, what), details in properties.items():
        fixes = {
            "dtype": f"cast `{name}` to one dtype before the call",
            "device": f"move `{name}` to one device before the call",
            "requires_grad": (
                f"call consistently with or without grad for `{name}` (detach it, or use"
                " torch.no_grad()/torch.inference_mode() around every call)"
            ),
            "stride": f"pass `{name}` in one memory layout (e.g. .contiguous())",
            "dispatch key set": f"pass `{name}` with the same device/subclass/grad state",
        }
        out.append(
            Advice(
                kind=f"tensor_{what.replace(' ', '_')}",
                severity="medium",
                where=where,
                message=(
                    f"`{name}` changes {what} between calls ({'; '.join(sorted(set(details)))}):"
                    " each variant compiles its own graph."
                ),
                fix=fixes[what],
                data={"tensor": name, "property": what, "recompiles": len(details)},
            )
        )
    for what, count in global_state.items():
        out.append(
            Advice(
                kind="global_state",
                severity="medium",
                where=where,
                message=(
                    f"global state changed between calls ({what}): {count} recompile(s)."
                    " Every combination of grad mode, autocast, default dtype... gets its own graph."
                ),
                fix="keep grad mode / autocast / deterministic settings the same around all calls",
                data={"state": what, "recompiles": count},
            )
        )
    for name, count in identities.items():
        out.append(
            Advice(
                kind="object_identity",
                severity="medium",
                where=where,
                message=(
                    f"`{name}` is a different object on later calls (identity/type guard): "
                    f"{count} recompile(s)."
                ),
                fix=f"create `{name}` once and reuse it (no new lambda/module/class per call)",
                data={"name": name, "recompiles": count},
            )
        )
    for reason, count in other.items():
        out.append(
            Advice(
                kind="other_recompile",
                severity="info",
                where=where,
                message=f"recompiled {count} time(s) because: {reason}",
                data={"reason": reason, "recompiles": count},
            )
        )
    entries = len(code.entries)
    if code.ran_eagerly:
        out.append(
            Advice(
                kind="ran_eagerly",
                severity="high",
                where=where,
                message=(
                    f"the profiled call ran none of the {entries} cache entries: it ran eagerly"
                    " (uncompiled), typically because the recompile limit was hit."
                ),
                fix="see the recompile reasons; fix their cause so that one entry serves all calls",
                data={"entries": entries},
            )
        )
    if code.limit_hit is not None or entries >= code.recompile_limit:
        out.append(
            Advice(
                kind="recompile_limit",
                severity="high",
                where=where,
                message=(
                    f"recompile limit reached ({entries} cache entries, limit"
                    f" {code.recompile_limit}): later new inputs run this code eagerly."
                ),
                fix=(
                    "remove the cause of the recompiles above; only if every variant is"
                    " wanted, raise torch._dynamo.config.recompile_limit"
                ),
                data={"entries": entries, "limit": code.recompile_limit},
            )
        )
    elif entries > 1 and entries >= code.recompile_limit // 2:
        out.append(
            Advice(
                kind="recompile_limit",
                severity="medium",
                where=where,
                message=f"{entries} cache entries: half-way to the limit of {code.recompile_limit}.",
                data={"entries": entries, "limit": code.recompile_limit},
            )
        )
    return out


def _cost_advice(profile: GuardProfile, code: CodeProfile) -> list[Advice]:
    out = []
    timed = [e for e in code.entries if e.guard_us is not None and e.module_guard_us is not None]
    # One piece of advice per code object: about the entry that runs most.
    for entry in sorted(timed, key=lambda e: (e.calls, e.guard_us or 0.0), reverse=True)[:1]:
        assert entry.guard_us is not None and entry.module_guard_us is not None
        if entry.module_guard_us < 0.5 or entry.module_guard_us < 0.3 * entry.guard_us:
            continue
        share = profile.call_us and entry.guard_us / profile.call_us
        severity = "high" if share and share >= 0.05 else "medium"
        share_text = f" ({100 * share:.1f}% of the call)" if share else ""
        out.append(
            Advice(
                kind="module_guards",
                severity=severity,
                where=f"{code.location} entry {entry.compile_id}",
                message=(
                    f"{entry.module_guard_us:.2f} of {entry.guard_us:.2f} us of guard time per"
                    f" call{share_text} is spent on {entry.module_guard_count} guards on"
                    " nn.Modules and their attributes. For a model that is not modified after"
                    " compiling (frozen inference), a guard filter can skip them."
                ),
                fix=(
                    "torch_ember.guards.optimize(model, example_inputs=...)  or  torch.compile("
                    "model, options={'guard_filter_fn':"
                    " torch.compiler.skip_guard_on_all_nn_modules_unsafe})"
                ),
                data={
                    "module_guard_us": round(entry.module_guard_us, 4),
                    "guard_us": round(entry.guard_us, 4),
                    "module_guard_count": entry.module_guard_count,
                },
            )
        )
    return out


def _graph_break_advice(profile: GuardProfile) -> list[Advice]:
    if profile.mode != "profile":
        return []
    ran = [code for code in profile.codes if any(e.calls for e in code.entries)]
    if len(ran) < 2:
        return []
    guard_us = profile.guard_us
    names = ", ".join(code.name for code in ran)
    return [
        Advice(
            kind="graph_breaks",
            severity="info",
            where=ran[0].location,
            message=(
                f"one call runs {len(ran)} compiled frames ({names}): graph breaks split it,"
                f" and each frame checks its own guards ({guard_us:.2f} us per call in all)."
            ),
            fix="remove the graph breaks (torch._dynamo.explain, or fullgraph=True to find them)",
            data={"frames": [code.name for code in ran]},
        )
    ]


def advise(profile: GuardProfile) -> list[Advice]:
    """All advice for ``profile``, most severe first."""
    out: list[Advice] = []
    for code in profile.codes:
        out.extend(_recompile_advice(code))
        out.extend(_cost_advice(profile, code))
    out.extend(_graph_break_advice(profile))
    out.sort(key=lambda a: SEVERITIES.index(a.severity))
    return out
