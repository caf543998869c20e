"""ember's graph passes for ``torch.compile(backend="ember")``, one file per pass.

Each pass in :data:`PASSES` is ``fn(gm, options) -> int``: it rewrites or
annotates the post-grad ATen graph of an *inference* graph whose parameters
Inductor froze into constants (``get_attr`` nodes), and returns how many
nodes it changed. :func:`run` applies them in order and adds the counts to
:data:`counters`. ``freezing.py`` is the step before them: it runs on
Dynamo's graph, in the backend, so that Inductor freezes at all.

| pass | what |
|---|---|
| ``linear_activation`` | a small one-row linear + activation as one generated C++ kernel; optionally (``template=True``) the activation as a C++ GEMM template's epilogue (many rows) |
| ``packed_gemm`` | every other frozen GEMM (and, in graphs compiled with grad disabled, every GEMM whose B is a graph input) as ``torch.ops.ember.gemm``: the runtime's packed-weight route (``csrc/ops/kernels/matmul/FastGemm.cpp``: the weight packed once, the skinny kernel or oneDNN's packed matmul) with its result used as returned, not copied into an ``out=`` buffer |

The passes run for ``backend="ember"`` and, through the device's post-grad
hook (``inductor_backend.EmberGraphPass``), for the default Inductor backend
on ember graphs too; they change frozen GEMMs (inference graphs compiled with
``torch._inductor.config.freezing``) and GEMMs on graph inputs in graphs
compiled with grad disabled.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch

from torch_ember.compile.passes._gemm import TEMPLATE_META as TEMPLATE_META
from torch_ember.compile.passes.linear_activation import linear_activation
from torch_ember.compile.passes.packed_gemm import packed_gemm

counters: Counter[str] = Counter()
"""Nodes changed by each pass, summed over every graph compiled since the last reset."""


@dataclass(frozen=True)
class Options:
    small_m: int = 16  # GEMMs with at most this many rows are never offered the template
    # offer Inductor's C++ GEMM template (fused epilogue); off: ember's packed
    # oneDNN route measured faster on every transformer shape
    template: bool = False
    # one-row GEMMs up to this many weight elements: one C++ reduction kernel.
    # Back to back the skinny packed GEMM calls replayed as a graph were
    # faster; in the suite's pattern (pauses between samples) this was
    # (docs/compile.md)
    fuse_max_weight: int = 1 << 16


PASSES: dict[str, Callable[[torch.fx.GraphModule, Options], int]] = {
    "linear_activation": linear_activation,
    "packed_gemm": packed_gemm,
}

DONE_META = "ember_passes_done"  # on a GraphModule's meta: the passes already ran on it


def run(gm: torch.fx.GraphModule, options: Options) -> dict[str, int]:
    gm.meta[DONE_META] = True
    counts = {}
    for name, fn in PASSES.items():
        counts[name] = fn(gm, options)
        counters[name] += counts[name]
    if any(counts.values()):
        gm.graph.lint()
    return counts


def reset_counters() -> None:
    counters.clear()
