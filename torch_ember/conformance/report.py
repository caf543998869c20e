"""Totals, grouping of failures by cause, and the JSON and Markdown reports.

A report is of one sweep, in one mode (``meta["mode"]``: ``parity``, values
compared bitwise, or ``default``, with OpInfo's tolerances; see
:mod:`.modes`). The default sweep's report also lists the tasks that pass
only with tolerance (their values differ bitwise from CPU's: where the
device's own kernels run), and either report lists where it disagrees with
the other mode's sweep when those results are at hand.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

STATUSES = (
    "pass",
    "mismatch",
    "error_ember_only",
    "crash",
    "timeout",
    "harness_error",
    "unsupported_on_cpu",
)
EXCLUDED = ("unsupported_on_cpu",)
FAILING = tuple(s for s in STATUSES if s not in ("pass", *EXCLUDED))

_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_NUMBER = re.compile(r"(?<![A-Za-z_])[-+]?\d+(\.\d+)?([eE][-+]?\d+)?")
_QUOTED_TENSOR = re.compile(r"tensor\(.*?\)", re.DOTALL)


def normalize(text: str) -> str:
    """One stable line for grouping: first line, numbers and addresses stripped."""
    text = str(text or "").strip()
    line = text.splitlines()[0] if text else ""
    line = _QUOTED_TENSOR.sub("tensor(...)", line)
    line = _ADDRESS.sub("ADDR", line)
    line = _NUMBER.sub("N", line)
    line = re.sub(r"\s+", " ", line).strip()
    return line[:200]


def cause_of(record: dict) -> str:
    status = record["status"]
    if status in ("mismatch", "crash", "timeout") and record.get("cause"):
        return normalize(record["cause"])
    error = record.get("error", "")
    cause = record.get("cause", "")
    prefix = ""
    if cause.startswith(("out= (", "backward:", "forward:")):
        prefix = cause.split(":")[0] + ": "
    return prefix + normalize(error) if error else normalize(cause) or "unknown"


def totals(records: list[dict]) -> dict:
    """Per kind (and overall): counts of each status and the pass rate."""
    by_kind: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(STATUSES, 0))
    samples: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    inexact: dict[str, int] = defaultdict(int)
    for record in records:
        for kind in (record["kind"], "all"):
            by_kind[kind][record["status"]] = by_kind[kind].get(record["status"], 0) + 1
            for outcome, n in record.get("counts", {}).items():
                samples[kind][outcome] += n
            if tolerance_only(record):
                inexact[kind] += 1
    out = {}
    for kind, counts in by_kind.items():
        total = sum(counts.values())
        compared = total - sum(counts[s] for s in EXCLUDED)
        out[kind] = {
            "tasks": total,
            "compared": compared,
            **counts,
            "inexact": inexact[kind],
            "pass_rate": round(counts["pass"] / compared, 4) if compared else None,
            "samples": dict(samples[kind]),
        }
    return out


def tolerance_only(record: dict) -> bool:
    """A passing task with samples whose values differ bitwise from CPU's."""
    return record["status"] == "pass" and bool(record.get("inexact"))


def disagreements(records: list[dict], other: list[dict]) -> dict[str, list[tuple[dict, dict]]]:
    """Tasks of both sweeps that pass in one and fail in the other:
    ``{"fail_here": [(record, other_record)], "pass_here": [...]}``."""
    theirs = {r["key"]: r for r in other}
    out: dict[str, list[tuple[dict, dict]]] = {"fail_here": [], "pass_here": []}
    for record in sorted(records, key=lambda r: r["key"]):
        twin = theirs.get(record["key"])
        if twin is None:
            continue
        if record["status"] in FAILING and twin["status"] == "pass":
            out["fail_here"].append((record, twin))
        elif record["status"] == "pass" and twin["status"] in FAILING:
            out["pass_here"].append((record, twin))
    return out


def groups(records: list[dict]) -> list[dict]:
    """Non-passing records grouped by (status, normalized cause), largest first."""
    grouped: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for record in records:
        if record["status"] in FAILING:
            grouped[(record["status"], cause_of(record))].append(record)
    out = [
        {"status": status, "cause": cause, "count": len(items), "records": items}
        for (status, cause), items in grouped.items()
    ]
    out.sort(key=lambda g: (-g["count"], g["status"], g["cause"]))
    return out


