"""Linear + activation: one generated C++ kernel instead of a GEMM call and a kernel.

Inductor's CPU path fuses ``linear -> relu/gelu/silu/...`` into one oneDNN
call on prepacked weights (``mkldnn_fusion.py``), a pass keyed to CPU tensors
that never fires on ember. ember's counterpart, for a GEMM with a frozen
weight next to an activation (feeding it, or fed by it):

- one row (batch-1 MLP layers) and a weight of at most
  ``options.fuse_max_weight`` elements: the GEMM is rewritten as the
  reduction it is, ``sum(x[K, 1] * W[K, N], 0) + b``, so Inductor generates
  it as a C++ reduction kernel and fuses bias, activation and neighbouring
  layers into it (a whole small MLP becomes one kernel; no ATen GEMM call);
- more than ``options.small_m`` rows, feeding an activation: the GEMM is
  offered Inductor's C++ GEMM template, whose kernel applies bias and
  activation to each output block while it is in cache
  (``cpp_epilogue_fusion_counter``); Inductor times it against ATen's GEMM
  and keeps the faster.
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
POINTWISE_HOPS = {
    aten.mul.Tensor,
    aten.add.Tensor,
    aten.div.Tensor,
    aten.view.default,
    aten.reshape.default,
    aten._unsafe_view.default,
}


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


def activation_before(x: torch.fx.Node, depth: int = 3) -> str | None:
    """The activation that produced ``x`` (a GEMM's input) within ``depth`` pointwise hops."""
    frontier = [x]
    for _ in range(depth):
        earlier = []
        for n in frontier:
            if not isinstance(n, torch.fx.Node) or n.op != "call_function":
                continue
            if n.target in ACTIVATIONS:
                return ACTIVATIONS[n.target]
            if n.target in POINTWISE_HOPS:
                earlier.extend(a for a in n.args if isinstance(a, torch.fx.Node))
        frontier = earlier
    return None


def _as_reduction(gm: torch.fx.GraphModule, gemm) -> None:
    """``addmm(b, x[1, K], W[K, N])`` -> ``sum(x.view(K, 1) * W, 0, keepdim) + b``."""
    node, graph = gemm.node, gm.graph
    x = node.args[gemm.weight_index - 1]
    bias = node.args[0] if node.target is aten.addmm.default else None
    weight = gemm.weight
    k = int(weight.meta["val"].shape[0])
    fake_mode = weight.meta["val"].fake_mode

    def emit(target, *args):
        new = graph.call_function(target, args)
        with fake_mode:
            new.meta["val"] = target(
                *(a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in args)
            )
        return new

    with graph.inserting_before(node):
        column = emit(aten.view.default, x, [k, 1])
        out = emit(aten.sum.dim_IntList, emit(aten.mul.Tensor, column, weight), [0], True)
        if bias is not None:
            out = emit(aten.add.Tensor, out, bias)
    node.replace_all_uses_with(out)
    graph.erase_node(node)


def linear_activation(gm: torch.fx.GraphModule, options) -> int:
    changed = 0
    for gemm in frozen_gemms(gm):
        if gemm.rows == 1:
            if "val" not in gemm.weight.meta:
                continue
            shape = gemm.weight.meta["val"].shape
            x = gemm.node.args[gemm.weight_index - 1]
            near = activation_after(gemm.node) or activation_before(x)
            if near is not None and shape[0] * shape[1] <= options.fuse_max_weight:
                _as_reduction(gm, gemm)
                changed += 1
        elif options.template and gemm.rows is not None and gemm.rows > options.small_m:
            act = activation_after(gemm.node)
            if act is not None:
                gemm.node.meta[TEMPLATE_META] = f"epilogue:{act}"
                changed += 1
    return changed
