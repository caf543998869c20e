"""Frozen GEMMs as ``torch.ops.ember.gemm``: the packed route's result used as returned.

Inductor calls an ATen GEMM through its ``out=`` form (``addmm(..., out=buf)``
into a buffer it allocated). ember's packed route for more than 16 rows is
oneDNN's matmul on the packed weight, which writes only into memory it
allocates, so every such call paid a copy of its result (BERT-base: 2 copies
per GEMM, 3% of the run). ``ember.gemm(bias, x, W)`` is the same product as a
value-returning op; Inductor runs it as a fallback kernel and keeps its
result. Left alone: GEMMs of at most ``options.small_m`` rows (the skinny
kernel writes into ``out=`` directly, and a fallback kernel's call costs more
than ``addmm.out``'s at one row), GEMMs annotated for the C++ template, and every GEMM when
the user asked Inductor to autotune them (``max_autotune``/``max_autotune_gemm``).
"""

from __future__ import annotations

import torch
from torch._inductor import config as inductor_config

from torch_ember.compile.passes._gemm import TEMPLATE_META, frozen_gemms

aten = torch.ops.aten


def packed_gemm(gm: torch.fx.GraphModule, options) -> int:
    if inductor_config.max_autotune or inductor_config.max_autotune_gemm:
        return 0
    changed = 0
    graph = gm.graph
    for gemm in frozen_gemms(gm):
        node = gemm.node
        if TEMPLATE_META in node.meta or (gemm.rows is not None and gemm.rows <= options.small_m):
            continue
        bias = node.args[0] if node.target is aten.addmm.default else None
        x = node.args[gemm.weight_index - 1]
        with graph.inserting_before(node):
            new = graph.call_function(torch.ops.ember.gemm.default, (bias, x, gemm.weight))
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        changed += 1
    return changed
