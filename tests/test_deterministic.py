"""Deterministic mode: bitwise identical results across runs and thread counts.

The mode is ``torch.backends.ember.deterministic`` (set here through
``torch_ember._C.flags.set_deterministic``) or
``torch.use_deterministic_algorithms(True)``; every test of a result runs
under both switches. Each computation runs at 1, 2, 3 and 4 threads and
once more at 2, and all five results must have the same bytes; it must also
match a float64 reference to rounding. With the mode off, ember is the CPU
delegation, bitwise equal to CPU. Ops that cannot be made deterministic
raise (or warn) the way CUDA's do. docs/determinism.md lists which ops are
ATen's own thread-count-independent kernels and which are ember's.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import torch_ember
from torch_ember import _C

DEVICE = "ember"
THREADS = (1, 2, 3, 4, 2)


@pytest.fixture(autouse=True)
def _restore_switches():
    threads = torch.get_num_threads()
    ember_flag = _C.flags.deterministic()
    torch_flag = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    yield
    _C.flags.set_deterministic(ember_flag)
    torch.use_deterministic_algorithms(torch_flag, warn_only=warn_only)
    torch.set_num_threads(threads)


@pytest.fixture(params=["ember", "torch"])
def deterministic(request):
    """Turns the mode on through ember's switch or torch's."""
    if request.param == "ember":
        _C.flags.set_deterministic(True)
    else:
        torch.use_deterministic_algorithms(True)
    assert _C.flags.effective_deterministic()
    return request.param


def _rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def _ids(n, high, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, high, (n,), generator=g)


def _flat(result) -> list[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        return [result]
    return [t for t in result if t is not None]


def _raw(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def _same_bits(a, b) -> bool:
    return all(torch.equal(_raw(x), _raw(y)) for x, y in zip(_flat(a), _flat(b), strict=True))


def _with_grads(fn: Callable, wrt: tuple[int, ...]) -> Callable:
    """fn's outputs followed by the gradients of its inputs `wrt`."""

    def run(*inputs):
        leaves = [
            t.detach().requires_grad_(i in wrt) if t.is_floating_point() else t
            for i, t in enumerate(inputs)
        ]
        out = fn(*leaves)
        g = torch.Generator().manual_seed(7)
        seed = torch.randn(out.shape, generator=g, dtype=torch.float64).to(out.dtype)
        grads = torch.autograd.grad(out, [leaves[i] for i in wrt], seed.to(out.device))
        return (out, *grads)

    return run


def _run_everywhere(fn: Callable, inputs: tuple) -> list:
    ember_inputs = tuple(t.to(DEVICE) for t in inputs)
    results = []
    for threads in THREADS:
        torch.set_num_threads(threads)
        results.append([t.cpu() for t in _flat(fn(*ember_inputs))])
    return results


def _check(fn: Callable, inputs: tuple, rtol: float, atol: float):
    results = _run_everywhere(fn, inputs)
    for threads, other in zip(THREADS[1:], results[1:], strict=True):
        assert _same_bits(results[0], other), f"1 thread vs {threads} threads differ"
    reference = _flat(fn(*(t.double() if t.is_floating_point() else t for t in inputs)))
    for got, want in zip(results[0], reference, strict=True):
        torch.testing.assert_close(got.double(), want.double(), rtol=rtol, atol=atol)


