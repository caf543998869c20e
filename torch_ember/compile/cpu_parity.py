"""Where Inductor hard-codes ``device.type == "cpu"`` and ember must be treated alike.

ember runs Inductor's CPU kernel codegen, so every decision Inductor takes
*because the kernels are C++/OpenMP* must be taken for ember too. Inductor has
no hook for these; each is one narrow wrapper that answers for ember as it
answers for CPU and leaves every other device untouched. Applied once, by
:func:`torch_ember.compile.inductor_backend.register_inductor_backend`.

| Inductor spot | CPU behaviour | without this on ember |
|---|---|---|
| ``utils.get_current_backend`` (and its imports in ``codegen.common``, ``scheduler``, ``kernel.mm_common``) | ``config.cpu_backend`` ("cpp") | ``config.cuda_backend`` ("triton"): C++ codegen takes Triton's dtype/CSE paths and fails (``AssertionError`` in ``indirect_assert``, e.g. an embedding feeding a LayerNorm) |
| ``scheduler.BaseSchedulerNode.is_cpu`` | no loop reordering/reindexing in fusion (not supported by C++ codegen) | ``TypeError`` in ``_try_reindex_pointwise_for_reduction`` |
| ``ir.is_cpu`` | CPU thresholds for realizing heavy pointwise ops and reads | GPU thresholds (worse fusion decisions for C++ kernels) |
| ``utils._use_template_for_cpu`` | ``max-autotune`` offers the C++ GEMM template (prepacked weights, fused epilogue); on ember also the GEMMs ``backend="ember"`` annotated | ATen GEMM only |
| ``AlgorithmSelectorCache.__call__`` | no multi-template (needs Triton) | imports Triton under ``max-autotune`` |
| ``autotune_process.GPUDeviceBenchmarkMixin.do_bench`` | choices timed with the CPU timer | timed through CUDA |
| ``lowering.use_two_step_variance`` | ``var_mean`` of <= 1024 elements: sum, then squares (C++ threshold) | Welford (GPU threshold): a different kernel than CPU's |
| ``kernel.conv.conv_layout`` | output strides of ``aten.convolution`` from CPU's rule (oneDNN: channels-last in, channels-last out) | PyTorch models a PrivateUse1 conv as ``_ConvBackend.Overrideable`` (contiguous out), but ember runs CPU's kernel and returns CPU's strides: the generated ``assert_size_stride`` fails (ViT, ResNet) |
| ``lowering.cat`` (lowering of ``aten.cat``) | int8/uint8 cat falls back to ATen (no uint8 vector codegen) | generated C++ cat kernel |

Left as on a GPU (correct, possibly slower; see docs/compile.md): the
small-GEMM decompositions of ``aten.mm/addmm/bmm`` in
``torch/_inductor/decomposition.py``, pad-as-cat, argmax/argmin logical
indices over several permuted dims (``lowering._make_reduction_inner``).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import sys

import torch
from torch._inductor import autotune_process, ir, lowering, scheduler, select_algorithm, utils
from torch._inductor.kernel import conv

from torch_ember.compile.passes._gemm import TEMPLATE_META

HOST_DEVICE_TYPES = ("cpu", "ember")
_CPU = torch.device("cpu")

_applied = False


_tagged_gemms_only: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "ember_tagged_gemms_only", default=False
)


@contextlib.contextmanager
def templates_for_tagged_gemms_only():
    """Inside, the C++ GEMM template is offered on ember only for FX nodes annotated
    with ``TEMPLATE_META`` (used by ``backend="ember"`` with ``max_autotune_gemm``)."""
    token = _tagged_gemms_only.set(True)
    try:
        yield
    finally:
        _tagged_gemms_only.reset(token)


def _is_ember(device) -> bool:
    return device is not None and getattr(device, "type", device) == "ember"


def _is_host(device) -> bool:
    return device is not None and getattr(device, "type", device) in HOST_DEVICE_TYPES


@contextlib.contextmanager
def _seen_as_cpu(node):
    """``node.get_device()`` answers CPU inside the block (one CPU-only decision)."""
    object.__setattr__(node, "get_device", lambda: _CPU)
    try:
        yield node
    finally:
        object.__delattr__(node, "get_device")


def apply() -> None:
    global _applied
    if _applied:
        return
    _applied = True

    original_backend = utils.get_current_backend

    @functools.wraps(original_backend)
    def get_current_backend(device_type: str | None = None) -> str:
        if device_type is None:
            device_type = lowering.V.graph.get_current_device_or_throw().type
        if device_type == "ember":
            return utils.config.cpu_backend
        return original_backend(device_type)

    _rebind(original_backend, get_current_backend)

    def node_is_cpu(self) -> bool:
        return _is_host(self.get_device())

    scheduler.BaseSchedulerNode.is_cpu = node_is_cpu

    ir.is_cpu = lambda x: ir.get_device_type(x) in HOST_DEVICE_TYPES

    original_template = utils._use_template_for_cpu

    @functools.wraps(original_template)
    def use_template_for_cpu(layout) -> bool:
        if _is_ember(layout.device):
            if _tagged_gemms_only.get():
                # backend="ember": only the GEMMs its passes picked for the template
                node = getattr(lowering.V.graph, "current_node", None)
                return node is not None and bool(node.meta.get(TEMPLATE_META))
            return bool(utils.config.max_autotune or utils.config.max_autotune_gemm)
        return original_template(layout)

    utils._use_template_for_cpu = use_template_for_cpu

    original_call = select_algorithm.AlgorithmSelectorCache.__call__
    signature = inspect.signature(original_call)

    @functools.wraps(original_call)
    def select(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        layout = bound.arguments.get("layout")
        if layout is not None and _is_ember(getattr(layout, "device", None)):
            bound.arguments["return_multi_template"] = False
        return original_call(*bound.args, **bound.kwargs)

    select_algorithm.AlgorithmSelectorCache.__call__ = select

    mixin = autotune_process.GPUDeviceBenchmarkMixin
    original_bench = mixin.do_bench

    @functools.wraps(original_bench)
    def do_bench(self, fn, *input_tensors, out=None):
        tensors = [*input_tensors, out]
        if any(_is_ember(getattr(t, "device", None)) for t in tensors):
            return autotune_process.benchmarker.benchmark_cpu(fn)
        return original_bench(self, fn, *input_tensors, out=out)

    mixin.do_bench = do_bench

    original_two_step = lowering.use_two_step_variance

    @functools.wraps(original_two_step)
    def use_two_step_variance(x, axis, keepdim, input_dtype):
        if not _is_ember(x.get_device()):
            return original_two_step(x, axis, keepdim, input_dtype)
        with _seen_as_cpu(x):
            return original_two_step(x, axis, keepdim, input_dtype)

    lowering.use_two_step_variance = use_two_step_variance

    conv.conv_layout = _ember_conv_layout(conv.conv_layout)

    for overload in (torch.ops.aten.cat.default, torch.ops.aten.cat):
        original_cat = lowering.lowerings.get(overload)
        if original_cat is not None:
            lowering.lowerings[overload] = _ember_cat(original_cat)


def _rebind(original, replacement) -> None:
    """Replaces ``original`` in every Inductor module that imported it by name."""
    for name, module in list(sys.modules.items()):
        if (
            name.startswith("torch._inductor")
            and module is not None
            and (getattr(module, original.__name__, None) is original)
        ):
            setattr(module, original.__name__, replacement)


def _ember_conv_layout(original_layout):
    @functools.wraps(original_layout)
    def conv_layout(x, weight, bias, *args, **kwargs):
        layout = original_layout(x, weight, bias, *args, **kwargs)
        if not _is_ember(layout.device):
            return layout
        # ember runs CPU's convolution on host memory: ask CPU's rule for the strides
        with lowering.V.graph.fake_mode:
            as_cpu = [
                None
                if node is None
                else torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device="cpu")
                for node in (x, weight, bias)
                for t in [None if node is None else ir.ir_node_to_tensor(node)]
            ]
            out = torch.ops.aten.convolution(*as_cpu, *args, **kwargs)
            stride = ir.convert_shape_to_inductor(out.stride())
        return ir.FixedLayout(layout.device, layout.dtype, layout.size, stride)

    return conv_layout


def _ember_cat(original_cat):
    @functools.wraps(original_cat)
    def cat(inputs, dim=0):
        if (
            inputs
            and _is_ember(inputs[0].get_device())
            and all(t.get_dtype() in (torch.int8, torch.uint8) for t in inputs)
        ):
            for t in inputs:
                t.realize()
            return lowering.fallback_handler(torch.ops.aten.cat.default)(inputs, dim)
        return original_cat(inputs, dim)

    return cat
