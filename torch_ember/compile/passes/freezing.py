"""Inference freezing: parameters and buffers become constants Inductor can fold.

Dynamo hands a module's parameters and buffers to a backend as graph inputs
(``inline_inbuilt_nn_modules``); Inductor's freezing only turns into constants
the tensors it sees as parameters of the graph module -- which Dynamo arranges
only when ``torch._inductor.config.freezing`` was already set while it traced.
For ``backend="ember"`` the backend is the first to know, so this pass makes
each parameter/buffer input a parameter of the graph module, read with
``get_attr``, and removes the input (the backend drops those arguments when
the compiled graph is called). Inductor then freezes them: constant folding (transposes, the
concatenated Q/K/V weight of an attention block), and ember's GEMM passes see
the weights as constants.

Like Inductor's freezing: the compiled graph keeps the values the weights had
when it was compiled; changing a weight afterwards needs ``torch._dynamo.reset()``.
"""

from __future__ import annotations

import torch


def _is_module_state(node: torch.fx.Node, value) -> bool:
    if isinstance(value, torch.nn.Parameter):
        return True
    source = getattr(node.meta.get("grapharg"), "source", None)
    return "._buffers[" in getattr(source, "name", "")


def lift_module_state(
    dynamo_gm: torch.fx.GraphModule, example_inputs
) -> tuple[torch.fx.GraphModule, list[int]]:
    """A copy of ``dynamo_gm`` whose parameter/buffer inputs are its own parameters.

    Returns the copy and the positions of the inputs it no longer takes
    (``dynamo_gm`` is left alone: Dynamo still calls with every input).
    """
    graph = torch.fx.Graph()
    copies: dict[torch.fx.Node, torch.fx.Node] = {}
    graph.output(graph.graph_copy(dynamo_gm.graph, copies))
    for old, new in copies.items():
        if hasattr(old, "_dynamo_source"):  # AOTAutograd reads it off placeholders
            new._dynamo_source = old._dynamo_source
    gm = torch.fx.GraphModule(dynamo_gm, graph)
    for name, value in vars(dynamo_gm).items():
        if name.startswith("_param_name_to_source") or name == "meta":
            setattr(gm, name, dict(value))
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs) or not placeholders:
        return dynamo_gm, []
    lifted: list[int] = []
    with gm.graph.inserting_after(placeholders[-1]):
        for index, (node, value) in enumerate(zip(placeholders, example_inputs)):
            if not isinstance(value, torch.Tensor):
                continue
            if not _is_module_state(node, value) or value.device.type != "ember":
                continue
            source = getattr(node.meta.get("grapharg"), "source", None)
            sources = getattr(gm, "_param_name_to_source", None)
            if source is None or sources is None:
                continue  # AOTAutograd maps each graph-module parameter to its source
            name = f"_ember_state_{len(lifted)}"
            gm.register_parameter(name, torch.nn.Parameter(value.detach(), requires_grad=False))
            sources[name] = source
            attr = gm.graph.get_attr(name)
            attr.meta.update({k: v for k, v in node.meta.items() if k in ("val", "tensor_meta")})
            node.replace_all_uses_with(attr)
            gm.graph.erase_node(node)
            lifted.append(index)
    if not lifted:
        return dynamo_gm, []
    gm.graph.lint()
    gm.recompile()
    return gm, lifted


def drop_arguments(compiled, dropped: list[int], total: int):
    """``compiled`` called with the arguments of the original graph minus ``dropped``."""
    keep = [i for i in range(total) if i not in set(dropped)]

    def call(*args):
        return compiled(*[args[i] for i in keep])

    return call