def write_json(path: Path, records: list[dict], meta: dict, other=None) -> dict:
    """``other``: (mode, records, records of another build) of the other sweep, or None."""
    summary = {
        "meta": meta,
        "totals": totals(records),
        "groups": [
            {k: v for k, v in g.items() if k != "records"}
            | {"keys": [r["key"] for r in g["records"]]}
            for g in groups(records)
        ],
        "tolerance_only": sorted(r["key"] for r in records if tolerance_only(r)),
        "results": sorted(records, key=lambda r: r["key"]),
    }
    if other is not None:
        split = disagreements(records, other[1])
        summary["against"] = {
            "mode": other[0],
            "tasks": len(other[1]),
            "other_build": other[2],
            "fail_here_pass_there": [r["key"] for r, _ in split["fail_here"]],
            "pass_here_fail_there": [r["key"] for r, _ in split["pass_here"]],
        }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def _pct(value) -> str:
    return "n/a" if value is None else f"{100 * value:.2f}%"


def _md_escape(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _first_failure(record: dict) -> dict:
    failures = record.get("failures") or []
    return failures[0] if failures else {}


_COMMON_INTRO = [
    "PyTorch's own operator database (`op_db`, OpInfo) and module database",
    "(`module_db`, ModuleInfo) run on the device and on CPU, sample by sample.",
    "",
]
_TASKS = [
    "- A task is one op-dtype-variant (forward: `op`, `inplace`, `out` with a",
    "  pre-sized and an empty out; backward: `grad`) or one module-dtype-mode",
    "  (`train`, `eval`: forward, then gradients of inputs and parameters), for",
    "  every dtype the op supports on CPU.",
    "- Samples are generated on CPU and copied with their layout (strides,",
    "  offsets, expanded dims) to the device; tensors the sample function keeps",
    "  on CPU when asked for the device (e.g. `tensor_split` indices) stay there.",
    "  Both calls run with the same RNG seed.",
]
_MODE_INTRO = {
    "parity": [
        "**Mode `parity`, compared bitwise.** The device runs with",
        "`torch.backends.ember.cpu_parity = True` (`EMBER_CPU_PARITY=1`): every",
        "op on CPU's own kernel. (`make conformance` also runs the `default`",
        "sweep, the device's own kernels compared with OpInfo's tolerances:",
        "`docs/conformance-default.md`.)",
        "",
        *_TASKS,
        "- Compared bitwise: dtype, shape, strides, conj/neg bits, values (and their",
        "  bytes), the inputs after the call, and aliasing (in-place and `out=`",
        "  results are the argument object; views alias their input). Random ops",
        "  (and dropout samples of attention) are compared for structure only;",
        "  `linalg.lstsq` with the `gelsy` driver, whose result is not reproducible",
        "  on CPU itself (it depends on the prior contents of reused memory), with",
        "  `assert_close`'s default tolerances.",
        "- Backward: `autograd.grad` of the outputs with the same seeded random",
        "  `grad_outputs` on both sides, compared bitwise.",
    ],
    "default": [
        "**Mode `default`, compared with OpInfo's tolerances.** The device runs as",
        "it does by default (`cpu_parity` off): ember's own kernels where it has",
        "them (e.g. oneDNN and the packed-weight GEMM for the matmul family).",
        "(`make conformance` also runs the `parity` sweep, CPU's kernels compared",
        "bitwise: `docs/conformance.md`.)",
        "",
        *_TASKS,
        "- Compared exactly, as in the parity sweep: dtype, shape, strides, layout,",
        "  conj/neg bits, requires_grad, and aliasing (in-place and `out=` results",
        "  are the argument object; views alias their input).",
        "- Values (outputs, the inputs after the call, gradients) are compared the",
        "  way PyTorch's device-generic tests compare a device with CPU:",
        "  `torch.testing.assert_close(equal_nan=True)` with the dtype's default",
        "  `rtol`/`atol` (float32 1.3e-6/1e-5, bfloat16 1.6e-2/1e-5, float16",
        "  1e-3/1e-5, float64 1e-7/1e-7; integers and bool exactly), raised to the",
        "  OpInfo's own `precisionOverride`/`toleranceOverride` for the task's",
        "  dtype as `TestCase.assertEqual` does: the op's bare decorators and its",
        "  `DecorateInfo`s active for `TestCommon.test_compare_cpu` on this device",
        "  type (modules: `TestModule.test_cpu_gpu_parity`). Nothing looser.",
        "- A passing task with any sample whose values differ bitwise from CPU's",
        "  passes *with tolerance only*: listed below with the greatest differences",
        "  observed (where the device's own kernels ran).",
        "- Random ops (and dropout samples of attention) are compared for structure",
        "  only; `linalg.lstsq` with the `gelsy` driver (not reproducible on CPU",
        "  itself) with `assert_close`'s default tolerances.",
    ],
}
_STATUS_TEXT = [
    "- Status of a task: `mismatch` if any sample differs, else",
    "  `error_ember_only` if any sample raised on the device only, else `pass`;",
    "  `crash`/`timeout` when the worker died or stalled; `unsupported_on_cpu`",
    "  (excluded from the pass rate) when no sample ran on CPU.",
    "",
]


def _num(value) -> str:
    return "" if value is None else f"{value:.3g}"


def markdown(records: list[dict], meta: dict, other=None) -> str:
    """The report of one sweep; ``other``: see :func:`write_json`."""
    mode = meta.get("mode", "parity")
    table = totals(records)
    lines = [
        f"# Conformance: {mode} mode",
        "",
        "<!-- Generated by `python -m torch_ember.conformance`; do not edit by hand. -->",
        "",
        *_COMMON_INTRO,
        *_MODE_INTRO.get(mode, _MODE_INTRO["parity"]),
        *_STATUS_TEXT,
    ]
    keys = ("command", "mode", "comparison", "cpu_parity", "device", "torch", "commit", "build")
    for key in (*keys, "date", "wall_seconds", "jobs", "threads"):
        if meta.get(key) is not None:
            lines.append(f"- {key.replace('_', ' ')}: `{meta[key]}`")
    inexact = mode != "parity"
    lines += [
        "",
        "## Totals",
        "",
        (
            "| kind | tasks | compared | pass | mismatch | error (device only) | crash | timeout "
            "| excluded | pass rate | samples passed |"
            + (" pass with tolerance only |" if inexact else "")
        ),
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
        + (" --- |" if inexact else ""),
    ]
    for kind in ("forward", "backward", "modules", "all"):
        if kind not in table:
            continue
        row = table[kind]
        lines.append(
            f"| {kind} | {row['tasks']} | {row['compared']} | {row['pass']} | {row['mismatch']} "
            f"| {row['error_ember_only']} | {row['crash']} | {row['timeout']} "
            f"| {row['unsupported_on_cpu']} | **{_pct(row['pass_rate'])}** "
            f"| {row['samples'].get('pass', 0)} |" + (f" {row['inexact']} |" if inexact else "")
        )
    harness = table.get("all", {}).get("harness_error", 0)
    if harness:
        lines += ["", f"Harness errors (a bug in the kit, not the device): {harness}."]
    failure_groups = groups(records)
    lines += ["", "## Failures by cause", ""]
    if not failure_groups:
        lines.append("None: every compared task passed.")
    for number, group in enumerate(failure_groups, 1):
        lines += _group_markdown(number, group)
    if other is not None:
        lines += _against_markdown(mode, records, other)
    if inexact:
        lines += _tolerance_only_markdown(records)
    random_diffs = [r for r in records if r.get("random_value_diffs")]
    if random_diffs:
        lines += [
            "",
            "## Random ops whose values differed (structure-only; informational)",
            "",
        ]
        for record in sorted(random_diffs, key=lambda r: r["key"]):
            lines.append(f"- `{record['key']}`: {record['random_value_diffs']} sample(s)")
    lines += [
        "",
        "## Reproducing",
        "",
        "Rerun one task in-process and print the failing samples with tracebacks:",
        "",
        "```",
        f"python -m torch_ember.conformance --mode {mode} --repro 'forward|add|float32|out'",
        f"python -m torch_ember.conformance --mode {mode} --repro 'forward|add|float32|out' --sample 0",
        "```",
        "",
    ]
    return "\n".join(lines)


def _against_markdown(mode: str, records: list[dict], other) -> list[str]:
    other_mode, other_records, other_build = other
    split = disagreements(records, other_records)
    builds = f" ({other_build} of them from another build than this sweep's)" if other_build else ""
    lines = [
        "",
        f"## Against the {other_mode} sweep",
        "",
        f"The {other_mode} sweep's results for the same tasks: {len(other_records)}",
        f"tasks{builds}. Where the two disagree:",
        "",
        f"### Failing here, passing in the {other_mode} sweep ({len(split['fail_here'])})",
        "",
    ]
    if split["fail_here"]:
        lines += [
            "| task | status | cause | max abs diff | max rel diff |",
            "| --- | --- | --- | --- | --- |",
        ]
        for record, _ in split["fail_here"]:
            lines.append(
                f"| `{record['key']}` | {record['status']} | {_md_escape(cause_of(record))[:120]} "
                f"| {_num(record.get('max_abs'))} | {_num(record.get('max_rel'))} |"
            )
    else:
        lines.append("None.")
    lines += [
        "",
        f"### Passing here, failing in the {other_mode} sweep ({len(split['pass_here'])})",
        "",
    ]
    if split["pass_here"]:
        lines += [f"| task | {other_mode} status | {other_mode} cause |", "| --- | --- | --- |"]
        for record, twin in split["pass_here"]:
            lines.append(
                f"| `{record['key']}` | {twin['status']} | {_md_escape(cause_of(twin))[:120]} |"
            )
    else:
        lines.append("None.")
    return lines


def _tolerance_only_markdown(records: list[dict]) -> list[str]:
    inexact = [r for r in records if tolerance_only(r)]
    lines = [
        "",
        f"## Passing with tolerance only ({len(inexact)} tasks)",
        "",
        "These tasks pass, but in some samples their values differ bitwise from",
        "CPU's (within the tolerances above): the device computed them its own way.",
        "Greatest differences over the samples and dtypes of each row.",
        "",
    ]
    if not inexact:
        return [*lines, "None: every passing task is bitwise equal to CPU."]
    by_case: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    for record in inexact:
        by_case[(record["kind"], record["name"], record["variant"])].append(record)
    lines += [
        (
            "| kind | name | variant | dtypes | samples not bitwise | max abs diff "
            "| max rel diff | first seen in |"
        ),
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for (kind, name, variant), items in sorted(by_case.items()):
        dtypes = ", ".join(sorted(r["dtype"] for r in items))
        differing = sum(r["inexact"].get("samples", 0) for r in items)
        passed = sum(r.get("counts", {}).get("pass", 0) for r in items)
        abs_values = [r["inexact"].get("max_abs") for r in items]
        rel_values = [r["inexact"].get("max_rel") for r in items]
        max_abs = max((v for v in abs_values if v is not None), default=None)
        max_rel = max((v for v in rel_values if v is not None), default=None)
        where = _md_escape(items[0]["inexact"].get("where", ""))
        lines.append(
            f"| {kind} | `{name}` | {variant} | {dtypes} | {differing}/{passed} "
            f"| {_num(max_abs)} | {_num(max_rel)} | {where} |"
        )
    return lines


def _group_markdown(number: int, group: dict) -> list[str]:
    records = group["records"]
    example = records[0]
    detail = _first_failure(example)
    sample = detail.get("sample", example.get("sample"))
    lines = [
        f"### {number}. {group['status']}: {group['cause']} ({group['count']})",
        "",
        f"Example: `{example['key']}`" + (f", sample {sample}" if sample is not None else ""),
        "",
        "```",
        str(detail.get("error") or example.get("error", ""))[:700],
    ]
    if detail.get("input") or example.get("input"):
        lines.append("input: " + str(detail.get("input") or example.get("input"))[:400])
    if example.get("stderr"):
        lines.append("stderr: " + example["stderr"][-600:])
    lines += ["```", ""]
    by_case: dict[tuple[str, str, str], list[dict]] = defaultdict(list)
    for record in records:
        by_case[(record["kind"], record["name"], record["variant"])].append(record)
    diffs = any(r.get("max_abs") is not None for r in records)
    lines += [
        "| kind | name | variant | dtypes | first error |" + (" max abs diff |" if diffs else ""),
        "| --- | --- | --- | --- | --- |" + (" --- |" if diffs else ""),
    ]
    for (kind, name, variant), items in sorted(by_case.items()):
        dtypes = ", ".join(sorted(r["dtype"] for r in items))
        first = _first_failure(items[0])
        error = first.get("error") or items[0].get("error", "")
        row = f"| {kind} | `{name}` | {variant} | {dtypes} | {_md_escape(str(error)[:160])} |"
        if diffs:
            values = [r.get("max_abs") for r in items if r.get("max_abs") is not None]
            row += f" {_num(max(values)) if values else ''} |"
        lines.append(row)
    lines.append("")
    return lines


def write_markdown(path: Path, records: list[dict], meta: dict, other=None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(markdown(records, meta, other))