# (name, fn, inputs builder) for one dtype. Sizes are big enough that ATen
# splits them between threads (>= 32768 elements in the reduction).
def _cases(dtype):
    big = lambda *s, seed=0: _rand(*s, dtype=dtype, seed=seed)
    grad0 = lambda f: _with_grads(f, (0,))
    return {
        "sum_all": (lambda x: x.sum(), lambda: (big(300_007),)),
        "sum_long_dim": (lambda x: x.sum(1), lambda: (big(4, 300_001),)),
        "sum_dim0": (lambda x: x.sum(0), lambda: (big(100_001, 3),)),
        "sum_dims_keepdim": (
            lambda x: x.sum((0, 2), keepdim=True),
            lambda: (big(3, 7, 50_001),),
        ),
        "sum_backward": (grad0(lambda x: x.sum(0)), lambda: (big(300_001, 4),)),
        "mean_all": (lambda x: x.mean(), lambda: (big(300_007),)),
        "mean_dim": (grad0(lambda x: x.mean(-1)), lambda: (big(3, 400_001),)),
        "var_all": (lambda x: x.var(), lambda: (big(300_007),)),
        "var_dim_backward": (grad0(lambda x: x.var(0)), lambda: (big(200_001, 3),)),
        "std_correction0": (lambda x: x.std(-1, correction=0), lambda: (big(2, 500_001),)),
        "var_mean": (lambda x: torch.var_mean(x, 0), lambda: (big(400_001, 2),)),
        "std_mean": (lambda x: torch.std_mean(x), lambda: (big(300_001),)),
        "norm2_all": (grad0(lambda x: x.norm()), lambda: (big(300_007),)),
        "norm1_dim": (lambda x: torch.linalg.vector_norm(x, 1, dim=-1), lambda: (big(2, 500_001),)),
        "norm3_dim0": (grad0(lambda x: x.norm(3, dim=0)), lambda: (big(300_001, 3),)),
        "norm_inf": (
            lambda x: torch.linalg.vector_norm(x, float("inf")),
            lambda: (big(300_007),),
        ),
        "softmax_last": (grad0(lambda x: x.softmax(-1)), lambda: (big(64, 40_000),)),
        "log_softmax_last": (grad0(lambda x: x.log_softmax(-1)), lambda: (big(64, 40_000),)),
        "log_softmax_dim0": (grad0(lambda x: x.log_softmax(0)), lambda: (big(512, 2048),)),
        "layer_norm": (
            _with_grads(lambda x, w, b: F.layer_norm(x, (512,), w, b), (0, 1, 2)),
            lambda: (big(4096, 512), big(512, seed=1), big(512, seed=2)),
        ),
        "layer_norm_long_rows": (
            _with_grads(lambda x, w, b: F.layer_norm(x, (100_000,), w, b), (0, 1, 2)),
            lambda: (big(4, 100_000), big(100_000, seed=1), big(100_000, seed=2)),
        ),
        "group_norm": (
            _with_grads(lambda x, w, b: F.group_norm(x, 4, w, b), (0, 1, 2)),
            lambda: (big(32, 16, 32, 32), big(16, seed=1), big(16, seed=2)),
        ),
        "group_norm_channels_last": (
            _with_grads(
                lambda x, w, b: F.group_norm(
                    x.contiguous(memory_format=torch.channels_last), 4, w, b
                ),
                (0, 1, 2),
            ),
            lambda: (big(32, 16, 32, 32), big(16, seed=1), big(16, seed=2)),
        ),
        "group_norm_3d": (
            _with_grads(lambda x, w, b: F.group_norm(x, 4, w, b), (0, 1, 2)),
            lambda: (big(4096, 16, 8), big(16, seed=1), big(16, seed=2)),
        ),
        "cumsum": (grad0(lambda x: x.cumsum(0)), lambda: (big(1000, 1000),)),
        "index_add": (
            _with_grads(
                lambda base, src, i: base.index_add(0, i, src),
                (0, 1),
            ),
            lambda: (big(100, 8), big(100_000, 8, seed=1), _ids(100_000, 100)),
        ),
        "scatter_add": (
            _with_grads(lambda base, src, i: base.scatter_add(0, i, src), (0, 1)),
            lambda: (big(100), big(300_000, seed=1), _ids(300_000, 100)),
        ),
        "index_put_accumulate": (
            _with_grads(
                lambda base, src, i: base.index_put((i,), src, accumulate=True),
                (0, 1),
            ),
            lambda: (big(100), big(300_000, seed=1), _ids(300_000, 100)),
        ),
        "embedding_bag_sum": (
            _with_grads(lambda w, i, o: F.embedding_bag(i, w, o, mode="sum"), (0,)),
            lambda: (big(1000, 64), _ids(100_000, 1000), torch.arange(0, 100_000, 25)),
        ),
        "embedding_bag_mean": (
            _with_grads(lambda w, i, o: F.embedding_bag(i, w, o, mode="mean"), (0,)),
            lambda: (big(1000, 64), _ids(100_000, 1000), torch.arange(0, 100_000, 25)),
        ),
        "embedding_bag_max": (
            _with_grads(lambda w, i, o: F.embedding_bag(i, w, o, mode="max"), (0,)),
            lambda: (big(1000, 64), _ids(100_000, 1000), torch.arange(0, 100_000, 25)),
        ),
        "embedding_bag_weighted": (
            _with_grads(
                lambda w, p, i, o: F.embedding_bag(i, w, o, mode="sum", per_sample_weights=p),
                (0, 1),
            ),
            lambda: (
                big(1000, 64),
                big(100_000, seed=3),
                _ids(100_000, 1000),
                torch.arange(0, 100_000, 25),
            ),
        ),
        "mse_loss": (
            _with_grads(lambda a, b: F.mse_loss(a, b), (0,)),
            lambda: (big(300_007), big(300_007, seed=1)),
        ),
        "huber_loss": (
            _with_grads(lambda a, b: F.huber_loss(a, b), (0,)),
            lambda: (big(300_007), big(300_007, seed=1)),
        ),
        "smooth_l1_loss_sum": (
            lambda a, b: F.smooth_l1_loss(a, b, reduction="sum"),
            lambda: (big(300_007), big(300_007, seed=1)),
        ),
        "binary_cross_entropy": (
            _with_grads(lambda a, b: F.binary_cross_entropy(a.sigmoid(), b.sigmoid()), (0,)),
            lambda: (big(300_007), big(300_007, seed=1)),
        ),
        "sum_out": (
            lambda x: torch.sum(x, 0, out=torch.empty(0, dtype=x.dtype, device=x.device)),
            lambda: (big(500_001, 3),),
        ),
        "mean_out": (
            lambda x: torch.mean(x, 1, out=torch.empty(0, dtype=x.dtype, device=x.device)),
            lambda: (big(2, 500_001),),
        ),
        "vector_norm_out": (
            lambda x: torch.linalg.vector_norm(
                x, 1, out=torch.empty((), dtype=x.dtype, device=x.device)
            ),
            lambda: (big(300_007),),
        ),
        "nansum": (
            lambda x: x.masked_fill(x > 2, float("nan")).nansum(),
            lambda: (big(300_007),),
        ),
        "norm_scalaropt_dim": (
            lambda x: torch.ops.aten.norm.ScalarOpt_dim(x, 3, [0]),
            lambda: (big(300_007),),
        ),
        "logsumexp": (grad0(lambda x: x.logsumexp(0)), lambda: (big(300_007),)),
        # Elementwise ops whose vector and scalar loops round differently.
        "sigmoid": (grad0(torch.sigmoid), lambda: (big(300_007),)),
        "silu": (grad0(F.silu), lambda: (big(300_007),)),
        "silu_inplace": (lambda x: F.silu(x.clone(), inplace=True), lambda: (big(300_007),)),
        "softplus": (grad0(F.softplus), lambda: (big(300_007),)),
        "elu": (grad0(F.elu), lambda: (big(300_007),)),
        "mish": (grad0(F.mish), lambda: (big(300_007),)),
        "pow_scalar": (grad0(lambda x: x.abs() ** 1.3), lambda: (big(300_007),)),
        "atan2": (
            _with_grads(torch.atan2, (0, 1)),
            lambda: (big(300_007), big(300_007, seed=1)),
        ),
    }


