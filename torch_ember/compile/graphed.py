"""``backend="ember"`` with ``options={"graphs": True}`` (or
``mode="reduce-overhead"``): a Dynamo graph replayed as an ember graph.

This path runs the Dynamo graph's ATen ops (ember's kernels: packed GEMMs,
attention, ...) and captures them. Inductor's C++ kernels can be captured too
(they are launched through the stream, kernel_launch.py), but capturing the
Inductor-compiled graph here was slower on the batch-1 MLP and is not done.
Per input shape signature it

1. runs the graph eagerly twice (warm-up: weights get packed, and inputs
   whose memory is the same on both calls, parameters and buffers lifted
   into the graph's inputs, are recognised as fixed);
2. captures the third call into a ``torch.ember.EmberGraph`` with static
   copies of the other inputs;
3. afterwards copies those inputs into the static copies and replays.

Outputs are the graph's static outputs, overwritten by the next call of the
same shapes (as with CUDA graphs: clone what you keep). For the Dynamo
graph, inference only: one called with grad enabled runs eagerly (a warning
says so); Inductor's training graphs (its forward and backward, called below
autograd) are replayed with ``keep_live_outputs``. A graph
that cannot be captured (an op with no replayable form, a host read) runs
eagerly from then on, with a warning naming the reason.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable

import torch

# busy_outputs: calls run without their graph because a replay would have
# overwritten outputs still in use (or could not hand out an input's view)
counters = {
    "captures": 0,
    "replays": 0,
    "eager_fallbacks": 0,
    "busy_outputs": 0,
    "inductor_auto_graphs": 0,  # default-mode Inductor graphs replayed (inductor_graphs.py)
}


def _signature(args) -> tuple | str:
    """The replay key of a call (shapes, dtypes, devices; other arguments by
    value), or why the call cannot be replayed. One pass: it runs every call."""
    grad = torch.is_grad_enabled()
    key = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            device = a.device
            if device.type != "ember":
                return f"input {i} is a {device.type} tensor, not an ember tensor"
            if grad and a.requires_grad:
                return "graphs are for inference (grad is enabled)"
            key.append((a.shape, a.dtype, device))
        else:
            key.append((type(a), a))
    return tuple(key)


def _flat(outputs) -> list:
    return list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]


def _refs(tensor: torch.Tensor) -> tuple[int, int]:
    """References to a tensor's memory: to its storage (other tensors on it)
    and to the tensor itself (autograd's saved tensors, C++ holders)."""
    return torch._C._storage_Use_Count(tensor.untyped_storage()._cdata), tensor._use_count()


class _InputView:
    """An output that is a view of an input the replay copies (a training
    forward returns the input it saves for backward): the replay hands out
    the same view of the caller's input, as the compiled code would."""

    def __init__(self, output: torch.Tensor, index: int, static: torch.Tensor):
        self.index = index
        self.size = output.size()
        self.stride = output.stride()
        self.offset = output.storage_offset() - static.storage_offset()
        self.static_stride = static.stride()

    def of(self, given: torch.Tensor) -> torch.Tensor | None:
        if given.stride() != self.static_stride:
            return None  # the view would not be the same elements
        return given.as_strided(self.size, self.stride, given.storage_offset() + self.offset)


class _Entry:
    def __init__(self):
        self.calls = 0
        self.pointers: list[int | None] | None = None
        self.fixed: list[bool] = []
        self.static: list = []
        self.graph = None
        self.outputs = None
        # data_ptr() of each static input at capture: a fixed input is the
        # caller's own tensor, whose memory `param.data = ...` can replace
        self.static_pointers: list[int | None] = []
        # outputs that are views of copied inputs, by output position
        self.input_views: dict[int, _InputView] = {}
        # storage references of each graph-owned output right after capture
        self.output_refs: list[tuple[int, int] | None] = []


class GraphedModule:
    """Callable over a graph (a Dynamo ``GraphModule``, or Inductor's compiled
    code, ``inductor_graphs.py``): warm-up, capture, replay.

    An input whose memory is the same on the last two warm-up calls is read
    by the replay where it is (*fixed*); the others are copied into static
    copies. ``static_inputs``, where the compiler knows them (parameters,
    buffers, ``mark_static_address``), narrows the fixed ones to those and to
    ``written_inputs``, the positions of inputs the graph writes in place: a
    replay could only write its static copy of such an input, so one whose
    memory differs from call to call keeps the graph from being captured.

    With ``keep_live_outputs`` (training graphs: autograd keeps a forward's
    outputs for the backward), a replay never overwrites outputs of the
    last one that are still referenced (a second forward before the first
    one's backward): that call runs the code without the graph.
    """

    WARMUP = 2

    def __init__(
        self,
        gm: Callable,
        *,
        written_inputs: frozenset[int] = frozenset(),
        static_inputs: frozenset[int] | None = None,
        label: str = "torch.compile(backend='ember', graphs)",
        keep_live_outputs: bool = False,
        guarded_signature: bool = False,
        clone_outputs: bool = False,
        quiet: bool = False,
    ):
        self.gm = gm
        # guarded_signature: the caller guards every call's input shapes,
        # dtypes, devices and grad mode (a Dynamo graph without symbolic
        # shapes), so once captured, calls replay without computing the
        # signature (per input, it cost more than the replay of a batch-1 MLP)
        self.guarded_signature = guarded_signature
        self._guarded: tuple[tuple, _Entry] | None = None
        # clone_outputs: a replay's outputs are cloned, so each call's are
        # the caller's own (not overwritten by the next); quiet: a graph that
        # cannot be captured runs eagerly without a warning
        self.clone_outputs = clone_outputs
        self.quiet = quiet
        # A graph chosen by the backend (clone_outputs) must be as safe to
        # call from several threads and streams as the code it stands for:
        # calls take turns (one set of static inputs and outputs), and a call
        # on another stream than the last one first waits for that stream.
        self._turns = threading.Lock() if clone_outputs else None
        self._last_stream = None
        self.entries: dict[tuple, _Entry] = {}
        self.eager_reason: str | None = None
        self.written_inputs = written_inputs
        self.static_inputs = static_inputs
        self.label = label
        self.keep_live_outputs = keep_live_outputs

    def _give_up(self, reason: str) -> None:
        if self.eager_reason is None:
            self.eager_reason = reason
            counters["eager_fallbacks"] += 1
            if not self.quiet:
                warnings.warn(f"{self.label}: running eagerly: {reason}", stacklevel=4)

    def _eager(self, reason: str, args):
        self._give_up(reason)
        return self.gm(*args)

    def __call__(self, *args):
        if self._turns is None:
            return self._call(*args)
        with self._turns:
            device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
            index = device.index if device is not None and device.type == "ember" else None
            stream = torch.accelerator.current_stream(index)
            if self._last_stream is not None and stream != self._last_stream:
                stream.wait_stream(self._last_stream)
            self._last_stream = stream
            return self._call(*args)

    def _call(self, *args):
        if self.eager_reason is not None:
            return self.gm(*args)
        if self._guarded is not None:
            return self._replay(self._guarded[1], args, self._guarded[0])
        signature = _signature(args)
        if isinstance(signature, str):
            return self._eager(signature, args)
        entry = self.entries.get(signature)
        if entry is None:
            entry = self.entries[signature] = _Entry()
        elif entry.graph is not None:
            if self.guarded_signature:
                self._guarded = (signature, entry)
            return self._replay(entry, args, signature)
        pointers = [a.data_ptr() if isinstance(a, torch.Tensor) else None for a in args]
        entry.fixed = (
            [p is not None and p == q for p, q in zip(pointers, entry.pointers)]
            if entry.pointers is not None
            else [False] * len(args)
        )
        if self.static_inputs is not None:
            keep = self.static_inputs | self.written_inputs
            entry.fixed = [f and i in keep for i, f in enumerate(entry.fixed)]
        if self.keep_live_outputs:
            # Training: only parameters (and inputs written in place) are read
            # where they are. Saved activations are copied, so no graph holds
            # another graph's outputs (a hold would read as a use of them).
            entry.fixed = [
                f and (i in self.written_inputs or getattr(a, "requires_grad", False))
                for i, (f, a) in enumerate(zip(entry.fixed, args))
            ]
        entry.pointers = pointers
        entry.calls += 1
        if entry.calls < self.WARMUP:
            return self.gm(*args)
        if entry.calls == self.WARMUP:
            return self.gm(*args)
        return self._capture(entry, args)

    def _capture(self, entry: _Entry, args):
        moving = [i for i in self.written_inputs if i < len(args) and not entry.fixed[i]]
        if moving:
            return self._eager(
                f"input {moving[0]} is written in place and has other memory on every call", args
            )
        entry.static = [
            a if fixed or not isinstance(a, torch.Tensor) else a.clone()
            for a, fixed in zip(args, entry.fixed)
        ]
        graph = torch.ember.EmberGraph()
        # captured on a side stream of the inputs' device, not the current one
        device = next(
            (a.device for a in args if isinstance(a, torch.Tensor)),
            torch.device("ember", torch.ember.current_device()),
        )
        try:
            with torch.ember.device(device), torch.ember.graph(graph):
                outputs = self.gm(*entry.static)
                drawn = torch.ember.get_rng_state(device)
        except RuntimeError as e:
            if "captur" not in str(e):
                raise
            return self._eager(str(e).splitlines()[0], args)
        # The capture's outputs are this call's result, so its random numbers
        # are consumed as an eager call's (a graph's capture gives them back).
        torch.ember.set_rng_state(drawn, device)
        counters["captures"] += 1
        entry.graph, entry.outputs = graph, outputs
        entry.static_pointers = [
            s.data_ptr() if isinstance(s, torch.Tensor) else None for s in entry.static
        ]
        entry.input_views = self._input_views(entry, outputs)
        # Outputs in the graph's own memory: not views of inputs (a training
        # forward returns the parameters and inputs it saves for backward).
        inputs = {
            s.untyped_storage().data_ptr() for s in entry.static if isinstance(s, torch.Tensor)
        }
        entry.output_refs = [
            _refs(o)
            if isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() not in inputs
            else None
            for o in _flat(outputs)
        ]
        # The caller's fixed inputs are not held: a training forward's outputs
        # are the backward's fixed inputs, and a reference here would read as
        # a use of them.
        entry.static = [s if not fixed else None for s, fixed in zip(entry.static, entry.fixed)]
        return self._owned(self._outputs(entry, args))

    @staticmethod
    def _input_views(entry: _Entry, outputs) -> dict[int, _InputView]:
        copied = {
            s.untyped_storage().data_ptr(): i
            for i, (s, fixed) in enumerate(zip(entry.static, entry.fixed))
            if isinstance(s, torch.Tensor) and not fixed
        }
        views = {}
        for j, o in enumerate(_flat(outputs)):
            if isinstance(o, torch.Tensor):
                i = copied.get(o.untyped_storage().data_ptr())
                if i is not None:
                    views[j] = _InputView(o, i, entry.static[i])
        return views

    @staticmethod
    def _outputs(entry: _Entry, args):
        """The replay's outputs: the graph's, with views of copied inputs
        taken of the caller's inputs instead; None where one cannot be."""
        if not entry.input_views:
            return entry.outputs
        flat = _flat(entry.outputs)
        for j, view in entry.input_views.items():
            flat[j] = view.of(args[view.index])
            if flat[j] is None:
                return None
        if isinstance(entry.outputs, (list, tuple)):
            return type(entry.outputs)(flat)
        return flat[0]

    @staticmethod
    def _outputs_in_use(entry: _Entry) -> bool:
        return any(
            refs is not None and any(now > then for now, then in zip(_refs(o), refs))
            for o, refs in zip(_flat(entry.outputs), entry.output_refs)
        )

    def _replay(self, entry: _Entry, args, signature: tuple):
        for static, pointer, given, fixed in zip(
            entry.static, entry.static_pointers, args, entry.fixed
        ):
            if not isinstance(given, torch.Tensor) or given.data_ptr() == pointer:
                continue
            if fixed:
                # A fixed input (a parameter) has other memory than at capture
                # (`param.data = ...`, a new tensor): capture again, as CUDA
                # graph trees re-record when a static input moves.
                self.entries.pop(signature, None)
                self._guarded = None
                return self._call(*args)
            static.copy_(given)
        if self.keep_live_outputs and self._outputs_in_use(entry):
            counters["busy_outputs"] += 1
            return self.gm(*args)
        entry.graph.replay()
        outputs = self._outputs(entry, args)
        if outputs is None:  # an input laid out unlike at capture
            counters["busy_outputs"] += 1
            return self.gm(*args)
        counters["replays"] += 1
        return self._owned(outputs)

    def _owned(self, outputs):
        """The outputs as the caller receives them: clones of the graph's
        under clone_outputs."""
        if not self.clone_outputs:
            return outputs
        if isinstance(outputs, torch.Tensor):
            return outputs.clone()
        return type(outputs)(o.clone() if isinstance(o, torch.Tensor) else o for o in outputs)


def _symbolic(example_inputs) -> bool:
    return any(
        isinstance(d, torch.SymInt)
        for x in example_inputs
        if isinstance(x, torch.Tensor)
        for d in (*x.shape, *x.stride())
    ) or any(isinstance(x, torch.SymInt) for x in example_inputs)


def graphed(gm: Callable, example_inputs=(), *, automatic: bool = False) -> Callable:
    """A Dynamo graph as an ember graph. Dynamo guards each call's input
    metadata and grad mode, so a graph without symbolic shapes replays
    without recomputing the signature. ``automatic`` (chosen by the backend,
    not asked for by the user): outputs cloned, so the call means what an
    uncompiled one does, and no warning where the graph runs eagerly."""
    return GraphedModule(
        gm,
        guarded_signature=not _symbolic(example_inputs),
        clone_outputs=automatic,
        quiet=automatic,
    )


# A graph is replayed by default (backend="ember", no graphs option) when
# per-op host work is its cost: no value in it has more elements than this...
AUTO_MAX_ELEMENTS = 16384
# ... and it has at most this many ops.
AUTO_MAX_OPS = 256


def small_inference_graph(gm: torch.fx.GraphModule, example_inputs) -> bool:
    """Whether backend="ember" replays ``gm`` as an ember graph by default:
    compiled with grad disabled, static shapes, every input an ember tensor
    or a number, and every value the graph computes small (a batch-1 MLP's
    activations), where Inductor's kernels cannot beat a replay's lack of
    per-op host work."""
    if torch.is_grad_enabled() or _symbolic(example_inputs):
        return False
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and x.device.type != "ember":
            return False
    ops = 0
    for node in gm.graph.nodes:
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        ops += 1
        values = node.meta.get("example_value")
        for v in values if isinstance(values, (list, tuple)) else (values,):
            if isinstance(v, torch.Tensor) and v.numel() > AUTO_MAX_ELEMENTS:
                return False
    return 0 < ops <= AUTO_MAX_OPS
