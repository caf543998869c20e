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
same shapes (as with CUDA graphs: clone what you keep). Inference only: a
graph compiled with grad enabled runs eagerly (a warning says so). A graph
that cannot be captured (an op with no replayable form, a host read) runs
eagerly from then on, with a warning naming the reason.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

counters = {"captures": 0, "replays": 0, "eager_fallbacks": 0}


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


def _views_of_moving_inputs(outputs, args, fixed: list[bool]) -> bool:
    """Whether an output shares memory with an input a replay would copy."""
    moving = {
        a.untyped_storage().data_ptr()
        for a, f in zip(args, fixed)
        if isinstance(a, torch.Tensor) and not f
    }
    flat = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    return any(
        isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() in moving for o in flat
    )


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
    """

    WARMUP = 2

    def __init__(
        self,
        gm: Callable,
        *,
        written_inputs: frozenset[int] = frozenset(),
        static_inputs: frozenset[int] | None = None,
        label: str = "torch.compile(backend='ember', graphs)",
    ):
        self.gm = gm
        self.entries: dict[tuple, _Entry] = {}
        self.eager_reason: str | None = None
        self.written_inputs = written_inputs
        self.static_inputs = static_inputs
        self.label = label

    def _give_up(self, reason: str) -> None:
        if self.eager_reason is None:
            self.eager_reason = reason
            counters["eager_fallbacks"] += 1
            warnings.warn(f"{self.label}: running eagerly: {reason}", stacklevel=4)

    def _eager(self, reason: str, args):
        self._give_up(reason)
        return self.gm(*args)

    def __call__(self, *args):
        if self.eager_reason is not None:
            return self.gm(*args)
        signature = _signature(args)
        if isinstance(signature, str):
            return self._eager(signature, args)
        entry = self.entries.get(signature)
        if entry is None:
            entry = self.entries[signature] = _Entry()
        elif entry.graph is not None:
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
        entry.pointers = pointers
        entry.calls += 1
        if entry.calls < self.WARMUP:
            return self.gm(*args)
        if entry.calls == self.WARMUP:
            outputs = self.gm(*args)
            if _views_of_moving_inputs(outputs, args, entry.fixed):
                # a replay would hand out a view of its static copy, not of the caller's input
                self._give_up("an output is a view of an input")
            return outputs
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
        except RuntimeError as e:
            if "captur" not in str(e):
                raise
            return self._eager(str(e).splitlines()[0], args)
        counters["captures"] += 1
        entry.graph, entry.outputs = graph, outputs
        entry.static_pointers = [
            s.data_ptr() if isinstance(s, torch.Tensor) else None for s in entry.static
        ]
        return outputs

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
                return self(*args)
            static.copy_(given)
        entry.graph.replay()
        counters["replays"] += 1
        return entry.outputs


def graphed(gm: Callable) -> Callable:
    return GraphedModule(gm)
