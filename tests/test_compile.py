"""torch.compile on ember: Dynamo's device interface, Inductor's C++ kernels on ember
memory, max-autotune, dynamic shapes, training, and ``backend="ember"``'s passes.

Every compiled result is compared with eager on ember. Generated C++ kernels may
round differently from ATen's (fused, vectorised, FMA), hence the tolerances of a
few float32 ulps instead of bitwise equality. Inductor's caches are off here so
every test really generates code and runs the passes whose counters it checks.
"""

import pytest
import torch
import torch._dynamo
import torch._inductor.config as inductor_config
from isa import PANEL_GEMM
from torch._dynamo.utils import counters

import torch_ember
from torch_ember.compile import backend as ember_backend_module

DEVICE = "ember"
TOL = {"rtol": 1e-5, "atol": 1e-5}


@pytest.fixture(autouse=True)
def _fresh_compile():
    torch._dynamo.reset()
    counters.clear()
    ember_backend_module.reset_counters()
    with inductor_config.patch(
        fx_graph_cache=False,
        fx_graph_remote_cache=False,
        autotune_local_cache=False,
        # autotuning (max-autotune, backend="ember") times each choice briefly
        inductor_default_autotune_warmup=1,
        inductor_default_autotune_rep=3,
    ):
        yield
    torch._dynamo.reset()


def _mlp(width: int = 32, act=torch.nn.GELU, device: str = DEVICE) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(width, 2 * width),
        act(),
        torch.nn.Linear(2 * width, width),
        torch.nn.LayerNorm(width),
    ).to(device)


def _randn(*shape: int, device: str = DEVICE) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(device)


def _assert_close(actual: torch.Tensor, expected: torch.Tensor, **tol) -> None:
    assert actual.device == expected.device
    torch.testing.assert_close(actual.cpu(), expected.cpu(), **(tol or TOL))


# --------------------------------------------------------------------------- registration


def test_import_torch_ember_does_not_import_dynamo(run_python):
    code = "import sys, torch, torch_ember; print('torch._dynamo' in sys.modules)"
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_dynamo_and_inductor_know_ember():
    from torch._dynamo.device_interface import get_interface_for_device
    from torch._inductor.codegen.common import (
        get_device_op_overrides,
        get_scheduling_for_device,
        get_wrapper_codegen_for_device,
    )

    from torch_ember.compile import inductor_backend
    from torch_ember.compile.device_interface import EmberInterface

    torch_ember.compile.register()
    assert torch_ember.compile.is_registered() == {"dynamo": True, "inductor": True}
    assert get_interface_for_device("ember") is EmberInterface
    assert get_interface_for_device(torch.device("ember", 0)) is EmberInterface
    assert get_scheduling_for_device("ember") is inductor_backend.EmberScheduling
    assert get_wrapper_codegen_for_device("ember") is inductor_backend.EmberPythonWrapperCodegen
    assert isinstance(get_device_op_overrides("ember"), inductor_backend.EmberDeviceOpOverrides)
    assert torch._dynamo.lookup_backend("ember") is ember_backend_module.ember_backend


def test_device_interface_delegates_to_torch_ember():
    from torch_ember.compile.device_interface import EmberInterface

    assert EmberInterface.is_available() and not EmberInterface.is_triton_capable()
    assert EmberInterface.device_count() == torch.ember.device_count()
    assert EmberInterface.current_device() == torch.ember.current_device() == 0
    assert EmberInterface.get_raw_stream(0) == 0
    assert EmberInterface.get_device_properties(0).cores >= 1
    assert EmberInterface.Worker.get_device_properties(0).name
    assert isinstance(EmberInterface.get_compute_capability(0), str)
    EmberInterface.synchronize()
    assert EmberInterface.exchange_device(0) == 0


@pytest.mark.requires_two_devices
def test_device_interface_exchanges_devices():
    from torch_ember.compile.device_interface import EmberInterface

    assert EmberInterface.exchange_device(1) == 0
    assert torch.ember.current_device() == 1
    assert EmberInterface.maybe_exchange_device(0) == 1
    assert torch.ember.current_device() == 0


# --------------------------------------------------------------------------- default Inductor


