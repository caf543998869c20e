"""ember's graph passes for ``torch.compile(backend="ember")``, one file per pass.

Each pass in :data:`PASSES` is ``fn(gm, options) -> int``: it rewrites or
annotates the post-grad ATen graph of an *inference* graph whose parameters
Inductor froze into constants (``get_attr`` nodes), and returns how many
nodes it changed. :func:`run` applies them in order and adds the counts to
:data:`counters`. ``freezing.py`` is the step before them: it runs on
Dynamo's graph, in the backend, so that Inductor freezes at all.

| pass | what |
|---|---|
| ``prepack_weights`` | weight prepacking: one-row GEMMs read their frozen weight row-major |
| ``linear_activation`` | linear + activation in one generated C++ kernel (one row), or the activation as a C++ GEMM template's epilogue (many rows) |
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch

from torch_ember.compile.passes._gemm import TEMPLATE_META as TEMPLATE_META
from torch_ember.compile.passes.linear_activation import linear_activation
from torch_ember.compile.passes.prepack_weights import prepack_weights

counters: Counter[str] = Counter()
"""Nodes changed by each pass, summed over every graph compiled since the last reset."""


@dataclass(frozen=True)
class Options:
    small_m: int = 16  # GEMMs with at most this many rows are never offered the template
    template: bool = True  # offer Inductor's C++ GEMM template (prepacked, fused epilogue)
    fuse_max_weight: int = 1 << 20  # one-row GEMMs up to this many weight elements: C++ kernels


PASSES: dict[str, Callable[[torch.fx.GraphModule, Options], int]] = {
    "prepack_weights": prepack_weights,  # first: the fused one-row kernels read row-major W
    "linear_activation": linear_activation,
}


def run(gm: torch.fx.GraphModule, options: Options) -> dict[str, int]:
    counts = {}
    for name, fn in PASSES.items():
        counts[name] = fn(gm, options)
        counters[name] += counts[name]
    if any(counts.values()):
        gm.graph.lint()
    return counts


def reset_counters() -> None:
    counters.clear()
