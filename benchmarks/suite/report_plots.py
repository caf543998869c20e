"""The suite report's PNG plots (ratio, latency, fraction of peak)."""

from __future__ import annotations

import math
import os
from pathlib import Path

from .harness import WorkloadResult
from .report_format import fmt_ratio


def plots(results: list[WorkloadResult], out_dir: Path, rel_to: Path) -> list[str]:
    """ratio.png, latency.png, peak.png; returns their paths relative to ``rel_to``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    systems = list(dict.fromkeys(s.system for r in results for s in r.systems))
    colors = {n: plt.cm.tab10(i % 10) for i, n in enumerate(systems)}
    names = [r.name for r in results]
    width = 0.8 / max(1, len(systems))
    written = []

    def bars(ax, value, label_fmt, log=False):
        for j, sysname in enumerate(systems):
            xs, ys = [], []
            for i, r in enumerate(results):
                s = r.get(sysname)
                v = value(s) if s is not None and s.status == "ok" else None
                if v is not None:
                    xs.append(i + (j - (len(systems) - 1) / 2) * width)
                    ys.append(v)
            ax.barh(xs, ys, height=width, color=colors[sysname], label=sysname)
            for x, y in zip(xs, ys):
                ax.text(y, x, " " + label_fmt(y), va="center", fontsize=6)
        ax.set_yticks(range(len(names)), names)
        ax.invert_yaxis()
        if log:
            ax.set_xscale("log")
        ax.legend(fontsize=7, loc="best")
        ax.grid(axis="x", alpha=0.3)

    def save(fig, name: str) -> None:
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=110)
        plt.close(fig)
        written.append(out_dir / name)

    height = 1.0 + 0.35 * len(names) * max(1, len(systems)) / 2
    fig, ax = plt.subplots(figsize=(9, height))
    bars(ax, lambda s: s.ratio, fmt_ratio, log=True)
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_xlabel("median time / CPU eager median (same run; lower is faster; log scale)")
    ax.set_title("Time relative to PyTorch CPU eager (WRONG / skipped systems omitted)")
    save(fig, "ratio.png")

    cols = 3
    rows = math.ceil(len(results) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.6 * rows), squeeze=False)
    for ax, r in zip(axes.flat, results):
        ok = [s for s in r.systems if s.status == "ok" and s.median_s]
        ys = range(len(ok))
        med = [s.median_s * 1e3 for s in ok]
        err = [
            [(s.median_s - s.p10_s) * 1e3 for s in ok],
            [(s.p90_s - s.median_s) * 1e3 for s in ok],
        ]
        ax.barh(ys, med, xerr=err, color=[colors[s.system] for s in ok], capsize=2)
        ax.set_yticks(list(ys), [s.system for s in ok], fontsize=7)
        ax.invert_yaxis()
        ax.set_title(f"{r.name} (ms/{r.unit}, p10-p90)", fontsize=8)
        ax.tick_params(axis="x", labelsize=7)
    for ax in list(axes.flat)[len(results) :]:
        ax.axis("off")
    save(fig, "latency.png")

    if any(s.frac_peak for r in results for s in r.systems):
        fig, ax = plt.subplots(figsize=(9, height))
        bars(ax, lambda s: s.frac_peak and 100 * s.frac_peak, lambda y: f"{y:.0f}%")
        ax.set_xlabel("achieved FLOP/s as % of the theoretical peak (cores used, dtype)")
        ax.set_title("Fraction of the machine's peak")
        save(fig, "peak.png")
    return [os.path.relpath(p, rel_to) for p in written]
