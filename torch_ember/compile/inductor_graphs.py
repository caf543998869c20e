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

With ``AUTO_REPLAY`` set, and without ``reduce-overhead``, a small
inference graph on ember compiled by the default backend is replayed the
same way, with each call's outputs
cloned (the call then means what an uncompiled one does), as
``backend="ember"`` replays small graphs by default: grad disabled, static
shapes, no value it computes and no input it copies (parameters and
buffers are not copied) over ``graphed.AUTO_MAX_ELEMENTS`` elements, and no
C++ kernel with an OpenMP region (a batch-1 MLP), where per-op host work is
the cost. The generated module says what its code does
(``inductor_backend.GRAPH_FACTS``). A replay queued on the stream's worker
would run an OpenMP kernel on the worker's team while the host's team runs
the ops around the call, and libgomp's barriers then sleep: such graphs
are left as compiled. Opt-in: ``AUTO_REPLAY = True`` (off by default,
docs/compile.md says why).

Installed by ``register_inductor_backend`` unless CUDA is available: with
Inductor's graph partitions on, any policy changes how CUDA graphs are cut,
and ember does not take that decision for CUDA users (they keep the old
warning instead).
"""

from __future__ import annotations

import torch
from torch._inductor.cudagraph_utils import CUDAGraphPolicy
from torch._inductor.output_code import CompiledFxGraph

from torch_ember.compile import graphed as _graphed
from torch_ember.compile.graphed import GraphedModule
from torch_ember.compile.inductor_backend import GRAPH_FACTS

DEVICE_TYPE = "ember"
LABEL = "torch.compile(mode='reduce-overhead') on ember"

AUTO_REPLAY = False
"""Replay small inference graphs of the default mode (module doc). Off by
default: faster back to back, slower in the suite's pattern (docs/compile.md)."""


def _on_ember(compiled) -> bool:
    types = getattr(compiled, "device_types", ())
    return DEVICE_TYPE in types and "cuda" not in types


def _graphs_requested() -> bool:
    return bool(torch._inductor.config.triton.cudagraphs)


class _BoxedGraph:
    """Inductor's boxed calling convention (one list, cleared by the callee)
    over a :class:`GraphedModule` of the compiled callable."""

    def __init__(
        self,
        compiled_callable,
        written_inputs: frozenset[int],
        static_inputs,
        training: bool,
        automatic: bool = False,
    ):
        self.graphed = GraphedModule(
            lambda *args: compiled_callable(list(args)),
            written_inputs=written_inputs,
            static_inputs=static_inputs,
            label=LABEL,
            keep_live_outputs=training,
            guarded_signature=automatic,  # static shapes: Dynamo guards every input
            clone_outputs=automatic,
            quiet=automatic,
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
        if not (isinstance(output_code, CompiledFxGraph) and _on_ember(output_code)):
            return output_code
        if _graphs_requested():
            automatic = False
        elif _small_inference(output_code):
            automatic = True
            _graphed.counters["inductor_auto_graphs"] += 1
        else:
            return output_code
        output_code.current_callable = _BoxedGraph(
            output_code.current_callable,
            frozenset(output_code.mutated_input_idxs),
            frozenset(output_code.fx_kwargs.get("static_input_idxs") or ()),
            training=not output_code.fx_kwargs.get("is_inference", False),
            automatic=automatic,
        )
        return output_code


def _small_inference(output_code: CompiledFxGraph) -> bool:
    """Whether a default-mode graph is replayed with cloned outputs (module doc)."""
    if not AUTO_REPLAY or torch.is_grad_enabled():
        return False
    if not output_code.fx_kwargs.get("is_inference", False):
        return False
    facts = getattr(output_code.current_callable, "__globals__", {}).get(GRAPH_FACTS)
    if facts is None or facts["symbolic_shapes"] or facts["parallel_kernels"]:
        return False
    # Parameters and buffers are read where they are; other inputs are copied
    # into the graph's static inputs on every call.
    static = set(output_code.fx_kwargs.get("static_input_idxs") or ())
    copied = [e for i, e in enumerate(facts["input_elements"]) if i not in static]
    return max([facts["max_buffer_elements"], *copied]) <= _graphed.AUTO_MAX_ELEMENTS


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
