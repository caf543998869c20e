"""Graph capture and replay on ember, in the shape of ``torch.cuda.graphs``.

The engine records the work of a capturing stream (see
``docs/architecture.md``, "Graphs"): ``replay()`` queues all of it on the
current stream as one unit, with no per-op host work. ``torch.accelerator.Graph``
works on ember too (the same C++ implementation, registered with PyTorch's
accelerator graph registry).

Differences from CUDA, all documented in the README:

* capture runs the work once while recording it, so the outputs hold a real
  result after ``capture_end()`` (CUDA leaves them unspecified until the
  first replay); the device generator's state is restored at
  ``capture_end()``, so capture consumes no random numbers;
* linear layers do not take the packed-weight kernels inside a graph (a
  replay reads weights from their memory, so an optimizer step between or
  inside replays is seen);
* warm up before capturing, as with CUDA: ember packs a linear layer's
  weight on its first calls, and a graph records the route the captured
  call took (``torch.accelerator.Graph``'s ``with`` form empties the cache,
  which drops the packs: warm up inside it, or use ``torch.ember.graph``);
* ``capture_error_mode`` as CUDA's for device-wide waits (``"global"``: any
  thread's raises, ``"thread_local"``: the capturing thread's, ``"relaxed"``:
  none; a wait on the capturing stream raises in every mode), but
  ``capture_end()`` runs on the capturing thread in every mode (the graph
  pool's allocation route is that thread's).
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any, ClassVar, Self

import torch

from torch_ember import _C

_CAPTURE_MODES = ("default", "global", "thread_local", "relaxed")


def is_current_stream_capturing() -> bool:
    """True if the current stream of the current device is capturing a graph."""
    return bool(_C._is_current_stream_capturing())


def graph_pool_handle() -> tuple[int, int]:
    """An opaque id of a fresh graph memory pool, for ``capture_begin(pool=...)``
    / ``graph(..., pool=...)``: graphs given the same id share memory."""
    return tuple(_C._graph_pool_handle())


class EmberGraph(torch._C._acceleratorGraph):
    """A captured sequence of ember work (torch.cuda.CUDAGraph).

    ``keep_graph`` is accepted for CUDA compatibility; an ember graph is
    always ready to replay once captured (``instantiate()`` does nothing).
    """

    def __new__(cls, keep_graph: bool = False) -> Self:
        return super().__new__(cls, keep_graph)

    def capture_begin(
        self, pool: tuple[int, int] | None = None, capture_error_mode: str = "global"
    ) -> None:
        """Begins capturing the current stream's work (never the default stream).

        ``pool``: a ``graph_pool_handle()`` or another graph's ``pool()``, to
        share memory; default: a private pool."""
        if capture_error_mode not in _CAPTURE_MODES:
            raise ValueError(
                f"capture_error_mode must be one of {_CAPTURE_MODES}, got {capture_error_mode!r}"
            )
        super().capture_begin(pool=pool, capture_error_mode=capture_error_mode)

    def capture_end(self) -> None:
        """Ends the capture (on the stream it began on); the graph can then replay."""
        super().capture_end()

    def replay(self) -> None:
        """Queues the captured work on the current stream (returns at once)."""
        super().replay()

    def reset(self) -> None:
        """Drops the captured work and the graph's hold on its memory pool."""
        super().reset()

    def pool(self) -> tuple[int, int]:
        """The id of this graph's memory pool (pass it to another capture to share)."""
        return tuple(super().pool())


