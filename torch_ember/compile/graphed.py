"""``backend="ember"`` with ``options={"graphs": True}`` (or
``mode="reduce-overhead"``): a Dynamo graph replayed as an ember graph.

Inductor's C++ kernels write ember memory from the host, outside the
dispatcher, so a capture cannot record them; this path therefore runs the
Dynamo graph's ATen ops (ember's kernels: packed GEMMs, attention, ...) and
captures them. Per input shape signature it

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


def _signature(args) -> tuple:
    return tuple(
        (tuple(a.shape), a.dtype, str(a.device)) if isinstance(a, torch.Tensor) else (type(a), a)
        for a in args
    )


class _Entry:
    def __init__(self):
        self.calls = 0
        self.pointers: list[int | None] | None = None
        self.fixed: list[bool] = []
        self.static: list = []
        self.graph = None
        self.outputs = None


class GraphedModule:
    """Callable over a Dynamo ``GraphModule``: warm-up, capture, replay."""

    WARMUP = 2

    def __init__(self, gm: Callable):
        self.gm = gm
        self.entries: dict[tuple, _Entry] = {}
        self.eager_reason: str | None = None

    def _eager(self, reason: str, args):
        if self.eager_reason is None:
            self.eager_reason = reason
            counters["eager_fallbacks"] += 1
            warnings.warn(
                f"torch.compile(backend='ember', graphs): running eagerly: {reason}", stacklevel=3
            )
        return self.gm(*args)

    def __call__(self, *args):
        if self.eager_reason is not None:
            return self.gm(*args)
        if torch.is_grad_enabled() and any(
            isinstance(a, torch.Tensor) and a.requires_grad for a in args
        ):
            return self._eager("graphs are for inference (grad is enabled)", args)
        if any(isinstance(a, torch.Tensor) and a.device.type != "ember" for a in args):
            return self._eager("an input is not an ember tensor", args)
        entry = self.entries.setdefault(_signature(args), _Entry())
        if entry.graph is not None:
            return self._replay(entry, args)
        pointers = [a.data_ptr() if isinstance(a, torch.Tensor) else None for a in args]
        entry.fixed = (
            [p is not None and p == q for p, q in zip(pointers, entry.pointers)]
            if entry.pointers is not None
            else [False] * len(args)
        )
        entry.pointers = pointers
        entry.calls += 1
        if entry.calls <= self.WARMUP:
            return self.gm(*args)
        return self._capture(entry, args)

    def _capture(self, entry: _Entry, args):
        entry.static = [
            a if fixed or not isinstance(a, torch.Tensor) else a.clone()
            for a, fixed in zip(args, entry.fixed)
        ]
        graph = torch.ember.EmberGraph()
        try:
            with torch.ember.graph(graph):
                outputs = self.gm(*entry.static)
        except RuntimeError as e:
            if "captur" not in str(e):
                raise
            return self._eager(str(e).splitlines()[0], args)
        counters["captures"] += 1
        entry.graph, entry.outputs = graph, outputs
        return outputs

    def _replay(self, entry: _Entry, args):
        for i, (static, given) in enumerate(zip(entry.static, args)):
            if not isinstance(given, torch.Tensor):
                continue
            if entry.fixed[i]:
                if given.data_ptr() != static.data_ptr():
                    # A fixed input (a parameter) moved: capture again.
                    self.entries.pop(_signature(args), None)
                    return self(*args)
            elif given.data_ptr() != static.data_ptr():
                static.copy_(given)
        entry.graph.replay()
        counters["replays"] += 1
        return entry.outputs


def graphed(gm: Callable) -> Callable:
    return GraphedModule(gm)
