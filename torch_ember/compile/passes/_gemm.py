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
    weight: torch.fx.Node  # the [K, N] operand: a get_attr node (or a graph input)
    weight_index: int  # its position in node.args


def frozen_gemms(gm: torch.fx.GraphModule) -> list[Gemm]:
    """``mm(x, W)`` / ``addmm(b, x, W)`` on ember whose ``W`` is a frozen constant."""
    return _gemms(gm, lambda w: w.op == "get_attr")


def input_gemms(gm: torch.fx.GraphModule) -> list[Gemm]:
    """The same with ``W`` a graph input that needs no gradient (a tensor the caller
    passes, the same one call after call in an inference loop: packable)."""

    def is_input(w: torch.fx.Node) -> bool:
        val = w.meta.get("val")
        return w.op == "placeholder" and isinstance(val, torch.Tensor) and not val.requires_grad

    return _gemms(gm, is_input)


def _gemms(gm: torch.fx.GraphModule, weight_ok) -> list[Gemm]:
    found = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default):
            continue
        offset = 1 if node.target is aten.addmm.default else 0
        if node.kwargs or len(node.args) != offset + 2:
            continue  # alpha/beta or out_dtype: leave to Inductor
        x, w = node.args[offset], node.args[offset + 1]
        val = node.meta.get("val")
        if not isinstance(w, torch.fx.Node) or not weight_ok(w) or val is None:
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
