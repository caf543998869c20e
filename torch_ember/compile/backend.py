"""``torch.compile(model, backend="ember")``: Inductor on ember plus ember's graph passes.

Registered with Dynamo through the ``torch_dynamo_backends`` entry point
(``pyproject.toml``), so the name works without importing anything first.

For an inference graph (compiled under ``torch.no_grad()`` /
``torch.inference_mode()``) the backend

1. freezes it (``passes/freezing.py``): parameters and buffers become
   constants, Inductor folds what depends only on them (e.g. transposes, the
   concatenated Q/K/V weight);
2. runs ember's passes on the frozen post-grad graph (``passes/``): small
   one-row linear + activation fusion; every other linear stays an ATen
   GEMM call, which ember's runtime runs on its packed weights (the skinny
   kernel or oneDNN's packed matmul, ``csrc/ops/kernels/matmul/``);
3. compiles with Inductor (C++ kernels on ember memory).

A training graph (grad enabled) compiles exactly like the default backend:
freezing would bake in weights the optimizer is about to change.

Options (``torch.compile(m, backend="ember", options={...})``):
``freezing`` (default True), ``passes`` (default True), ``small_m`` (GEMMs with
at most this many rows are never offered the C++ GEMM template, default 16),
``template`` (offer the C++ GEMM template, default False), ``fuse_max_weight``
(one-row GEMMs next to an activation with at most this many weight elements
become generated C++ kernels, default 2**16), ``graphs``: True (the default
under ``mode="reduce-overhead"``) captures the graph's ATen ops and replays
them as an ember graph instead of compiling with Inductor
(``compile/graphed.py``; outputs overwritten by the next call, as CUDA
graphs'); False always compiles with Inductor; ``"auto"`` (the default
otherwise) replays small inference graphs (grad disabled, static shapes,
no value over 16384 elements: a batch-1 MLP, where per-op host work is the
cost and Inductor's code was slower than ember eager) with each call's
outputs cloned, so the call means what an uncompiled one does, and compiles
the rest with Inductor.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomInferenceAwareGraphPass, get_hash_for_files

from torch_ember.compile import cpu_parity
from torch_ember.compile import passes as _passes
from torch_ember.compile.passes.freezing import drop_arguments, lift_module_state

__all__ = ["counters", "ember_backend", "reset_counters"]

counters = _passes.counters
reset_counters = _passes.reset_counters

_BACKEND_OPTIONS = {"freezing", "passes", "small_m", "template", "fuse_max_weight", "graphs"}


class EmberPasses(CustomInferenceAwareGraphPass):
    """Inductor's post-grad custom pass slot running ember's passes on inference graphs."""

    def __init__(self, options: _passes.Options):
        self.options = options
        self.last: dict[str, int] = {}

    def __call__(self, graph: torch.fx.Graph, is_inference: bool) -> None:
        gm = graph.owning_module
        if not is_inference or gm is None:
            return
        self.last = _passes.run(gm, self.options)

    def uuid(self) -> Any:
        here = Path(__file__).resolve().parent
        files = [here / "backend.py", *sorted((here / "passes").glob("*.py"))]
        return (get_hash_for_files(tuple(str(f) for f in files)), dataclasses.astuple(self.options))


def ember_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """The ``"ember"`` Dynamo backend (``options=`` of torch.compile arrive as ``options``)."""
    import torch._inductor
    from torch._inductor.compile_fx import compile_fx

    from torch_ember.compile import register

    register()  # normally done by the import hook already
    options = dict(kwargs.pop("options", None) or {})
    mine = {k: options.pop(k) for k in list(options) if k in _BACKEND_OPTIONS}
    mode = kwargs.pop("mode", None)
    if kwargs:
        raise TypeError(f"backend='ember' got unexpected arguments {sorted(kwargs)}")
    from torch_ember.compile.graphed import graphed, small_inference_graph

    graphs = mine.get("graphs", "auto" if mode in (None, "default") else mode == "reduce-overhead")
    if graphs == "auto":
        if small_inference_graph(gm, example_inputs):
            counters["auto_graphs"] += 1
            return graphed(gm, example_inputs, automatic=True)
    elif graphs:
        # Replayed as an ember graph (compile/graphed.py), without Inductor.
        return graphed(gm, example_inputs)
    patches: dict[str, Any] = {}
    if mode:  # as torch.compile(mode=...) does for Inductor
        patches.update(torch._inductor.list_mode_options(mode))
    patches.update(options)  # the rest are Inductor config entries
    inference = not torch.is_grad_enabled()
    lifted: list[int] = []
    total = len(example_inputs)
    if inference and mine.get("freezing", True):
        patches["freezing"] = True
        gm, lifted = lift_module_state(gm, example_inputs)
        counters["freezing"] += len(lifted)
        example_inputs = [x for i, x in enumerate(example_inputs) if i not in set(lifted)]
    scope = contextlib.nullcontext()
    if mine.get("passes", True):
        pass_options = _passes.Options(
            small_m=int(mine.get("small_m", _passes.Options.small_m)),
            template=bool(mine.get("template", _passes.Options.template)),
            fuse_max_weight=int(mine.get("fuse_max_weight", _passes.Options.fuse_max_weight)),
        )
        patches["post_grad_custom_post_pass"] = EmberPasses(pass_options)
        user_autotune = patches.get("max_autotune") or patches.get("max_autotune_gemm")
        backends = str(patches.get("max_autotune_gemm_backends", "ATEN")).upper()
        if inference and pass_options.template and not user_autotune and "ATEN" in backends:
            # GEMMs are autotuned; the C++ template is offered to the annotated ones only
            patches["max_autotune_gemm"] = True
            # autotuning the user did not ask for: no report on stderr
            patches.setdefault("autotune_num_choices_displayed", 0)
            patches.setdefault("max_autotune_report_choices_stats", False)
            scope = cpu_parity.templates_for_tagged_gemms_only()
        elif inference and pass_options.template and not user_autotune:
            patches["max_autotune_gemm"] = True  # backends without ATen: the template everywhere
    with scope:
        compiled = compile_fx(gm, example_inputs, config_patches=patches)
    return drop_arguments(compiled, lifted, total) if lifted else compiled
