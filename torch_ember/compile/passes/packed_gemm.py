"""Frozen GEMMs (and, in inference graphs, GEMMs whose B is a graph input) as
``torch.ops.ember.gemm``: the packed route's result used as returned, with a
following activation as oneDNN's post-op.

Inductor calls an ATen GEMM through its ``out=`` form (``addmm(..., out=buf)``
into a buffer it allocated). ember's packed route for more than 16 rows is
oneDNN's matmul on the packed weight, which writes only into memory it
allocates, so every such call paid a copy of its result (BERT-base: 2 copies
per GEMM, 3% of the run). ``ember.gemm(bias, x, W, activation)`` is the same
product as a value-returning op; Inductor runs it as a fallback kernel and
keeps its result.

An activation fed only by the GEMM (ReLU, GELU with erf or tanh, in whatever
pointwise ops the decomposition left) becomes the call's ``activation``:
oneDNN applies it to each output block while it is in cache, instead of a
generated kernel reading the whole result again. The activation is
recognised by what it computes, not by its spelling: the pointwise region
fed only by the GEMM is evaluated on probe values and compared with each
candidate (``gelu_new``'s ``pow(x, 3)`` and Inductor's ``x * x * x`` match
alike).

Left alone: GEMMs of at most ``options.small_m`` rows (the skinny kernel
writes into ``out=`` directly, and a fallback kernel's call costs more than
``addmm.out``'s at one row), GEMMs annotated for the C++ template, and every
GEMM when the user asked Inductor to autotune them
(``max_autotune``/``max_autotune_gemm``).
"""

from __future__ import annotations

import torch
from torch._inductor import config as inductor_config

from torch_ember.compile.passes._gemm import TEMPLATE_META, frozen_gemms, input_gemms

aten = torch.ops.aten

# ops an activation's decomposition is made of
POINTWISE = {
    aten.mul.Tensor,
    aten.add.Tensor,
    aten.sub.Tensor,
    aten.div.Tensor,
    aten.neg.default,
    aten.erf.default,
    aten.tanh.default,
    aten.pow.Tensor_Scalar,
    aten.relu.default,
    aten.clamp_min.default,
}
RESHAPES = {aten.view.default, aten.reshape.default, aten._unsafe_view.default}
MAX_REGION = 16

_PROBE = torch.cat([torch.linspace(-10.0, 10.0, 4001), torch.tensor([0.0, -0.0, 1e-6, -1e-6])])
CANDIDATES = {
    "relu": torch.relu,
    "gelu": torch.nn.functional.gelu,
    "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
}


def _region(root: torch.fx.Node) -> list[torch.fx.Node] | None:
    """The pointwise nodes computed from ``root`` alone, in graph order, or None."""
    region: list[torch.fx.Node] = []
    inside = {root}
    frontier = [root]
    while frontier and len(region) <= MAX_REGION:
        # a user joins once all its tensor arguments are inside; revisit until none does
        candidates = {u for n in inside for u in n.users} - inside
        frontier = [
            u
            for u in candidates
            if u.op == "call_function"
            and u.target in POINTWISE
            and not u.kwargs
            and all(a in inside for a in u.args if isinstance(a, torch.fx.Node))
        ]
        inside.update(frontier)
        region.extend(frontier)
    if not region or len(region) > MAX_REGION:
        return None
    order = {n: i for i, n in enumerate(root.graph.nodes)}
    return sorted(region, key=order.__getitem__)


def _activation(root: torch.fx.Node) -> tuple[str, torch.fx.Node, list[torch.fx.Node]] | None:
    """(name, sink, region) when everything ``root`` feeds is one activation of it."""
    region = _region(root)
    if region is None:
        return None
    inside = {root, *region}
    sinks = [n for n in region if not all(u in inside for u in n.users)]
    if len(sinks) != 1 or any(u not in inside for u in root.users):
        return None
    sink = sinks[0]
    if any(u not in inside for n in region if n is not sink for u in n.users):
        return None
    values = {root: _PROBE}
    try:
        for node in region:
            args = [values[a] if isinstance(a, torch.fx.Node) else a for a in node.args]
            values[node] = node.target(*args)
    except (RuntimeError, TypeError, ValueError):
        return None
    got = values[sink]
    if not isinstance(got, torch.Tensor) or got.shape != _PROBE.shape:
        return None
    for name, fn in CANDIDATES.items():
        if torch.allclose(got, fn(_PROBE), rtol=1e-5, atol=1e-6):
            return name, sink, region
    return None


def packed_gemm(gm: torch.fx.GraphModule, options) -> int:
    if inductor_config.max_autotune or inductor_config.max_autotune_gemm:
        return 0
    changed = 0
    graph = gm.graph
    # Graphs compiled with grad disabled (inference; also a backward graph): a
    # GEMM whose B is a graph input takes the same value-returning op (packed
    # once the same B comes back, else oneDNN on it; the product as mm's). A
    # training forward's B is a weight the optimizer changes: left to Inductor.
    inputs = input_gemms(gm) if not torch.is_grad_enabled() else []
    for gemm in frozen_gemms(gm) + inputs:
        node = gemm.node
        if TEMPLATE_META in node.meta or (gemm.rows is not None and gemm.rows <= options.small_m):
            continue
        bias = node.args[0] if node.target is aten.addmm.default else None
        x = node.args[gemm.weight_index - 1]
        # the activation may follow a reshape of the 2-D product back to [..., N]
        users = list(node.users)
        reshape = users[0] if len(users) == 1 and users[0].target in RESHAPES else None
        found = _activation(reshape if reshape is not None else node)
        activation = found[0] if found else "none"
        if found is not None:
            from torch_ember.compile.passes import counters

            counters["gemm_epilogue"] += 1
        with graph.inserting_before(node):
            new = graph.call_function(
                torch.ops.ember.gemm.default, (bias, x, gemm.weight, activation)
            )
        new.meta.update(node.meta)
        if found is None:
            node.replace_all_uses_with(new)
            graph.erase_node(node)
        else:
            _, sink, region = found
            result = new
            if reshape is not None:
                with graph.inserting_before(node):
                    result = graph.call_function(reshape.target, (new, *reshape.args[1:]))
                result.meta.update(reshape.meta)
            result.meta["val"] = sink.meta.get("val", result.meta.get("val"))
            sink.replace_all_uses_with(result)
            for dead in reversed(region):
                graph.erase_node(dead)
            if reshape is not None:
                graph.erase_node(reshape)
            graph.erase_node(node)
        changed += 1
    return changed