FLOAT32 = _cases(torch.float32)
# float64 and bfloat16 on a subset (the same kernels, other accumulators).
FLOAT64 = [
    "sum_all",
    "var_all",
    "norm3_dim0",
    "layer_norm",
    "group_norm",
    "index_put_accumulate",
    "silu",
]
BFLOAT16 = [
    "sum_long_dim",
    "mean_all",
    "std_mean",
    "layer_norm",
    "group_norm_channels_last",
    "sigmoid",
]

TOLERANCE = {
    torch.float32: {"rtol": 1e-4, "atol": 1e-4},
    torch.float64: {"rtol": 1e-9, "atol": 1e-9},
    torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2},
}


def _float32_tolerance(name: str) -> dict:
    # Gradients of normalisations and losses sum many terms: compare with
    # the float64 reference to a tolerance scaled to the sum's length.
    long_sums = ("layer_norm", "group_norm", "mse", "index", "scatter", "embedding")
    if name.startswith((*long_sums, "huber", "smooth", "binary")):
        return {"rtol": 1e-3, "atol": 1e-2}
    return TOLERANCE[torch.float32]


@pytest.mark.parametrize("name", sorted(FLOAT32))
def test_float32_bitwise_across_threads(name):
    _C.flags.set_deterministic(True)
    fn, make = FLOAT32[name]
    _check(fn, make(), **_float32_tolerance(name))