def test_default_inductor_generates_cpp_kernels_on_ember_memory():
    from torch._inductor import metrics

    model, x = _mlp(), _randn(8, 32)
    metrics.reset()
    torch_ember.reset_fallback_stats()
    compiled = torch.compile(model)
    out = compiled(x)
    assert out.device == x.device
    _assert_close(out, model(x))
    assert metrics.generated_kernel_count >= 2  # GELU, LayerNorm: fused C++ kernels
    assert torch_ember.fallback_stats() == {}  # every extern kernel ran zero-copy


@pytest.mark.requires_two_devices
def test_compiled_model_on_second_device_stays_there():
    model, x = _mlp(device="ember:1"), _randn(4, 32, device="ember:1")
    out = torch.compile(model)(x)
    assert out.device == torch.device("ember", 1)
    _assert_close(out, model(x))


def test_embedding_then_layernorm():
    """Reductions over gathered rows take CPU's C++ path (cpu_parity: get_current_backend)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(50, 768), torch.nn.LayerNorm(768)).to(DEVICE)
    ids = torch.randint(0, 50, (1, 8)).to(DEVICE)
    _assert_close(torch.compile(model)(ids), model(ids))


def test_convolution_channels_last_strides():
    """ember runs CPU's convolution: output strides follow CPU's rule (cpu_parity: conv_layout)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 1)
    ).to(DEVICE)
    x = _randn(1, 3, 8, 8)
    with torch.no_grad():
        _assert_close(torch.compile(model)(x), model(x), rtol=1e-4, atol=1e-5)


def test_dynamic_shapes_one_graph_for_every_batch():
    model = _mlp()
    compiled = torch.compile(model, dynamic=True)
    for batch in (3, 5, 17):
        x = _randn(batch, 32)
        _assert_close(compiled(x), model(x))
    assert counters["stats"]["unique_graphs"] == 1