class graph:
    """Context manager capturing the work inside it into ``ember_graph``
    (torch.cuda.graph): synchronises and collects garbage, then captures on ``stream`` (default: a side stream of the current device, shared by every
    ``graph`` context on that device). On an exception inside the block the
    capture is ended and the graph reset before the exception propagates."""

    # The last default capture stream used (torch.cuda.graph's attribute);
    # unlike CUDA's, which stays on the device current when it was first made,
    # there is one per device.
    default_capture_stream: torch.Stream | None = None
    _default_capture_streams: ClassVar[dict[int, torch.Stream]] = {}

    def __init__(
        self,
        ember_graph: EmberGraph,
        pool: tuple[int, int] | None = None,
        stream: torch.Stream | None = None,
        capture_error_mode: str = "global",
    ):
        if not isinstance(ember_graph, torch._C._acceleratorGraph):
            raise TypeError(
                f"torch.ember.graph expects a torch.ember.EmberGraph, got {type(ember_graph).__name__}"
            )
        if stream is None:
            device = torch.ember.current_device()
            if device not in graph._default_capture_streams:
                graph._default_capture_streams[device] = torch.ember.Stream(device)
            stream = graph.default_capture_stream = graph._default_capture_streams[device]
        self.ember_graph = ember_graph
        self.pool = pool
        self.capture_stream = stream
        self.capture_error_mode = capture_error_mode
        self._stream_context = torch.ember.stream(stream)

    def __enter__(self) -> None:
        torch.ember.synchronize()
        gc.collect()
        # Unlike torch.cuda.graph, no empty_cache(): it would also drop the
        # packed weights of the warm-up, and the capture would then record
        # the unpacked GEMM route instead of the kernels eager calls use.
        self._stream_context.__enter__()
        try:
            self.ember_graph.capture_begin(
                pool=self.pool, capture_error_mode=self.capture_error_mode
            )
        except BaseException:
            self._stream_context.__exit__(None, None, None)
            raise

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self.ember_graph.capture_end()
            else:
                self.ember_graph.reset()  # ends the capture, drops what it recorded
        finally:
            self._stream_context.__exit__(exc_type, exc, tb)


def _flat_tensors(values: Any) -> list[torch.Tensor]:
    return [v for v in torch.utils._pytree.tree_leaves(values) if isinstance(v, torch.Tensor)]


def make_graphed_callables(
    callables: Callable | tuple[Callable, ...],
    sample_args: tuple[Any, ...],
    num_warmup_iters: int = 3,
    allow_unused_input: bool = False,
    pool: tuple[int, int] | None = None,
) -> Callable | tuple[Callable, ...]:
    """Graphed versions of callables (torch.cuda.make_graphed_callables).

    Each callable (a function or an ``nn.Module``) is warmed up
    ``num_warmup_iters`` times on ``sample_args``, then its forward pass and,
    when anything requires grad, its backward pass are captured into two
    graphs sharing one pool. The returned callable copies its tensor
    arguments into the captured inputs, replays the forward graph and
    returns the captured outputs; autograd's backward replays the backward
    graph. Arguments must have the sample's shapes, dtypes and devices;
    a module must be in the same training/eval state as when graphed, and
    its parameters are read from their memory at every replay (updating
    them in place, as optimizers do, is seen)."""
    single = not isinstance(callables, tuple)
    if single:
        callables, sample_args = (callables,), (sample_args,)
    if len(callables) != len(sample_args):
        raise ValueError("make_graphed_callables: one tuple of sample args per callable")
    mempool = pool if pool is not None else graph_pool_handle()
    graphed = []
    for fn, args in zip(callables, sample_args):
        graphed.append(_graph_one(fn, tuple(args), num_warmup_iters, allow_unused_input, mempool))
    return graphed[0] if single else tuple(graphed)


