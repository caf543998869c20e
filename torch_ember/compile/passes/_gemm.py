"""What the passes share: finding GEMMs whose weight is a frozen constant."""

from __future__ import annotations

from dataclasses import dataclass

import torch

aten = torch.ops.aten

# annotation on an FX GEMM node: offer Inductor's C++ GEMM template for it
# (read during lowering by torch_ember.compile.cpu_parity)
TEMPLATE_META = "ember_gemm_template"


@dataclass
class Gemm:
    node: torch.fx.Node  # aten.mm or aten.addmm
    rows: int | None  # M, when static
    weight: torch.fx.Node  # the get_attr node of the [K, N] operand
    weight_index: int  # its position in node.args


def frozen_gemms(gm: torch.fx.GraphModule) -> list[Gemm]:
    """``mm(x, W)`` / ``addmm(b, x, W)`` on ember whose ``W`` is a frozen constant."""
    found = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default):
            continue
        offset = 1 if node.target is aten.addmm.default else 0
        if node.kwargs or len(node.args) != offset + 2:
            continue  # alpha/beta or out_dtype: leave to Inductor
        x, w = node.args[offset], node.args[offset + 1]
        val = node.meta.get("val")
        if not isinstance(w, torch.fx.Node) or w.op != "get_attr" or val is None:
            continue
        if val.device.type != "ember" or val.dtype not in (torch.float32, torch.bfloat16):
            continue
        rows = x.meta["val"].shape[0] if isinstance(x, torch.fx.Node) else None
        found.append(Gemm(node, rows if isinstance(rows, int) else None, w, offset + 1))
    return found


def constant(gm: torch.fx.GraphModule, node: torch.fx.Node) -> torch.Tensor:
    value = gm
    for part in node.target.split("."):
        value = getattr(value, part)
    return value