def test_max_autotune_tiny_mm():
    """max-autotune on ember: ATen and the C++ GEMM template are timed, the faster is kept."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(32, 32).to(DEVICE).eval()
    x = _randn(32, 32)
    with torch.no_grad(), inductor_config.patch(freezing=True):
        out = torch.compile(linear, mode="max-autotune-no-cudagraphs")(x)
        _assert_close(out, linear(x), rtol=1e-4, atol=1e-5)
    assert counters["inductor"]["select_algorithm_autotune"] >= 1


# Adam's first steps are ~lr * sign(grad): eps keeps a rounding-level difference in
# a near-zero gradient from flipping a sign
OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=1e-2, eps=1e-4),
}


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_training_step_equals_eager(optimizer):
    """Forward + backward + optimizer step through compile, on ember, against eager on ember."""
    eager, compiled_model = _mlp(), _mlp()
    opt_eager = OPTIMIZERS[optimizer](eager.parameters())
    opt_compiled = OPTIMIZERS[optimizer](compiled_model.parameters())
    forward = torch.compile(compiled_model)

    @torch.compile
    def step():
        opt_compiled.step()

    x = _randn(8, 32)
    for _ in range(2):
        for model, opt, run, do_step in (
            (eager, opt_eager, eager, opt_eager.step),
            (compiled_model, opt_compiled, forward, step),
        ):
            opt.zero_grad()
            run(x).square().mean().backward()
            do_step()
    for a, b in zip(eager.parameters(), compiled_model.parameters()):
        assert b.grad is not None and b.grad.device.type == DEVICE
        _assert_close(b, a, rtol=1e-4, atol=1e-5)


def test_cpu_inductor_still_works():
    model, x = _mlp(device="cpu"), _randn(4, 32, device="cpu")
    with torch.no_grad(), inductor_config.patch(freezing=True):
        _assert_close(torch.compile(model)(x), model(x))


def test_cpp_wrapper_is_refused_clearly():
    with (
        inductor_config.patch(cpp_wrapper=True),
        pytest.raises(Exception, match="cpp_wrapper.*not supported on ember"),
    ):
        torch.compile(_mlp())(_randn(2, 32))


# --------------------------------------------------------------------------- backend="ember"

# backend="ember" replays small inference graphs by default (graphs="auto"); the
# tests of its Inductor passes use small graphs, so they ask for Inductor.
INDUCTOR = {"graphs": False}


def _compiled_by_inductor(backend):
    return {"backend": backend, **({"options": INDUCTOR} if backend == "ember" else {})}


def test_named_backend_batch_one_mlp_is_one_kernel_chain():
    """One row and small weights (``fuse_max_weight``, 2**16 by default):
    Linear -> GELU -> Linear as generated C++ (no ATen GEMM), where the graph is
    compiled by Inductor (``graphs=False``: by default so small a graph is
    replayed, test_named_backend_replays_small_inference_graphs)."""
    from torch._inductor import metrics

    model, x = _mlp().eval(), _randn(1, 32)
    metrics.reset()
    with torch.inference_mode():
        options = {**INDUCTOR, "fuse_max_weight": 1 << 16}
        out = torch.compile(model, backend="ember", options=options)(x)
        _assert_close(out, model(x))
    stats = ember_backend_module.counters
    assert stats["freezing"] == 6  # 2 Linear x 2 + LayerNorm x 2
    assert stats["linear_activation"] == 2  # both Linear layers touch the GELU
    assert metrics.generated_kernel_count >= 1
    assert counters["inductor"]["select_algorithm_autotune"] == 0  # no GEMM left to tune


def test_named_backend_fuses_activation_into_gemm_epilogue(monkeypatch):
    """Linear -> ReLU is offered the C++ GEMM template; when it wins the timing (forced
    here: timings are the machine's), the ReLU runs in the GEMM kernel's epilogue."""
    from torch._inductor.select_algorithm import AlgorithmSelectorCache, ExternKernelCaller

    timed = []

    def template_wins(cls, choices, autotune_args, is_collective=False):
        timed.append(sorted(type(c).__name__ for c in choices))
        return {c: 2.0 if isinstance(c, ExternKernelCaller) else 1.0 for c in choices}

    monkeypatch.setattr(AlgorithmSelectorCache, "benchmark_choices", classmethod(template_wins))
    model, x = _mlp(act=torch.nn.ReLU).eval(), _randn(64, 32)
    with torch.inference_mode():
        out = torch.compile(model, backend="ember", options={"template": True, "graphs": False})(x)
        _assert_close(out, model(x), rtol=1e-4, atol=1e-5)
    stats = ember_backend_module.counters
    assert stats["linear_activation"] == 1  # Linear -> ReLU; the second Linear has none
    assert len(timed) == 1 and len(timed[0]) == 2  # ATen vs the template, once
    assert counters["inductor"]["cpp_templated_kernel_counter"] == 1
    assert counters["inductor"]["cpp_epilogue_fusion_counter"] >= 1


def test_named_backend_matches_default_on_transformer_block():
    from tiny_models import gpt2_config

    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(gpt2_config(transformers)).eval().to(DEVICE)
    ids = torch.randint(0, model.config.vocab_size, (1, 8)).to(DEVICE)
    with torch.inference_mode():
        expected = model(ids).logits
        out = torch.compile(model, backend="ember", options=INDUCTOR)(ids).logits
    _assert_close(out, expected, rtol=1e-4, atol=1e-4)
    assert ember_backend_module.counters["freezing"] > 0


@pytest.mark.parametrize("rows", [1, 64])
def test_named_backend_runs_linears_on_packed_weights(rows, capfd):
    """Linears the passes leave alone are ATen GEMM calls that ember's runtime
    runs on packed weights (no Inductor template, no MKL)."""
    if rows == 1 and not PANEL_GEMM:
        pytest.skip("the skinny kernel needs AVX-512F or AVX2 + FMA")
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 64))
    model = model.eval().to(DEVICE)
    x = _randn(rows, 512)
    with torch.inference_mode():
        compiled = torch.compile(model, backend="ember")
        for _ in range(2):
            compiled(x)
        with torch.backends.ember.verbose(1):
            out = compiled(x)
        _assert_close(out, model(x), rtol=1e-4, atol=1e-4)
    log = capfd.readouterr().err
    library = torch.backends.ember.packed_weights_info()["library"]
    route = "skinny/f32-packed" if rows == 1 else f"{library}/packed"
    assert log.count(route) == 2, log
    assert counters["inductor"]["cpp_templated_kernel_counter"] == 0


def test_named_backend_trains_like_default():
    """With grad enabled nothing is frozen: the weights keep training."""
    eager, model = _mlp(), _mlp()
    compiled = torch.compile(model, backend="ember")
    x = _randn(8, 32)
    eager(x).sum().backward()
    compiled(x).sum().backward()
    for a, b in zip(eager.parameters(), model.parameters()):
        _assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-5)
    assert ember_backend_module.counters["freezing"] == 0


# --------------------------------------------------------------------------- default Inductor: ember's passes


def _frozen_inference(model, x, **compile_kwargs):
    with torch.inference_mode(), inductor_config.patch(freezing=True, fx_graph_cache=False):
        compiled = torch.compile(model, **compile_kwargs)
        compiled(x)
        with torch.profiler.profile() as prof:
            out = compiled(x)
    return out, {e.key: e.count for e in prof.key_averages()}


def test_default_inductor_runs_ember_passes_on_frozen_graphs(monkeypatch):
    """Default torch.compile on ember gets backend="ember"'s passes through the device's
    post-grad hook: a one-row MLP becomes generated C++ (no GEMM call at all); with
    the one-row fusion off (``fuse_max_weight=0``) it keeps its GEMM calls (ember's
    packed skinny kernel)."""
    from torch_ember.compile import passes

    model, x = _mlp().eval(), _randn(1, 32)
    out, ops = _frozen_inference(model, x)
    _assert_close(out, model(x))
    assert ember_backend_module.counters["linear_activation"] == 2
    assert not any(k in ops for k in ("aten::addmm", "aten::mm", "ember::gemm")), ops
    torch._dynamo.reset()
    unfused = passes.Options(fuse_max_weight=0)
    monkeypatch.setattr(passes, "Options", lambda: unfused)
    out, ops = _frozen_inference(model, x)
    _assert_close(out, model(x))
    assert ember_backend_module.counters["linear_activation"] == 2  # from the first compile
    assert ops.get("aten::addmm") == 2, ops


@pytest.mark.parametrize("backend", ["inductor", "ember"])
def test_frozen_gemms_return_their_result_without_a_copy(backend):
    """Many-row frozen linears are ember::gemm calls: oneDNN's packed matmul result is used
    as returned (Inductor's addmm(out=) paid a copy per GEMM)."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 48)).eval()
    model = model.to(DEVICE)
    x = _randn(40, 64)
    out, ops = _frozen_inference(model, x, **_compiled_by_inductor(backend))
    _assert_close(out, model(x), rtol=1e-4, atol=1e-5)
    assert ember_backend_module.counters["packed_gemm"] == 2
    assert ops.get("ember::gemm") == 2, ops
    assert "aten::copy_" not in ops, ops


@pytest.mark.parametrize("backend", ["inductor", "ember"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemm_on_a_passed_in_operand_returns_its_result_without_a_copy(backend, dtype, monkeypatch):
    """In an inference graph, a GEMM whose B is a graph input (the same tensor call
    after call: packed on its second use) is an ember::gemm call too; as mm(out=) it
    paid a copy of its result (2048^3: compiled 2.7-3% slower than eager). (The
    compiled code itself: so small a graph is otherwise captured on its third call.)"""
    from torch_ember.compile import inductor_graphs

    monkeypatch.setattr(inductor_graphs, "AUTO_REPLAY", False)
    a, b = _randn(40, 64).to(dtype), _randn(64, 48).to(dtype)
    with torch.inference_mode(), inductor_config.patch(fx_graph_cache=False):
        compiled = torch.compile(lambda x, y: torch.relu(x @ y), **_compiled_by_inductor(backend))
        for _ in range(2):
            compiled(a, b)
        with torch.profiler.profile() as prof:
            out = compiled(a, b)
    ops = {e.key: e.count for e in prof.key_averages()}
    tol = {"rtol": 2e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {"rtol": 1e-4, "atol": 1e-5}
    _assert_close(out, torch.relu(a @ b), **tol)
    assert ember_backend_module.counters["packed_gemm"] == 1
    assert ops.get("ember::gemm") == 1 and "aten::copy_" not in ops, ops


def test_training_through_graphs_with_passed_in_gemm_operands():
    """A training step's forward (grad enabled) keeps Inductor's GEMMs; its backward
    graph (compiled with grad disabled) may take ember::gemm for GEMMs on saved
    tensors: the gradients are mm's either way."""
    x, w = _randn(40, 64), _randn(64, 48).requires_grad_()
    compiled = torch.compile(lambda a, b: torch.relu(a @ b).sum())
    compiled(x, w).backward()
    expected = x.cpu().t() @ ((x.cpu() @ w.detach().cpu()) > 0).float()
    _assert_close(w.grad.cpu(), expected, rtol=1e-4, atol=1e-4)


def test_default_inductor_skips_ember_passes_under_cpu_parity():
    model, x = _mlp().eval(), _randn(1, 32)
    with torch.backends.ember.flags(cpu_parity=True):
        out, ops = _frozen_inference(model, x)
    _assert_close(out, model(x))
    assert sum(ember_backend_module.counters.values()) == 0
    assert "aten::addmm" in ops, ops


def test_ember_gemm_op_matches_addmm_on_every_device():
    a, b, bias = _randn(5, 7, device="cpu"), _randn(7, 3, device="cpu"), _randn(3, device="cpu")
    expected = torch.addmm(bias, a, b)
    for device in ("cpu", DEVICE, "meta"):
        got = torch.ops.ember.gemm(bias.to(device), a.to(device), b.to(device))
        assert got.shape == expected.shape and got.device.type == device
        if device != "meta":
            _assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-6)
    _assert_close(torch.ops.ember.gemm(None, a, b), a @ b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("act", ["relu", "gelu", "gelu_tanh"])
def test_ember_gemm_activation_equals_the_activation_op_bitwise(act):
    """The epilogue applies the activation ember's own op would (40 x 512 outputs:
    more than one parallel chunk of the vector kernels), in place."""
    a, b, bias = _randn(40, 64), _randn(64, 512), _randn(512)
    plain = torch.ops.ember.gemm(bias, a, b)
    if act == "relu":
        expected = torch.relu(plain)
    else:
        expected = torch.nn.functional.gelu(
            plain, approximate="tanh" if act == "gelu_tanh" else "none"
        )
    assert torch.equal(torch.ops.ember.gemm(bias, a, b, act), expected)


class _GeluNew(torch.nn.Module):
    """transformers' gelu_new, spelled out as GPT-2 spells it."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * (x + 0.044715 * torch.pow(x, 3.0))))


@pytest.mark.parametrize(
    "act",
    [torch.nn.ReLU(), torch.nn.GELU(), torch.nn.GELU("tanh"), _GeluNew()],
    ids=["relu", "gelu", "gelu-tanh", "gelu-new"],
)
def test_activation_after_frozen_gemm_runs_in_the_gemm_call(act, capfd):
    """Linear -> activation (as decomposed) is one packed-GEMM call: oneDNN's
    post-op, or (MKL's route) the activation applied in the same kernel."""
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), act, torch.nn.Linear(256, 32))
    model = model.eval().to(DEVICE)
    x = _randn(2, 40, 64)
    with torch.inference_mode(), inductor_config.patch(freezing=True, fx_graph_cache=False):
        compiled = torch.compile(model)
        compiled(x)
        with torch.backends.ember.verbose(1):
            out = compiled(x)
        _assert_close(out, model(x), rtol=1e-4, atol=1e-5)
    assert ember_backend_module.counters["gemm_epilogue"] == 1
    log = capfd.readouterr().err
    library = torch.backends.ember.packed_weights_info()["library"]
    assert log.count(f"{library}/packed+epilogue") == 1, log


def test_unknown_activation_after_frozen_gemm_stays_a_kernel():
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.SiLU()).eval().to(DEVICE)
    x = _randn(40, 64)
    out, _ = _frozen_inference(model, x)
    _assert_close(out, model(x), rtol=1e-4, atol=1e-5)
    assert ember_backend_module.counters["packed_gemm"] == 1
    assert ember_backend_module.counters["gemm_epilogue"] == 0


def test_ember_gemm_rejects_an_unknown_activation():
    a = _randn(20, 8)
    with pytest.raises(ValueError, match="unknown activation 'swish'"):
        torch.ops.ember.gemm(None, a, _randn(8, 4), "swish")


def test_dynamos_current_stream_lookup_answers_for_ember_as_torch_does():
    """Compiled code looks up the current stream at every call
    (torch_ember/compile/dynamo_builtins.py answers it in C++, without
    torch.accelerator's Python frames): the same stream as torch's function,
    on the default stream and inside a side stream's context, and torch's
    ValueError for a device that is not the accelerator."""
    import torch._dynamo.guards as dynamo_guards
    import torch._dynamo.utils as dynamo_utils

    lookup = dynamo_utils.get_current_stream
    assert lookup is torch_ember._C._current_stream_of
    assert dynamo_guards.get_current_stream is lookup
    device = torch.device(DEVICE, 0)
    side = torch.ember.Stream()
    for context in (torch.ember.stream(torch.ember.default_stream()), torch.ember.stream(side)):
        with context:
            assert lookup(device) == torch.accelerator.current_stream(device)
            assert lookup(torch.device(DEVICE)) == torch.accelerator.current_stream(device)
    assert lookup(device) == torch.ember.default_stream()
    with pytest.raises(ValueError, match="doesn't match the current accelerator"):
        lookup(torch.device("cpu"))

    compiled = torch.compile(lambda x: x * 2 + 1, backend="eager")
    x = torch.arange(8.0, device=DEVICE)
    with torch.ember.stream(side):
        out = compiled(x)
    side.synchronize()
    assert torch.equal(out.cpu(), torch.arange(8.0) * 2 + 1)


def test_dynamos_per_call_weakref_store_is_a_builtin_doing_what_torchs_does():
    """Compiled code stores weak references to its current stream at every
    call (store_user_object_weakrefs): ember's builtin fills torch's registry
    as torch's function does, replacing what was there, and raises
    TypeError for an object without weak references, leaving the registry
    empty as torch's does."""
    import weakref

    import torch._dynamo.graph_bytecode_inputs as graph_inputs

    from torch_ember.compile import dynamo_builtins

    assert dynamo_builtins.installed()
    store = graph_inputs.store_user_object_weakrefs
    assert not isinstance(store, type(test_ember_gemm_rejects_an_unknown_activation))
    registry = graph_inputs.index_to_external_object_weakref
    saved = dict(registry)
    try:
        stream, side = torch.ember.default_stream(), torch.ember.Stream()
        registry[5] = weakref.ref(side)
        store(stream, side)
        assert sorted(registry) == [0, 1]
        assert registry[0]() is stream and registry[1]() is side
        assert isinstance(registry[0], weakref.ReferenceType)
        with pytest.raises(TypeError, match="weak reference"):
            store(side, 3)
        assert registry == {}
        store()
        assert registry == {}
    finally:
        registry.clear()
        registry.update(saved)

    # A compiled function that uses its current stream reads it back there.
    def on_current_stream(x):
        s = torch.accelerator.current_stream()
        s.synchronize()
        return x + 1

    compiled = torch.compile(on_current_stream, backend="eager")
    x = torch.arange(4.0, device=DEVICE)
    with torch.ember.stream(side):
        out = compiled(x)
    assert torch.equal(out.cpu(), torch.arange(4.0) + 1)


def test_dynamos_pregraph_profiler_range_is_recorded_only_while_profiling():
    """The builtins bracketing a compiled frame's pre-graph bytecode
    (record_pregraph_bytecode_enter/exit) record torch's "Pregraph bytecode"
    range under the profiler, and do nothing (no context object) otherwise."""
    import torch._dynamo.utils as dynamo_utils

    enter, leave = (
        dynamo_utils.record_pregraph_bytecode_enter,
        dynamo_utils.record_pregraph_bytecode_exit,
    )
    assert enter() is None
    leave(None)
    compiled = torch.compile(lambda x: x * 3, backend="eager")
    x = torch.ones(4, device=DEVICE)
    compiled(x)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        assert compiled(x).sum().item() == 12
    names = [e.name for e in prof.events()]
    assert names.count("Pregraph bytecode") == 1
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        cm = enter()
        assert cm is not None
        leave(cm)
