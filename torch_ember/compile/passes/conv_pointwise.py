"""Frozen 2-D convolutions as ``torch.ops.ember.conv2d``: a following residual
add and ReLU ride in the convolution as oneDNN post-ops, and the network runs
channels-last from its first convolution on.

After freezing folds each BatchNorm into its convolution, a ResNet is a chain
of ``convolution -> relu`` and ``convolution -> add(residual) -> relu``. Left
to Inductor, each add and ReLU is a generated kernel that reads the whole
convolution result again, and each convolution result is NCHW, which oneDNN
computes channels-last and ember re-lays on the way in and out (ResNet-50:
the pointwise kernels and re-layouts were ~10% of a compiled run).
``ember.conv2d(x, W, b, ..., activation, other)`` computes
``relu?(conv(x) + b + other)`` in one oneDNN call on the packed weight and
returns it channels-last whatever ``x``'s layout, so the next convolution
reads it as it is.

Matched: ``aten.convolution`` (not transposed, 4-D fp32 on ember, weight a
frozen constant), optionally followed by its only user ``aten.add.Tensor``
with another tensor of the result's shape, then optionally by that node's
only user ``aten.relu``. A convolution with neither still becomes
``ember.conv2d`` (channels-last, no re-layout).
"""

from __future__ import annotations

import torch

aten = torch.ops.aten


def _val(node) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _ints(values) -> list[int] | None:
    if not isinstance(values, (list, tuple)) or len(values) != 2:
        return None
    return list(values) if all(isinstance(v, int) for v in values) else None


def _only_user(node: torch.fx.Node, target) -> torch.fx.Node | None:
    users = list(node.users)
    if len(users) != 1 or users[0].op != "call_function" or users[0].target is not target:
        return None
    return None if users[0].kwargs else users[0]


def _residual(node: torch.fx.Node, add: torch.fx.Node) -> torch.fx.Node | None:
    """The other operand of ``add(node, other)`` when it is a tensor like node's result."""
    if len(add.args) != 2:
        return None
    a, b = add.args
    other = b if a is node else a
    mine, theirs = _val(node), _val(other)
    if other is node or theirs is None:
        return None
    same = (theirs.shape, theirs.dtype, theirs.device) == (mine.shape, mine.dtype, mine.device)
    return other if same else None


def conv_pointwise(gm: torch.fx.GraphModule, options) -> int:
    changed = 0
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten.convolution.default:
            continue
        if node.kwargs or len(node.args) != 9:
            continue
        x, w, b, stride, padding, dilation, transposed, _output_padding, groups = node.args
        val, x_val = _val(node), _val(x)
        geometry = [_ints(stride), _ints(padding), _ints(dilation)]
        if (
            transposed
            or not isinstance(w, torch.fx.Node)
            or w.op != "get_attr"
            or not isinstance(groups, int)
            or any(g is None for g in geometry)
            or val is None
            or x_val is None
            or val.dim() != 4
            or val.device.type != "ember"
            or val.dtype != torch.float32
            or x_val.dtype != torch.float32
        ):
            continue
        other, activation, last, dead = None, "none", node, []
        add = _only_user(node, aten.add.Tensor)
        if add is not None and (residual := _residual(node, add)) is not None:
            other, last = residual, add
            dead.append(add)
        relu = _only_user(last, aten.relu.default)
        if relu is not None:
            activation, last = "relu", relu
            dead.append(relu)
        args = (x, w, b, *geometry, groups, activation, other)
        with graph.inserting_before(last):
            new = graph.call_function(torch.ops.ember.conv2d.default, args)
        new.meta.update(node.meta)
        fake = [_val(a) if isinstance(a, torch.fx.Node) else a for a in args]
        with val.fake_mode:
            new.meta["val"] = torch.ops.ember.conv2d.default(*fake)
        last.replace_all_uses_with(new)
        for gone in reversed(dead):
            graph.erase_node(gone)
        graph.erase_node(node)
        if dead:
            from torch_ember.compile.passes import counters

            counters["conv_epilogue"] += 1
        changed += 1
    return changed
