"""Inductor's backend for the device type ``"ember"``.

Inductor splits code generation into *kernels* (a ``Scheduling`` turns fused
IR nodes into kernels) and a *wrapper* (Python or C++ code that allocates
buffers and calls kernels and ATen "extern kernels" in order). ember memory
is host memory, so:

- kernels: Inductor's own C++/OpenMP CPU scheduling (``CppScheduling``),
  unchanged: a generated kernel takes raw pointers, and an ember tensor's
  ``data_ptr()`` is a valid host pointer;
- wrapper: Inductor's Python wrapper with two ember-specific lines -- buffers
  are allocated on their ember device (``empty_strided(..., device=ember:i)``),
  and a C++ kernel is launched on the device's stream like an eager op
  (``kernel_launch.py``); extern kernels (``aten.addmm(..., out=buf)``)
  dispatch to ember like any eager call;
- C++ wrapper (``torch._inductor.config.cpp_wrapper``, AOTInductor): not
  supported -- it calls ATen through AOTI's per-device C shims, which exist
  for cpu/cuda/xpu/mps only; asking for it raises a clear error;
- device op overrides: the snippets the wrapper emits for device guards,
  synchronisation and raw streams;
- ``mode="reduce-overhead"``: the compiled code is captured and replayed as
  an ember graph (``inductor_graphs.py``, through Inductor's graph policy).

Registered for ``"ember"`` by :func:`register_inductor_backend` (see
``torch_ember/compile/__init__.py`` for when), together with
:mod:`torch_ember.compile.cpu_parity`.
"""

from __future__ import annotations

from pathlib import Path
from textwrap import dedent

from torch._inductor.codegen.common import (
    DeviceOpOverrides,
    register_backend_for_device,
    register_device_op_overrides,
)
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
from torch._inductor.codegen.wrapper import PythonWrapperCodegen, SubgraphPythonWrapperCodegen
from torch._inductor.custom_graph_pass import CustomGraphModulePass, get_hash_for_files
from torch._inductor.runtime.benchmarking import register_benchmarker
from torch._inductor.virtualized import V

DEVICE_TYPE = "ember"


class EmberScheduling(CppScheduling):
    """C++/OpenMP kernels (Inductor's CPU kernel codegen) for ember buffers."""

    def define_kernel(self, src_code, nodes, kernel_args=None):
        if "#pragma omp parallel" in src_code:
            _facts(V.graph.wrapper_code)["parallel_kernels"] += 1
        return super().define_kernel(src_code, nodes, kernel_args)


GRAPH_FACTS = "ember_graph_facts"
"""Name of the dict the generated module defines: what its code does, for
the graph policy (``inductor_graphs.py``) to decide whether to replay it.
It travels with the code, so a graph from the FX graph cache has it too."""


def _facts(wrapper: PythonWrapperCodegen) -> dict:
    root = _root(wrapper)
    facts = root.__dict__.get("_ember_facts")
    if facts is None:
        facts = root.__dict__["_ember_facts"] = {
            "max_buffer_elements": 0,  # the largest buffer the call allocates
            "symbolic_shapes": False,  # a buffer's or an input's shape with a symbol in it
            "parallel_kernels": 0,  # C++ kernels that open an OpenMP region
            "input_elements": [],  # per input in call order (-1: symbolic)
        }
    return facts


