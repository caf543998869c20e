"""The systems a workload runs on: a registry where each system is one function.

A system is ``fn(workload, threads) -> Prepared`` (or it raises ``Skip``).
``Prepared.run()`` runs the workload once, start to finish, and returns its
outputs (on any device; the harness copies them to CPU for the check). Every
system gets the same thread count and is measured at its best documented
inference configuration. To add a system, write one function:

    @register("ember-compiled", version=lambda: torch_ember_version())
    def ember_compiled(w: Workload, threads: int) -> Prepared:
        module = torch.compile(to_device_copy(w.module, "ember"), backend=...)
        return run_on(w, module, device="ember", sync=torch.ember.synchronize)

The order of ``SYSTEMS`` is the order of the report; ``cpu-eager`` is the
reference every other system is compared with and must stay first.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import importlib.metadata
import importlib.util
import io
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

from .system_base import (  # noqa: F401  (re-exported: the harness and tests import them here)
    SYSTEMS,
    Prepared,
    Skip,
    System,
    _dist_version,
    dynamic_dims,
    register,
    run_on,
    to_device_copy,
    torch_export,
)
from .workloads import Workload

# --------------------------------------------------------------------------- PyTorch


@register("cpu-eager", version=lambda: torch.__version__)
def cpu_eager(w: Workload, threads: int) -> Prepared:
    """PyTorch eager on CPU under torch.inference_mode() (the reference)."""
    return run_on(w, w.module)


def reset_compiler() -> None:
    """Forgets every compiled graph, and the weights they captured.

    torch._dynamo.reset() drops Dynamo's caches, but each graph Inductor
    compiled stays imported (``sys.modules["torch._inductor.runtime.
    compile_tasks.<hash>"]``), and with freezing its module globals hold the
    frozen weights: on ember, ~830 MiB per BERT-sized workload carried into
    every later workload. Dropping those modules lets the weights go.
    """
    import torch._dynamo
    import torch._inductor.codecache

    torch._dynamo.reset()
    torch._inductor.codecache.PyCodeCache.cache_clear()
    prefix = "torch._inductor.runtime.compile_tasks."
    for name in [n for n in sys.modules if n.startswith(prefix)]:
        del sys.modules[name]


@register("cpu-inductor", version=lambda: torch.__version__)
def cpu_inductor(w: Workload, threads: int) -> Prepared:
    """torch.compile (Inductor, default mode) with torch._inductor.config.freezing=True,
    called under torch.inference_mode(); dynamic shapes by dynamo's automatic
    dynamic (decode: recompiles once during warm-up)."""
    import torch._dynamo
    import torch._inductor.config

    previous = torch._inductor.config.freezing
    torch._inductor.config.freezing = True  # read when compiling, i.e. at the first calls

    def close() -> None:
        reset_compiler()
        torch._inductor.config.freezing = previous

    return run_on(w, torch.compile(w.module), close=close)


# --------------------------------------------------------------------------- zentorch

# Compiles and runs a two-layer MLP with backend="zentorch" in a child process:
# a CPU that zentorch's native library cannot run on may die of SIGILL, which
# would take the whole suite with it if it happened in-process.
_ZENTORCH_PROBE = r"""
import torch, zentorch
import torch._inductor.config
torch._inductor.config.freezing = True
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).eval()
x = torch.randn(4, 32)
with torch.inference_mode():
    out = torch.compile(m, backend="zentorch")(x)
    ref = m(x)
print("ZENTORCH_PROBE_OK", float((out - ref).abs().max()))
"""


@functools.cache
def zentorch_unusable() -> str | None:
    """Why zentorch cannot run here (not installed, import fails, crashes on this CPU),
    or None. Probed once per process, in a child process."""
    if importlib.util.find_spec("zentorch") is None:
        return "zentorch not installed (make bench-deps)"
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0", "OMP_NUM_THREADS": "1"}
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _ZENTORCH_PROBE],
            check=False,
            capture_output=True,
            text=True,
            timeout=600,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return "zentorch probe (compile + run a 2-layer MLP) did not finish in 600 s"
    if proc.returncode == 0 and "ZENTORCH_PROBE_OK" in proc.stdout:
        return None
    lines = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()]
    last = lines[-1][:240] if lines else ""
    how = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else "failed"
    return f"zentorch {how} on this CPU ({cpu_vendor()}) in a probe compile: {last}"


def cpu_vendor() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown vendor"


@register("zentorch", version=lambda: _dist_version("zentorch"))
def zentorch_cpu(w: Workload, threads: int) -> Prepared:
    """AMD zentorch (ZenDNN plugin for PyTorch): `import zentorch`, then
    torch.compile(model, backend="zentorch") with torch._inductor.config.freezing=True
    (zentorch's recommended TORCHINDUCTOR_FREEZING=1), called under
    torch.inference_mode(), CPU tensors; dynamic shapes by dynamo's automatic dynamic
    (as cpu-inductor). The Inductor settings zentorch's backend leaves behind
    (joint_custom_post_pass = its graph passes) are restored after each of its
    compiles, so the other compiled systems in the run do not inherit them. It runs on
    its own copy of the weights and inputs (zentorch reorders GEMM weights in place)."""
    reason = zentorch_unusable()
    if reason is not None:
        raise Skip(reason)
    try:
        import torch._dynamo
        import torch._inductor.config

        with warnings.catch_warnings():  # its TorchScript helpers: torch.jit deprecations
            warnings.simplefilter("ignore", DeprecationWarning)
            import zentorch

        zen_backend = torch._dynamo.lookup_backend("zentorch")
    except Exception as e:  # noqa: BLE001 - e.g. torch minor version != zentorch's build
        raise Skip(f"zentorch not usable: {type(e).__name__}: {str(e)[:200]}") from None

    def backend(gm, example_inputs):
        cfg = torch._inductor.config
        saved = (cfg.freezing, cfg.joint_custom_post_pass)
        cfg.freezing = True  # compile_fx reads it during this call
        try:
            return zen_backend(gm, example_inputs)
        finally:
            cfg.freezing, cfg.joint_custom_post_pass = saved

    notes = [f"zentorch {getattr(zentorch, '__version__', '?')}"]
    if cpu_vendor() != "AuthenticAMD":
        notes.append(f"zentorch targets AMD EPYC; this CPU is {cpu_vendor()}")
    # Its own copy of the weights and inputs: zentorch reorders GEMM weight operands in
    # place on the first run (seen: GPT-2's Conv1D weights, the right operand of a bf16
    # matmul even though it is a graph input), which would corrupt the shared module and
    # inputs for every system after it.
    own = dataclasses.replace(
        w, module=copy.deepcopy(w.module), inputs=tuple(x.clone() for x in w.inputs)
    )
    return run_on(
        own, torch.compile(own.module, backend=backend), notes=notes, close=reset_compiler
    )


# --------------------------------------------------------------------------- ONNX Runtime


def _export_onnx(w: Workload, path: Path) -> str:
    """Exports ``w.module`` to ``path``; returns which exporter worked.

    The dynamo exporter (torch.export -> ONNX, torch's default) first; the
    TorchScript exporter (``dynamo=False``) if it fails.
    """
    errors = []
    with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):
        try:
            torch.onnx.export(
                w.module, w.inputs, str(path), dynamo=True, dynamic_shapes=w.dynamic_shapes
            )
            return "dynamo"
        except Exception as e:  # noqa: BLE001 - fall back, keep the reason
            errors.append(f"dynamo: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        names = [f"input_{i}" for i in range(len(w.inputs))]
        axes = {n: {d: f"dyn{d}" for d in dims} for n, dims in zip(names, dynamic_dims(w)) if dims}
        try:
            torch.onnx.export(
                w.module,
                w.inputs,
                str(path),
                dynamo=False,
                input_names=names,
                dynamic_axes=axes or None,
                opset_version=17,
            )
            return "torchscript (dynamo exporter failed: " + errors[0] + ")"
        except Exception as e:  # noqa: BLE001
            errors.append(f"torchscript: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    raise Skip("ONNX export failed: " + "; ".join(errors))


def _to_numpy(x: torch.Tensor):
    if x.dtype == torch.bfloat16:  # numpy has no bf16; ml_dtypes (an onnx dependency) has
        import ml_dtypes

        return x.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return x.numpy()


def _from_numpy(array) -> torch.Tensor:
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view("int16")).view(torch.bfloat16)
    return torch.from_numpy(array)


@register("onnxruntime", version=lambda: _dist_version("onnxruntime"))
def onnxruntime_cpu(w: Workload, threads: int) -> Prepared:
    """ONNX Runtime CPUExecutionProvider, graph optimizations ORT_ENABLE_ALL,
    intra_op_num_threads=threads, inter_op_num_threads=1, sequential; model
    exported with torch.onnx.export (dynamo exporter, TorchScript fallback)."""
    try:
        import onnxruntime as ort
    except ImportError as e:
        raise Skip(f"onnxruntime not installed ({e})") from None
    tmp = Path(tempfile.mkdtemp(prefix="ember-bench-onnx-"))
    try:
        exporter = _export_onnx(w, tmp / f"{w.name}.onnx")
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        try:
            sess = ort.InferenceSession(
                str(tmp / f"{w.name}.onnx"), so, providers=["CPUExecutionProvider"]
            )
        except Exception as e:  # noqa: BLE001
            raise Skip(f"ORT session: {str(e).splitlines()[0][:200]}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    names = [i.name for i in sess.get_inputs()]
    if len(names) != len(w.inputs):
        raise Skip(f"exported graph has {len(names)} inputs, the module {len(w.inputs)}")

    def call(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outs = sess.run(None, {n: _to_numpy(x) for n, x in zip(names, xs)})
        return tuple(_from_numpy(o) for o in outs)

    return run_on(w, call, notes=[f"exporter: {exporter}"])


# --------------------------------------------------------------------------- OpenVINO


def _ov_tensor(ov, x: torch.Tensor):
    if x.dtype == torch.bfloat16:  # numpy has no bf16: hand OpenVINO the raw bits
        return ov.Tensor(x.view(torch.int16).numpy(), list(x.shape), ov.Type.bf16)
    return x.numpy()


def _from_ov(array, dtype: torch.dtype | None) -> torch.Tensor:
    if dtype == torch.bfloat16:
        return torch.from_numpy(array.view("int16")).view(torch.bfloat16)
    return torch.from_numpy(array)


@register("openvino", version=lambda: _dist_version("openvino"))
def openvino_cpu(w: Workload, threads: int) -> Prepared:
    """OpenVINO CPU plugin: torch.export -> ov.convert_model (TorchScript tracing
    fallback) -> ov.compile_model with INFERENCE_NUM_THREADS=threads,
    PERFORMANCE_HINT=LATENCY, INFERENCE_PRECISION_HINT=the workload's dtype
    (f32 set explicitly: OpenVINO would otherwise pick bf16 on CPUs with bf16
    support); static input shapes except the dims the workload declares dynamic."""
    try:
        import openvino as ov
    except ImportError as e:
        raise Skip(f"openvino not installed ({e})") from None
    notes = []
    try:
        model = ov.convert_model(torch_export(w))
        notes.append("converted from torch.export")
    except Exception as e:  # noqa: BLE001
        first = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
        try:
            with torch.no_grad():
                model = ov.convert_model(w.module, example_input=w.inputs)
            notes.append(f"converted by TorchScript tracing (torch.export route: {first})")
        except Exception as e2:  # noqa: BLE001
            raise Skip(f"ov.convert_model failed: {first}; tracing: {str(e2)[:160]}") from None
    shapes = [
        ov.PartialShape([-1 if d in dyn else n for d, n in enumerate(x.shape)])
        for x, dyn in zip(w.inputs, dynamic_dims(w))
    ]
    if len(model.inputs) != len(w.inputs):
        raise Skip(f"converted model has {len(model.inputs)} inputs, the module {len(w.inputs)}")
    model.reshape(dict(zip(model.inputs, shapes)))
    precision = "bf16" if w.dtype == torch.bfloat16 else "f32"
    compiled = ov.compile_model(
        model,
        "CPU",
        {
            "INFERENCE_NUM_THREADS": threads,
            "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_PRECISION_HINT": precision,
        },
    )
    request = compiled.create_infer_request()
    out_dtypes = [
        torch.bfloat16 if o.get_element_type() == ov.Type.bf16 else None for o in compiled.outputs
    ]

    def call(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        res = request.infer([_ov_tensor(ov, x) for x in xs], share_inputs=True)
        return tuple(_from_ov(res[i], dt) for i, dt in enumerate(out_dtypes))

    return run_on(w, call, notes=notes)


# --------------------------------------------------------------------------- ember


def torch_ember_version() -> str:
    version = _dist_version("torch_ember")
    try:
        here = Path(__file__).resolve().parent
        rev = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "--short", "HEAD"],
            check=False,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return f"{version} (git {rev})" if rev else version
    except Exception:  # noqa: BLE001
        return version


@register("ember-eager", version=torch_ember_version)
def ember_eager(w: Workload, threads: int) -> Prepared:
    """ember eager: module and inputs on "ember" (model.to("ember")), under
    torch.inference_mode(), torch.ember.synchronize() at the end of a run."""
    if not hasattr(torch, "ember"):
        raise Skip("torch_ember is not loaded")
    module = to_device_copy(w.module, "ember")
    return run_on(w, module, device="ember", sync=torch.ember.synchronize)


def _ember_within(w: Workload, mode: Callable[[], contextlib.AbstractContextManager]) -> Prepared:
    """ember eager with ``mode()`` entered around this system's runs only: around
    each timed sample (the harness interleaves systems sample by sample), and
    around each run made alone (the first run, warm-up, checks; the decode
    driver's argmax is inside)."""
    if not hasattr(torch, "ember"):
        raise Skip("torch_ember is not loaded")
    prepared = run_on(
        w,
        to_device_copy(w.module, "ember"),
        device="ember",
        sync=torch.ember.synchronize,
        close=torch.ember.empty_cache,
    )
    inner = prepared.run

    def run() -> tuple:
        with mode():
            return inner()

    prepared.run = run
    prepared.mode, prepared.run_in_mode = mode, inner
    return prepared


@register("ember-tuned", version=torch_ember_version)
def ember_tuned(w: Workload, threads: int) -> Prepared:
    """ember eager with torch.backends.ember.benchmark = True: each GEMM and 2-D
    convolution signature the packed-weight route does not take times its
    algorithms (MKL vs oneDNN; oneDNN vs im2col) during warm-up and keeps the
    fastest (docs/backends.md)."""
    return _ember_within(w, lambda: torch.backends.ember.flags(benchmark=True))


@register("ember-sync", version=torch_ember_version)
def ember_sync(w: Workload, threads: int) -> Prepared:
    """ember eager with torch.backends.ember.async_execution = False around its
    own runs: every op runs at its call on the calling thread (the synchronous
    engine), the baseline of asynchronous execution (ember-eager launches the
    hot ops on the stream's worker)."""
    backends = getattr(torch.backends, "ember", None)
    if backends is not None and not hasattr(backends, "async_execution"):
        raise Skip("this torch_ember build has no torch.backends.ember.async_execution")
    return _ember_within(w, lambda: torch.backends.ember.flags(async_execution=False))


@register("ember-async", version=torch_ember_version)
def ember_async(w: Workload, threads: int) -> Prepared:
    """ember eager with async_execution = True around its own runs: launched
    ops are queued on the stream's worker, except, on an idle stream, results
    of >= 64 Ki elements and any while the worker sleeps (until a burst of
    launches rouses it) but a skinny GEMM over a pack of >= 1 MiB: they run
    at the call (the default from 2 cores: there ember-eager is ember-async)."""
    backends = getattr(torch.backends, "ember", None)
    if backends is not None and not hasattr(backends, "async_execution"):
        raise Skip("this torch_ember build has no torch.backends.ember.async_execution")
    return _ember_within(w, lambda: torch.backends.ember.flags(async_execution=True))


@register("ember-parity", version=torch_ember_version)
def ember_parity(w: Workload, threads: int) -> Prepared:
    """ember eager with torch.backends.ember.cpu_parity = True: every op runs CPU's
    own ATen kernel (bitwise equal to CPU) instead of ember's fastest kernels; set
    only around this system's runs (flags(cpu_parity=True))."""
    backends = getattr(torch.backends, "ember", None)
    if backends is not None and not hasattr(backends, "cpu_parity"):
        raise Skip("this torch_ember build has no torch.backends.ember.cpu_parity")
    return _ember_within(w, lambda: torch.backends.ember.flags(cpu_parity=True))


# bf16 operands carry 8 significant bits: outputs agree to ~2^-8 relative
MEDIUM_RTOL = 3e-2


@contextlib.contextmanager
def _float32_matmul_precision(value: str):
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(value)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


@register("ember-medium", version=torch_ember_version)
def ember_medium(w: Workload, threads: int) -> Prepared:
    """ember eager with torch.set_float32_matmul_precision("medium") around its own
    runs: fp32 GEMMs take bf16 operands with fp32 accumulation (skinny GEMMs stream
    bf16-packed weights, half the bytes); convolutions stay fp32, as CPU's do;
    compared with CPU at rtol 3e-2 (bf16 rounding), not the fp32 tolerance."""
    if w.dtype != torch.float32:
        raise Skip("fp32 precision applies to float32 workloads only")
    prepared = _ember_within(w, lambda: _float32_matmul_precision("medium"))
    prepared.rtol = max(w.rtol, MEDIUM_RTOL)
    prepared.notes.append(f"compared at rtol {prepared.rtol:g} (bf16 products)")
    return prepared


def _ember_compile(w: Workload, backend: str, freezing: bool) -> Prepared:
    import torch._dynamo
    import torch._inductor.config

    if not hasattr(torch, "ember"):
        raise Skip("torch_ember is not loaded")

    previous = torch._inductor.config.freezing
    torch._inductor.config.freezing = freezing  # read when compiling, i.e. at the first calls

    def close() -> None:
        reset_compiler()
        torch._inductor.config.freezing = previous

    module = torch.compile(to_device_copy(w.module, "ember"), backend=backend)
    return run_on(w, module, device="ember", sync=torch.ember.synchronize, close=close)


@register("ember-compiled", version=torch_ember_version)
def ember_compiled(w: Workload, threads: int) -> Prepared:
    """torch.compile (Inductor, default mode) on ember -- Inductor's C++ kernels on
    ember memory -- with torch._inductor.config.freezing=True (as cpu-inductor),
    under torch.inference_mode()."""
    return _ember_compile(w, "inductor", freezing=True)


@register("ember-backend", version=torch_ember_version)
def ember_backend(w: Workload, threads: int) -> Prepared:
    """torch.compile(backend="ember"): Inductor on ember plus ember's inference passes
    (freezing; linears on ember's packed weights; small one-row linear + activation fusion; see docs/compile.md),
    under torch.inference_mode()."""
    return _ember_compile(w, "ember", freezing=False)
