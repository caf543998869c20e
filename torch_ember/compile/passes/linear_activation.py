"""Linear + activation: the activation runs as the epilogue of a C++ GEMM kernel.

Inductor's CPU path fuses ``linear -> relu/gelu/silu/...`` into one oneDNN
call on prepacked weights (``mkldnn_fusion.py``), a pass keyed to CPU tensors
that never fires on ember. ember's counterpart: a GEMM with a frozen weight
whose result feeds an activation is offered Inductor's C++ GEMM template,
whose generated kernel applies bias and activation to each output block while
it is still in cache (``cpp_epilogue_fusion_counter`` counts them) instead of
a second pass over the GEMM output. Inductor times the template against
ATen's GEMM on the first call and keeps the faster.
"""

from __future__ import annotations

import torch

from torch_ember.compile.passes._gemm import TEMPLATE_META, frozen_gemms

aten = torch.ops.aten

# ops that mark an activation after decomposition (GELU becomes erf or tanh)
ACTIVATIONS = {
    aten.relu.default: "relu",
    aten.erf.default: "gelu",
    aten.tanh.default: "tanh/gelu",
    aten.sigmoid.default: "sigmoid/silu",
    aten.silu.default: "silu",
    aten.gelu.default: "gelu",
    aten.hardtanh.default: "hardtanh",
    aten.clamp_min.default: "relu",
}
POINTWISE_HOPS = {aten.mul.Tensor, aten.add.Tensor, aten.div.Tensor, aten.view.default}


def activation_after(node: torch.fx.Node, depth: int = 3) -> str | None:
    """The activation reached from ``node`` through at most ``depth`` pointwise ops."""
    frontier = [node]
    for _ in range(depth):
        following = []
        for n in frontier:
            for user in n.users:
                if user.op != "call_function":
                    continue
                if user.target in ACTIVATIONS:
                    return ACTIVATIONS[user.target]
                if user.target in POINTWISE_HOPS:
                    following.append(user)
        frontier = following
    return None


def linear_activation(gm: torch.fx.GraphModule, options) -> int:
    if not options.template:
        return 0
    changed = 0
    for gemm in frozen_gemms(gm):
        if gemm.rows is None or gemm.rows <= options.small_m:
            continue  # the template loses to ATen at a handful of rows
        act = activation_after(gemm.node)
        if act is not None:
            gemm.node.meta[TEMPLATE_META] = f"epilogue:{act}"
            changed += 1
    return changed