class _EmberWrapperLines:
    """The two lines of the Python wrapper that differ from CPU."""

    def make_allocation(
        self, name, device, dtype, shape, stride, allocation_shape=None, is_pinned=False
    ):
        if device.type != DEVICE_TYPE:
            return super().make_allocation(
                name, device, dtype, shape, stride, allocation_shape, is_pinned
            )
        if allocation_shape is None:
            allocation_shape = shape
        facts = _facts(self)
        elements = 1
        for dim in allocation_shape:
            try:
                elements *= int(dim)
            except TypeError:  # a sympy expression with free symbols
                facts["symbolic_shapes"] = True
                elements = 0
                break
        facts["max_buffer_elements"] = max(facts["max_buffer_elements"], elements)
        size = self.codegen_python_shape_tuple(allocation_shape)
        strides = self.codegen_python_shape_tuple(stride)
        index = device.index if device.index is not None else 0
        out = f"{name} = empty_strided({size}, {strides}, device={_device_name(self, index)}, dtype={dtype})"
        if tuple(shape) != tuple(allocation_shape):
            out += f".as_strided({self.codegen_python_shape_tuple(shape)}, {strides})"
        return out

    def codegen_reinterpret_view(self, data, size, stride, offset, writeline, dtype=None):
        expr = super().codegen_reinterpret_view(data, size, stride, offset, writeline, dtype)
        name = data.get_name()
        if name not in V.graph.graph_inputs:
            return expr
        # A graph input (a parameter, a user tensor) is viewed as a real view,
        # which shares the input's version counter. reinterpret_tensor makes
        # an alias with a counter of its own that never moves: ember's
        # packed-weight cache would keep using a pack after the weight was
        # written in place, and under inference_mode it is an inference
        # tensor, which ember does not pack at all.
        return expr.replace(f"reinterpret_tensor({name}, ", f"{_view_name(self)}({name}, ")

    def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, **kwargs):
        device = device or V.graph.get_current_device_or_throw()
        if device.type == DEVICE_TYPE and not kwargs.get("triton", True):
            # a C++ kernel: queued on its device's current stream behind the
            # ops launched before it (extern kernels), as an eager op is
            # (torch_ember/compile/kernel_launch.py)
            index = None if device.index is None else device.index
            # The arguments it writes: its non-const pointers (reported as
            # written at launch, kernel_launch.launch_cpp).
            arg_types = kwargs.get("arg_types")
            written = None
            if arg_types is not None and len(arg_types) == len(call_args):
                written = tuple(
                    i
                    for i, kind in enumerate(arg_types)
                    if str(kind).strip().endswith("*") and not str(kind).strip().startswith("const")
                )
            args = ", ".join(
                [str(index), repr(kernel_name), kernel_name, repr(written), *call_args]
            )
            self.writeline(f"{_launch_name(self)}({args}){self.ending}")
            return
        super()._generate_kernel_call_helper(kernel_name, call_args, device=device, **kwargs)


def _root(wrapper: PythonWrapperCodegen) -> PythonWrapperCodegen:
    """The wrapper whose header the generated module's globals go in."""
    while isinstance(wrapper, SubgraphPythonWrapperCodegen):
        wrapper = wrapper.parent_wrapper
    return wrapper


def _header_name(wrapper: PythonWrapperCodegen, name: str, definition: str) -> str:
    """``name``, defined once in the generated module's header by ``definition``."""
    root = _root(wrapper)
    defined = root.__dict__.setdefault("_ember_header_names", set())
    if name not in defined:
        defined.add(name)
        root.header.writeline(definition)
    return name


def _device_name(wrapper: PythonWrapperCodegen, index: int) -> str:
    """A module-level ``torch.device("ember", index)`` of the generated code."""
    name = f"ember_device_{index}"
    return _header_name(wrapper, name, f"{name} = torch.device('{DEVICE_TYPE}', {index})")


def _view_name(wrapper: PythonWrapperCodegen) -> str:
    """The generated code's name for ``torch_ember.compile.kernel_launch.input_view``."""
    name = "ember_input_view"
    return _header_name(
        wrapper, name, f"from torch_ember.compile.kernel_launch import input_view as {name}"
    )


def _launch_name(wrapper: PythonWrapperCodegen) -> str:
    """The generated code's name for ``torch_ember.compile.kernel_launch.launch_cpp``."""
    name = "ember_launch_cpp"
    return _header_name(
        wrapper, name, f"from torch_ember.compile.kernel_launch import launch_cpp as {name}"
    )


class EmberSubgraphWrapperCodegen(_EmberWrapperLines, SubgraphPythonWrapperCodegen):
    """Wrapper of a subgraph (control flow, graph partitions) on ember."""


class EmberPythonWrapperCodegen(_EmberWrapperLines, PythonWrapperCodegen):
    """Inductor's Python wrapper, allocating on ember."""

    @staticmethod
    def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
        if is_subgraph:
            return EmberSubgraphWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
        return EmberPythonWrapperCodegen()

    def generate_return(self, output_refs):
        # After every line of the call was generated, before the header is
        # assembled into the module (PythonWrapperCodegen._generate).
        facts = _facts(self)
        # The allocations above miss values that extern kernels allocate
        # themselves (ember::gemm's result), and a dynamic batch summed away
        # leaves every allocation static: every value counts, inputs apart
        # (in call order: the policy leaves out parameters and buffers).
        buffers = [_extent(b) for b in V.graph.buffers]
        inputs = [_extent(V.graph.graph_inputs[n]) for n in V.graph.graph_input_names]
        facts["max_buffer_elements"] = max(
            [facts["max_buffer_elements"], *(e for e in buffers if e is not None)]
        )
        facts["input_elements"] = [e if e is not None else -1 for e in inputs]
        if any(e is None for e in buffers + inputs):
            facts["symbolic_shapes"] = True
        self.header.writeline(f"{GRAPH_FACTS} = {facts!r}")
        super().generate_return(output_refs)


