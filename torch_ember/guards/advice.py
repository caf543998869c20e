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
    r"tensor '(?P<name>.+?)' size mismatch at index (?P<dim>\d+)\. "
    r"expected (?P<expected>\d+), actual (?P<actual>\d+)"
)
_SYMBOLIC_SIZE = re.compile(r"(?P<name>[A-Za-z_][\w\.\[\]'\"]*)\.size\(\)\[(?P<dim>\d+)\]")
_TENSOR_PROPERTY = re.compile(
    r"tensor '(?P<name>.+?)' (?P<what>dtype|device|requires_grad|stride|dispatch key set)"
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
    # What following the advice is predicted to save, in words; the figures
    # are in data["saving"] (compile_s, recompiles, guard_us_per_call).
    saving: str = ""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _values(pairs: list[tuple[str, str]]) -> list[str]:
    out: list[str] = []
    for expected, actual in pairs:
        for value in (expected, actual):
            if value not in out:
                out.append(value)
    return out


_KEYWORD = re.compile(r"^(?P<base>\w+)\[['\"](?P<key>\w+)['\"]\]$")
_POSITIONAL = re.compile(r"^(?P<base>\w+)\[(?P<index>\d+)\]$")


def _as_passed(name: str) -> tuple[str, str]:
    """(variable to write in the fix, how the caller passes it) for a tensor
    named as in a guard reason: ``kwargs['input_ids']`` is the tensor the
    caller passes as ``input_ids=...`` through a ``**kwargs`` wrapper (every
    transformers model), ``args[0]`` the first positional argument through
    ``*args``, ``x`` the parameter ``x``."""
    if match := _KEYWORD.match(name):
        return match["key"], f"passed as {match['key']}=..."
    if match := _POSITIONAL.match(name):
        return f"arg{match['index']}", f"passed as positional argument {match['index']}"
    return name, f"passed as `{name}`"


def _changing_together(code: CodeProfile, name: str, dim: int) -> list[str]:
    """Inputs whose dimension ``dim`` changed between cache entries exactly as
    ``name``'s did (same size in every entry): they must be marked dynamic
    together, or Dynamo specializes the marked dimension to the other's
    constant size (and errors out)."""
    shapes = [e.input_shapes for e in code.entries if name in e.input_shapes]
    if len(shapes) < 2:
        return [name]
    sizes = [s[name][dim] if len(s[name]) > dim else None for s in shapes]
    together = [name]
    for other in shapes[0]:
        if other == name or not all(other in s for s in shapes):
            continue
        other_sizes = [s[other][dim] if len(s[other]) > dim else None for s in shapes]
        if other_sizes == sizes:
            together.append(other)
    return together


def _compile_seconds(code: CodeProfile) -> dict[str, float]:
    """Compile time of each cache entry of ``code`` (Dynamo's compilation
    metrics, by compile id)."""
    try:
        from torch._dynamo.utils import get_compilation_metrics

        metrics = get_compilation_metrics()
    except (ImportError, AttributeError):
        return {}
    ids = {e.compile_id for e in code.entries}
    out: dict[str, float] = {}
    for m in metrics:
        if m.co_name == code.name and m.co_filename == code.filename and m.compile_id in ids:
            seconds = getattr(m, "entire_frame_compile_time_s", None)
            if seconds is not None:
                out[str(m.compile_id)] = float(seconds)
    return out


def _recompile_saving(code: CodeProfile, recompiles: int) -> tuple[str, dict[str, Any]]:
    """The compile time ``recompiles`` fewer recompiles save: the median
    compile time of the entries that recompiles created (all but the first)."""
    seconds = _compile_seconds(code)
    later = [seconds[e.compile_id] for e in code.entries[1:] if e.compile_id in seconds]
    data: dict[str, Any] = {"recompiles": recompiles, "cache_entries": recompiles}
    if not later:
        return f"{recompiles} recompile(s) and cache entr(ies) fewer", data
    each = sorted(later)[len(later) // 2]
    data["compile_s"] = round(each * recompiles, 3)
    text = (
        f"{recompiles} recompile(s) fewer: ~{each * recompiles:.2f} s of compiling"
        f" ({each:.2f} s each, measured), and {recompiles} cache entr(ies) fewer to check"
    )
    return text, data


def _runs_with_kv_cache(code: CodeProfile) -> bool:
    return any(
        "past_key_values" in node.source for entry in code.entries for node in entry.tree.walk()
    )


def _dimension_advice(
    code: CodeProfile, name: str, dim: int, count: int, values: list[str], zero_one: bool
) -> Advice:
    seen = f" (sizes seen: {', '.join(values)})" if values else ""
    saving, saving_data = _recompile_saving(code, count)
    data: dict[str, Any] = {"tensor": name, "dim": dim, "recompiles": count, "sizes": values}
    data["saving"] = saving_data
    if "past_key_values" in name or "cache" in name.lower():
        # The KV cache grows by one position per generated token.
        return Advice(
            kind="dynamic_dimension",
            severity="medium",
            where=code.location,
            message=(
                f"dimension {dim} of `{name}` (the KV cache length) grows during generation"
                f"{seen}: {count} recompile(s) until Dynamo makes it dynamic."
            ),
            fix=(
                "use a static cache, so that every decode step has the same shapes:"
                " model.generate(..., cache_implementation='static')"
            ),
            data=data,
            saving=saving,
        )
    if "1" in values and _runs_with_kv_cache(code):
        # A decoder's prompt (prefill) and its one-token decode steps.
        return Advice(
            kind="prefill_decode",
            severity="info",
            where=code.location,
            message=(
                f"dimension {dim} of `{name}` is the prompt length at prefill and 1 at each"
                f" decode step{seen}: prefill and decode get a graph each, as expected in"
                " generate()."
            ),
            data=data,
        )
    together = _changing_together(code, name, dim)
    variables = [_as_passed(n) for n in together]
    data["keyword"] = _KEYWORD.match(name)["key"] if _KEYWORD.match(name) else None
    data["mark_together"] = together
    marks = "; ".join(f"torch._dynamo.mark_dynamic({var}, {dim})" for var, _ in variables)
    passed = ", ".join(f"`{var}` {how}" for var, how in variables)
    fix = f"{marks}  # {passed}; before the first compiled call"
    extra = ""
    if zero_one or any(v in ("0", "1") for v in values):
        first = variables[0][0]
        extra = (
            " Sizes 0 and 1 are specialized even for dynamic dimensions: if they occur, use"
            f" torch._dynamo.decorators.mark_unbacked({first}, {dim}) instead."
        )
    also = ""
    if len(together) > 1:
        others = ", ".join(f"`{n}`" for n in together[1:])
        also = f" {others} changed with it in every entry: mark them together."
    return Advice(
        kind="dynamic_dimension",
        severity="high" if count >= 2 else "medium",
        where=code.location,
        message=(
            f"dimension {dim} of `{name}` ({variables[0][1]}) keeps changing{seen}:"
            f" {count} recompile(s).{also} Mark it dynamic so that one graph serves every"
            f" size, or compile with dynamic=True.{extra}"
        ),
        fix=fix,
        data=data,
        saving=saving,
    )


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
        if count:
            values = _values(pairs)
            out.append(_dimension_advice(code, name, dim, count, values, (name, dim) in zero_one))
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
    for item in out:
        # Every recompile-caused item predicts the compile time it saves.
        recompiles = item.data.get("recompiles", len(item.data.get("values", [])))
        if not item.saving and recompiles and item.kind != "prefill_decode":
            item.saving, item.data["saving"] = _recompile_saving(code, recompiles)
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
    for item in out:
        if item.kind == "recompile_limit" and not item.saving and entries > 1:
            # Fixing the causes leaves one entry: every recompile after the first compile.
            item.saving, item.data["saving"] = _recompile_saving(code, entries - 1)
    return out


def _cost_advice(profile: GuardProfile, code: CodeProfile) -> list[Advice]:
    out = []
    timed = [e for e in code.entries if e.guard_us is not None and e.module_guard_us is not None]
    # One piece of advice per code object: about the entry that runs most.
    for entry in sorted(timed, key=lambda e: (e.calls, e.guard_us or 0.0), reverse=True)[:1]:
        assert entry.guard_us is not None and entry.module_guard_us is not None
        if entry.module_guard_us < 0.5 or entry.module_guard_us < 0.3 * entry.guard_us:
            continue
        share = profile.call_us and entry.module_guard_us / profile.call_us
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
                    "torch_ember.guards.optimize(model, args, example_kwargs=kwargs)  or"
                    "  torch.compile("
                    "model, options={'guard_filter_fn':"
                    " torch.compiler.skip_guard_on_all_nn_modules_unsafe})"
                ),
                data={
                    "module_guard_us": round(entry.module_guard_us, 4),
                    "guard_us": round(entry.guard_us, 4),
                    "module_guard_count": entry.module_guard_count,
                    "saving": {"guard_us_per_call": round(entry.module_guard_us, 4)},
                },
                saving=(
                    f"~{entry.module_guard_us:.2f} us of guard time per call{share_text}"
                    f" ({entry.module_guard_count} guards fewer)"
                ),
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
    per_code = [sum(e.guard_us or 0.0 for e in code.entries if e.calls) for code in ran]
    extra = round(sum(per_code) - max(per_code), 4)
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
            data={"frames": [code.name for code in ran], "saving": {"guard_us_per_call": extra}},
            saving=(
                f"up to {extra:.2f} us of guard time per call (the guards of every frame"
                " but the busiest; the merged frame keeps the guards it needs)"
            ),
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
