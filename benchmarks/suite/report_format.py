"""Number and table formatting for the benchmark report (report.py)."""

from __future__ import annotations

import math


def fmt_time(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.3f} s"


def fmt_ratio(r: float | None) -> str:
    if r is None:
        return "-"
    return f"{r:.3f}x" if r < 0.1 else f"{r:.2f}x" if r < 100 else f"{r:.0f}x"


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def fmt_flops(f: float | None) -> str:
    if f is None:
        return "-"
    return f"{f / 1e9:.1f} GFLOP/s" if f < 1e12 else f"{f / 1e12:.2f} TFLOP/s"


def fmt_bw(b: float | None) -> str:
    return "-" if b is None else f"{b / 1e9:.1f} GB/s"


def fmt_pct(f: float | None) -> str:
    return "-" if f is None else f"{100 * f:.1f}%"


def fmt_sci(x: float | None) -> str:
    if x is None:
        return "-"
    return "inf" if math.isinf(x) else f"{x:.2g}"


def table(headers: list[str], rows: list[list[str]], right: set[int] | None = None) -> str:
    right = right if right is not None else set(range(1, len(headers)))
    rule = ["---:" if i in right else "---" for i in range(len(headers))]
    out = ["| " + " | ".join(headers) + " |", "| " + " | ".join(rule) + " |"]
    out += ["| " + " | ".join(str(c).replace("|", "/") for c in r) + " |" for r in rows]
    return "\n".join(out)