def _extent(value) -> int | None:
    """Elements of a graph value (0: not a tensor; None: sizes or strides
    with a symbol, or a symbolic scalar)."""
    if getattr(value, "free_symbols", None) and not hasattr(value, "get_size"):
        return None  # a SymInt input
    try:
        sizes = list(value.get_size())
    except (AttributeError, NotImplementedError, TypeError):
        return 0
    try:
        strides = list(value.get_stride())
    except (AttributeError, NotImplementedError, TypeError):
        strides = []
    if any(getattr(d, "free_symbols", None) for d in sizes + strides):
        return None
    elements = 1
    for d in sizes:
        elements *= int(d)
    return elements


class EmberCppWrapperCodegen(CppWrapperCpu):
    """Placeholder: the C++ wrapper needs AOTI C shims for ember (see module doc)."""

    @staticmethod
    def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
        raise NotImplementedError(
            "torch._inductor.config.cpp_wrapper (and AOTInductor) is not supported on ember: "
            "its generated code calls ATen through AOTI C shims that exist only for "
            "cpu/cuda/xpu/mps. Use the default Python wrapper (cpp_wrapper=False)."
        )


class EmberDeviceOpOverrides(DeviceOpOverrides):
    """Snippets of generated code that talk to the device."""

    def import_get_raw_stream_as(self, name: str) -> str:
        return dedent(
            f"""
            def {name}(_):
                return 0
            """
        )

    def set_device(self, device_idx: int) -> str:
        return f"torch.ember.set_device({device_idx})"

    def synchronize(self) -> str:
        return "torch.ember.synchronize()"

    def device_guard(self, device_idx: int) -> str:
        return f"torch.ember.device({device_idx})"

    def cpp_kernel_type(self) -> str:
        return "void*"


class EmberGraphPass(CustomGraphModulePass):
    """Inductor's per-device post-grad hook for ember graphs: ember's passes.

    It gives the default Inductor backend what ``backend="ember"`` runs in
    its own post-grad slot (``torch_ember/compile/passes/``, default options;
    skipped where that backend already ran them, and under ``cpu_parity``).
    The passes change only frozen GEMMs, so only inference graphs compiled
    with ``freezing``. Its ``uuid()`` -- a hash of this package's code
    generation and pass sources -- enters Inductor's FX graph cache key, so a
    cached ember graph is not reused after any of them changed.
    """

    def __call__(self, gm):
        import torch

        from torch_ember.compile import inductor_graphs, passes

        if torch._inductor.config.triton.cudagraphs and not inductor_graphs.installed():
            _warn_cudagraphs_skipped()
        if not gm.meta.get(passes.DONE_META) and not torch.backends.ember.cpu_parity:
            passes.run(gm, passes.Options())
        return gm

    def uuid(self):
        here = Path(__file__).resolve().parent
        files = [here / "inductor_backend.py", here / "cpu_parity.py"]
        files += sorted((here / "passes").glob("*.py"))
        import torch

        # the passes are skipped under cpu_parity: a graph cached without them must not be reused
        return (
            get_hash_for_files(tuple(str(f) for f in files)),
            bool(torch.backends.ember.cpu_parity),
        )


def _warn_cudagraphs_skipped() -> None:
    """mode="reduce-overhead" and "max-autotune" ask Inductor for CUDA graphs,
    which it builds for CUDA devices only. ember replays them through
    Inductor's graph policy (``inductor_graphs.py``), which is not installed
    in a process that has CUDA: there Inductor skips them on ember (as on
    CPU) and would say so only under TORCH_LOGS=cudagraphs."""
    import warnings

    warnings.warn(
        "Inductor's CUDA graphs (torch.compile mode='reduce-overhead' or "
        "'max-autotune') are CUDA-only and are skipped on ember, so nothing is "
        "replayed. Use torch.compile(model, backend='ember', mode='reduce-overhead') "
        "to replay the graph as an ember graph (torch.ember.EmberGraph).",
        UserWarning,
        stacklevel=2,
    )


def _benchmark_on_host(benchmarker, fn, *, warmup, rep, **kwargs):
    """Autotuning times ember choices with the CPU timer (ember runs on the host)."""
    return benchmarker.benchmark_cpu(fn, warmup=warmup, rep=rep)


def register_inductor_backend() -> None:
    from torch_ember.compile import cpu_parity, inductor_graphs

    register_backend_for_device(
        DEVICE_TYPE,
        EmberScheduling,
        EmberPythonWrapperCodegen,
        EmberCppWrapperCodegen,
        device_custom_pass=EmberGraphPass(),
    )
    register_device_op_overrides(DEVICE_TYPE, EmberDeviceOpOverrides())
    register_benchmarker(DEVICE_TYPE, _benchmark_on_host, override=True)
    cpu_parity.apply()
    inductor_graphs.install()


__all__ = [
    "EmberCppWrapperCodegen",
    "EmberDeviceOpOverrides",
    "EmberPythonWrapperCodegen",
    "EmberScheduling",
    "register_inductor_backend",
]
