"""Weight prepacking: each frozen GEMM weight in the layout its GEMM reads fastest.

After freezing, ``nn.Linear``'s weight reaches ``addmm(b, x, W)`` as the
transposed view of an ``[N, K]`` parameter (strides ``(1, K)``). For that:

- a GEMM with one row (batch-1 MLPs, decode steps) runs ATen's GEMM, which
  reads a row-major ``[K, N]`` weight 1.26x (256x256) to 1.6x (GPT-2's
  768x50257 LM head) faster than the transposed view, and as fast for the
  other GPT-2 shapes (docs/compile.md): the pass stores such weights once,
  row-major, as new constants;
- with 2 to 16 rows neither layout wins consistently, and with more rows the
  C++ GEMM template (which packs the weight into its blocked layout at
  compile time) did not beat ATen on a plain GEMM in our measurements: those
  weights stay as they are. (A GEMM feeding an activation is
  ``linear_activation``'s.)
"""

from __future__ import annotations

import torch

from torch_ember.compile.passes._gemm import TEMPLATE_META, constant, frozen_gemms


def prepack_weights(gm: torch.fx.GraphModule, options) -> int:
    changed = 0
    packed: dict[str, torch.fx.Node] = {}
    for gemm in frozen_gemms(gm):
        if gemm.rows != 1 or gemm.node.meta.get(TEMPLATE_META):
            continue  # several rows, or dynamic M: the view stays
        weight = constant(gm, gemm.weight)
        if weight.dim() != 2 or weight.is_contiguous() or not weight.t().is_contiguous():
            continue
        if gemm.weight.target not in packed:
            name = _free_name(gm, gemm.weight.target.replace(".", "_") + "_kn")
            gm.register_buffer(name, weight.contiguous(), persistent=False)
            with gm.graph.inserting_after(gemm.weight):
                node = gm.graph.get_attr(name)
            fake = gemm.weight.meta.get("val")
            if fake is not None:
                node.meta["val"] = fake.fake_mode.from_tensor(getattr(gm, name), static_shapes=True)
            packed[gemm.weight.target] = node
        gemm.node.replace_input_with(gemm.weight, packed[gemm.weight.target])
        changed += 1
    for node in list(gm.graph.nodes):
        if node.op == "get_attr" and not node.users and node.target in packed:
            gm.graph.erase_node(node)
    return changed


def _free_name(gm: torch.fx.GraphModule, base: str) -> str:
    name, i = base, 0
    while hasattr(gm, name):
        i += 1
        name = f"{base}_{i}"
    return name
