"""Inductor's ``mode="reduce-overhead"`` on ember: compiled code replayed as an ember graph.

Inductor wraps a compiled graph in CUDA graphs (cudagraph trees) only when
all its buffers are on CUDA; on any other device it compiles without them
and counts a skip. Inductor asks a pluggable *CUDA graph policy*
(``torch._inductor.config.cudagraph_policy``) whether to wrap each compiled
graph and lets it wrap the result. ember's policy:

- a graph on another device: unchanged (a policy set before ember's is
  consulted and applied as it was);
- an inference graph on ember, compiled with ``triton.cudagraphs`` (what
  ``mode="reduce-overhead"`` sets): Inductor's own wrapping is left out (it
  counts a ``cudagraph_skips``), and the compiled callable is wrapped in
  :class:`~torch_ember.compile.graphed.GraphedModule` -- two warm-up calls,
  capture of the third (the generated C++ kernels are launched through the
  stream, ``kernel_launch.py``, and recorded like eager ops), replays after
  it. The replay reads parameters, buffers and inputs it writes in place
  where they are, and copies the other inputs into its static copies, as
  CUDA graph trees do. Outputs are overwritten by the next call, as with
  CUDA graphs;
- a training graph (AOTAutograd's forward or backward) on ember: the same,
  except that a replay never overwrites outputs of the previous one that are
  still referenced (autograd keeps a forward's saved tensors until its
  backward has run; a second forward before the first one's backward runs
  the compiled code without the graph). Gradients reach ``.grad`` as copies
  (``AccumulateGrad`` does not take a tensor the graph still holds).

Installed by ``register_inductor_backend`` unless CUDA is available: with
Inductor's graph partitions on, any policy changes how CUDA graphs are cut,
and ember does not take that decision for CUDA users (they keep the old
warning instead).
"""

from __future__ import annotations

import torch
from torch._inductor.cudagraph_utils import CUDAGraphPolicy
from torch._inductor.output_code import CompiledFxGraph

from torch_ember.compile.graphed import GraphedModule

DEVICE_TYPE = "ember"
LABEL = "torch.compile(mode='reduce-overhead') on ember"


def _on_ember(compiled) -> bool:
    types = getattr(compiled, "device_types", ())
    return DEVICE_TYPE in types and "cuda" not in types


def _graphs_requested() -> bool:
    return bool(torch._inductor.config.triton.cudagraphs)


class _BoxedGraph:
    """Inductor's boxed calling convention (one list, cleared by the callee)
    over a :class:`GraphedModule` of the compiled callable."""

    def __init__(
        self, compiled_callable, written_inputs: frozenset[int], static_inputs, training: bool
    ):
        self.graphed = GraphedModule(
            lambda *args: compiled_callable(list(args)),
            written_inputs=written_inputs,
            static_inputs=static_inputs,
            label=LABEL,
            keep_live_outputs=training,
        )

    def __call__(self, args: list):
        inputs = tuple(args)
        args.clear()  # the caller's references go, as Inductor's call() drops them
        outputs = self.graphed(*inputs)
        return list(outputs) if isinstance(outputs, list) else outputs


class EmberGraphPolicy(CUDAGraphPolicy):
    """Replays ember's graphs compiled for ``reduce-overhead``."""

    def __init__(self, previous: CUDAGraphPolicy | None = None):
        self.previous = previous or CUDAGraphPolicy()

    def cudagraphify(self, model, example_inputs, static_input_idxs, **kwargs):
        return self.previous.cudagraphify(model, example_inputs, static_input_idxs, **kwargs)

    def should_wrap(self, compiled_graph) -> bool:
        if _on_ember(compiled_graph):
            return False  # Inductor's CUDA graphs do not apply; wrap_output does ember's
        return self.previous.should_wrap(compiled_graph)

    def wrap_output(self, output_code):
        output_code = self.previous.wrap_output(output_code)
        if not (
            isinstance(output_code, CompiledFxGraph)
            and _on_ember(output_code)
            and _graphs_requested()
        ):
            return output_code
        output_code.current_callable = _BoxedGraph(
            output_code.current_callable,
            frozenset(output_code.mutated_input_idxs),
            frozenset(output_code.fx_kwargs.get("static_input_idxs") or ()),
            training=not output_code.fx_kwargs.get("is_inference", False),
        )
        return output_code


def install() -> bool:
    """Makes :class:`EmberGraphPolicy` Inductor's policy, keeping a policy set
    before it for other devices. False (nothing changed) where CUDA is available."""
    config = torch._inductor.config
    if torch.cuda.is_available():
        return False
    if not isinstance(config.cudagraph_policy, EmberGraphPolicy):
        config.cudagraph_policy = EmberGraphPolicy(config.cudagraph_policy)
    return True


def installed() -> bool:
    return isinstance(torch._inductor.config.cudagraph_policy, EmberGraphPolicy)