def _graph_one(
    fn: Callable, args: tuple, warmup: int, allow_unused: bool, mempool: tuple[int, int]
) -> Callable:
    for a in _flat_tensors(args):
        if a.device.type != "ember":
            raise ValueError(
                "make_graphed_callables: every sample argument must be an ember tensor"
            )
    params = tuple(fn.parameters()) if isinstance(fn, torch.nn.Module) else ()
    if isinstance(fn, torch.nn.Module):
        for buffer in fn.buffers():
            if buffer.device.type != "ember":
                raise ValueError("make_graphed_callables: module buffers must be on ember")
    static_inputs = tuple(a.detach().clone().requires_grad_(a.requires_grad) for a in args)
    grad_inputs_of = tuple(i for i in static_inputs + params if i.requires_grad)
    side = torch.ember.Stream()
    side.wait_stream(torch.ember.current_stream())
    with torch.ember.stream(side):
        for _ in range(warmup):
            outputs = _flat_tensors(fn(*static_inputs))
            needs = [o for o in outputs if o.requires_grad]
            if needs and grad_inputs_of:
                torch.autograd.grad(
                    needs,
                    grad_inputs_of,
                    grad_outputs=[torch.ones_like(o) for o in needs],
                    allow_unused=allow_unused,
                )
        del outputs
    torch.ember.current_stream().wait_stream(side)
    forward_graph, backward_graph = EmberGraph(), EmberGraph()
    with graph(forward_graph, pool=mempool):
        static_outputs = fn(*static_inputs)
    flat_outputs = _flat_tensors(static_outputs)
    differentiable = [o for o in flat_outputs if o.requires_grad]
    static_grad_outputs: list[torch.Tensor] = []
    static_grad_inputs: tuple = ()
    if differentiable and grad_inputs_of:
        static_grad_outputs = [torch.empty_like(o) for o in differentiable]
        with graph(backward_graph, pool=mempool):
            static_grad_inputs = torch.autograd.grad(
                differentiable,
                grad_inputs_of,
                grad_outputs=static_grad_outputs,
                allow_unused=allow_unused,
            )
    out_spec = torch.utils._pytree.tree_structure(static_outputs)
    input_positions = [i for i, a in enumerate(static_inputs) if a.requires_grad]

    class Graphed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs_and_params):
            for static, given in zip(static_inputs, inputs_and_params[: len(static_inputs)]):
                if isinstance(static, torch.Tensor) and static.data_ptr() != given.data_ptr():
                    static.copy_(given)
            forward_graph.replay()
            return tuple(o.detach() for o in flat_outputs)

        @staticmethod
        def backward(ctx, *grads):
            if not static_grad_outputs:
                return (None,) * (len(static_inputs) + len(params))
            diff_grads = [g for g, o in zip(grads, flat_outputs) if o.requires_grad]
            for static, g in zip(static_grad_outputs, diff_grads):
                if g is None:
                    static.zero_()
                elif static.data_ptr() != g.data_ptr():
                    static.copy_(g)
            backward_graph.replay()
            by_input = dict(zip([id(t) for t in grad_inputs_of], static_grad_inputs))
            result = []
            for t in static_inputs + params:
                g = by_input.get(id(t))
                result.append(g.detach() if g is not None else None)
            return tuple(result)

    def run(*given):
        if len(given) != len(static_inputs):
            raise TypeError(
                f"graphed callable takes {len(static_inputs)} arguments, got {len(given)}"
            )
        for static, g in zip(static_inputs, given):
            if g.shape != static.shape or g.dtype != static.dtype or g.device != static.device:
                raise ValueError(
                    "graphed callable: argument shape/dtype/device "
                    f"{tuple(g.shape)}/{g.dtype}/{g.device} differs from the sample's "
                    f"{tuple(static.shape)}/{static.dtype}/{static.device}"
                )
        flat = Graphed.apply(*given, *params)
        return torch.utils._pytree.tree_unflatten(list(flat), out_spec)

    run.forward_graph = forward_graph  # type: ignore[attr-defined]
    run.backward_graph = backward_graph  # type: ignore[attr-defined]
    run.graphed_input_positions = input_positions  # type: ignore[attr-defined]
    if isinstance(fn, torch.nn.Module):
        module = fn

        def module_forward(*given):
            if module.training != training_state:
                raise RuntimeError(
                    "graphed module called in a different training/eval state than when graphed"
                )
            return run(*given)

        training_state = module.training
        module.forward = module_forward  # type: ignore[method-assign]
        return module
    return run