# torch.use_deterministic_algorithms(True) turns on the same kernels.
TORCH_SWITCH = [
    "sum_all",
    "var_mean",
    "norm3_dim0",
    "layer_norm",
    "group_norm_channels_last",
    "index_put_accumulate",
    "binary_cross_entropy",
    "silu",
]


@pytest.mark.parametrize("name", TORCH_SWITCH)
def test_torch_switch_bitwise_across_threads(name):
    torch.use_deterministic_algorithms(True)
    assert not _C.flags.deterministic()
    fn, make = FLOAT32[name]
    _check(fn, make(), **_float32_tolerance(name))


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16], ids=str)
def test_other_dtypes_bitwise_across_threads(deterministic, dtype):
    names = FLOAT64 if dtype == torch.float64 else BFLOAT16
    cases = _cases(dtype)
    for name in names:
        fn, make = cases[name]
        tol = TOLERANCE[dtype]
        if dtype == torch.bfloat16 and name.startswith(("layer_norm", "group_norm")):
            tol = {"rtol": 5e-2, "atol": 1.0}  # weight grads: sums of 4096 bf16 products
        _check(fn, make(), **tol)


def _profiled_names(fn: Callable) -> set[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return {event.name for event in prof.events()}


def _routed(kernel: str, fn: Callable) -> bool:
    """Whether ``fn`` on ember reaches ember's deterministic ``kernel``.

    _softmax and gelu are registered in ops/kernels/HotOps.cpp, pointing at
    kernels::deterministic::softmax and ::gelu. A registration that stops
    reaching them fails the tests below (it used to skip them, so a lost
    route passed unnoticed).
    """
    previous = _C.flags.deterministic()
    _C.flags.set_deterministic(True)
    try:
        return f"ember::deterministic::{kernel}" in _profiled_names(fn)
    finally:
        _C.flags.set_deterministic(previous)


HOT_OPS_NOT_ROUTED = "HotOps.cpp no longer routes {} to ember's deterministic kernel"


@pytest.mark.parametrize("dim", [0, 1])
def test_softmax_over_non_last_dim(dim):
    x = torch.randn(4, 4, device=DEVICE)
    assert _routed("_softmax", lambda: x.softmax(0)), HOT_OPS_NOT_ROUTED.format("_softmax")
    _C.flags.set_deterministic(True)
    fn = _with_grads(lambda x: x.softmax(dim), (0,))
    _check(fn, (_rand(512, 2048, 3) if dim == 1 else _rand(512, 2048),), rtol=1e-4, atol=1e-5)


def test_gelu_tanh():
    x = torch.randn(4, 4, device=DEVICE)
    assert _routed("gelu", lambda: F.gelu(x, approximate="tanh")), HOT_OPS_NOT_ROUTED.format("gelu")
    _C.flags.set_deterministic(True)
    fn = _with_grads(lambda x: F.gelu(x, approximate="tanh"), (0,))
    _check(fn, (_rand(300_007),), rtol=1e-4, atol=1e-5)


def test_softmax_backward_over_non_last_dim_is_ember_kernel():
    _C.flags.set_deterministic(True)
    # The backward kernel is ember's even while _softmax is not routed: the
    # same gradient at every thread count for a fixed forward output.
    out = torch.softmax(_rand(512, 2048), 0).to(DEVICE)
    grad = _rand(512, 2048, seed=4).to(DEVICE)
    results = []
    for threads in THREADS:
        torch.set_num_threads(threads)
        results.append(torch.ops.aten._softmax_backward_data(grad, out, 0, torch.float32).cpu())
    assert all(_same_bits(results[0], r) for r in results[1:])
    want = torch.ops.aten._softmax_backward_data(
        grad.cpu().double(), out.cpu().double(), 0, torch.float64
    )
    torch.testing.assert_close(results[0].double(), want, rtol=1e-4, atol=1e-6)


def test_deterministic_kernels_show_in_profiler():
    x = torch.randn(100_000, device=DEVICE)
    _C.flags.set_deterministic(True)
    names = _profiled_names(lambda: (x.sum(), x.var(), x.norm(), x.sigmoid(), x.sigmoid_()))
    assert {"ember::deterministic::sum", "ember::deterministic::var"} <= names
    assert "ember::deterministic::linalg_vector_norm" in names
    assert "ember::deterministic::elementwise" in names  # sigmoid: fixed chunks
    assert "ember::deterministic::serial" in names  # sigmoid_: serially
    _C.flags.set_deterministic(False)
    assert not any(n.startswith("ember::deterministic") for n in _profiled_names(lambda: x.sum()))


def test_mode_has_an_effect():
    """Without the mode, ember's sum is ATen's: its bits follow the thread count.

    Run at the call (the synchronous engine), where an op takes the calling
    thread's count; launched work takes at most its device's cores, which
    on a small machine split into two devices is one thread whatever
    torch.set_num_threads says."""
    x = _rand(1_000_003).to(DEVICE)
    _C.flags.set_deterministic(False)
    bits = set()
    with torch.backends.ember.flags(async_execution=False):
        for threads in (1, 2, 3, 4):
            torch.set_num_threads(threads)
            bits.add(x.sum().cpu().item())
    assert len(bits) > 1  # ATen splits the sum per thread
    _C.flags.set_deterministic(True)
    bits = set()
    for threads in (1, 2, 3, 4):
        torch.set_num_threads(threads)
        bits.add(x.sum().cpu().item())
    assert len(bits) == 1


OFF_PATH = {
    "sum": lambda x: x.sum(),
    "sum_dim": lambda x: x.sum(0, dtype=torch.float64),
    "mean": lambda x: x.mean(1),
    "var": lambda x: x.var(0, correction=0),
    "std_mean": lambda x: torch.std_mean(x, 1),
    "norm": lambda x: torch.linalg.vector_norm(x, 3, dim=0),
    "mse_loss": lambda x: F.mse_loss(x, x.flip(0)),
    "softmax0": lambda x: x.softmax(0),
    "sigmoid_bwd": _with_grads(torch.sigmoid, (0,)),
    "pow": lambda x: x.abs() ** 1.3,
    "layer_norm_bwd": _with_grads(lambda x: F.layer_norm(x, (x.shape[-1],)), (0,)),
    # (Channels-last group_norm backward is left out: ember's delegation
    # differs from CPU by an ulp there with or without this mode.)
    "group_norm": _with_grads(lambda x: F.group_norm(x.reshape(64, 8, 16, -1), 4), (0,)),
    "group_norm_cl_forward": lambda x: F.group_norm(
        x.reshape(64, 8, 16, -1).contiguous(memory_format=torch.channels_last), 4
    ),
    "index_put": lambda x: torch.zeros(10, dtype=x.dtype, device=x.device).index_put_(
        (torch.arange(x.shape[0], device=x.device) % 10,), x[:, 0], accumulate=True
    ),
}


@pytest.mark.parametrize("name", sorted(OFF_PATH))
def test_mode_off_is_bitwise_cpu(name):
    _C.flags.set_deterministic(False)
    torch.set_num_threads(2)
    fn = OFF_PATH[name]
    x = _rand(2048, 256)
    assert _same_bits(fn(x), fn(x.to(DEVICE)))


# --- ops without a deterministic implementation -----------------------------


def _put_overwrite():
    x = torch.zeros(10, device=DEVICE)
    x.put_(torch.tensor([1, 1, 2], device=DEVICE), torch.ones(3, device=DEVICE), accumulate=False)
    return x


def test_put_without_accumulate_raises_under_torch_switch():
    torch.use_deterministic_algorithms(True)
    with pytest.raises(RuntimeError, match=r"put_ does not have a deterministic implementation"):
        _put_overwrite()


def test_put_without_accumulate_warns_with_warn_only():
    torch.use_deterministic_algorithms(True, warn_only=True)
    with pytest.warns(UserWarning, match=r"put_ does not have a deterministic implementation"):
        x = _put_overwrite()
    assert x[1].item() == 1.0


def test_put_without_accumulate_raises_under_ember_switch():
    _C.flags.set_deterministic(True)
    with pytest.raises(
        RuntimeError, match=r"put_ does not have a deterministic implementation on ember"
    ):
        _put_overwrite()
    # accumulate=True has one: serial accumulation.
    x = torch.zeros(10, device=DEVICE)
    x.put_(torch.tensor([1, 1], device=DEVICE), torch.ones(2, device=DEVICE), accumulate=True)
    assert x[1].item() == 2.0


def test_fft_raises_under_deterministic_mode(deterministic):
    x = torch.randn(1024, device=DEVICE)
    with pytest.raises(
        RuntimeError, match=r"_fft_r2c does not have a deterministic implementation"
    ):
        torch.fft.rfft(x)


def test_fft_warns_with_warn_only():
    torch.use_deterministic_algorithms(True, warn_only=True)
    x = torch.randn(1024)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = torch.fft.rfft(x.to(DEVICE))
    assert any("_fft_r2c" in str(w.message) for w in caught)
    torch.testing.assert_close(got.cpu(), torch.fft.rfft(x))


def test_integer_sum_is_exact_either_way(deterministic):
    x = torch.randint(-1000, 1000, (1_000_003,))
    assert x.to(DEVICE).sum().item() == x.sum().item()


def test_empty_and_scalar_reductions(deterministic):
    for x in (torch.zeros(0, 3), torch.tensor(2.5), torch.zeros(3, 0)):
        e = x.to(DEVICE)
        torch.testing.assert_close(e.sum(0 if x.dim() else ()).cpu(), x.sum(0 if x.dim() else ()))
        torch.testing.assert_close(e.mean().cpu(), x.mean(), equal_nan=True)
    assert torch_ember is not None


# Kernels whose oneDNN / MKL calls split their sums by thread: under the mode
# they run with every library on one thread (csrc/ops/kernels/SerialScope.h).
_SPD_BASE = _rand(120, 120, seed=11)
_SPD = _SPD_BASE @ _SPD_BASE.t() + 120 * torch.eye(120)
SINGLE_THREADED = {
    "conv2d_backward": (
        lambda x, w: torch.autograd.grad(F.conv2d(x, w, padding=1).square().sum(), (x, w)),
        (
            _rand(16, 32, 20, 20, seed=12).requires_grad_(),
            _rand(48, 32, 3, 3, seed=13).requires_grad_(),
        ),
    ),
    # Values only for the correctness check: clustered eigenvalues leave the
    # vectors ill-conditioned (their bits are still compared across threads
    # through the reconstruction).
    "eigh": (lambda a: torch.linalg.eigh(a)[0], (_SPD,)),
    "svd": (lambda a: torch.linalg.svd(a)[1], (_SPD_BASE,)),
    "inv": (torch.linalg.inv, (_SPD,)),
    "cholesky": (torch.linalg.cholesky, (_SPD,)),
    "qr": (lambda a: torch.linalg.qr(a), (_SPD_BASE,)),
    "solve": (torch.linalg.solve, (_SPD, _SPD_BASE)),
}


@pytest.mark.parametrize("name", sorted(SINGLE_THREADED))
def test_library_kernels_bitwise_across_threads(deterministic, name):
    fn, inputs = SINGLE_THREADED[name]
    results = []
    for threads in THREADS:
        torch.set_num_threads(threads)
        args = [t.detach().to(DEVICE).requires_grad_(t.requires_grad) for t in inputs]
        results.append([r.detach().cpu() for r in _flat(fn(*args))])
    for result in results[1:]:
        assert all(_same_bits(a, b) for a, b in zip(result, results[0], strict=True))
    # Correct, not just repeatable: the mode-off CPU result to rounding.
    expected = _flat(fn(*[t.detach().requires_grad_(t.requires_grad) for t in inputs]))
    for got, want in zip(results[0], expected, strict=True):
        want = want.detach()
        assert (got - want).abs().max() <= 1e-4 * want.abs().max()
