"""Which kernels the asynchronous engine launches (issue 11, item 1): GEMMs
of every route, convolutions (channel GEMM, oneDNN on a packed weight),
inference batch norm, max pooling, reductions and arange return before
their work has run, are counted once, and equal synchronous execution
(values, layout, dtype); their argument errors are raised at the call.
The engine's semantics (ordering, host reads, errors, memory) are in
test_async_execution.py."""

import time

import pytest
import torch
import torch.nn.functional as F
from async_helpers import launched_count, returned_before_the_sleep_ended, sleep_on_stream
from isa import VECTOR_KERNELS

import torch_ember

# Launch counts must not depend on whether a worker fell asleep (conftest).
pytestmark = pytest.mark.usefixtures("queued_launches", "async_on")

# The launched unit of an fp32 GEMM of more than 16 rows on a packed weight:
# MKL's packed GEMM on Intel CPUs, oneDNN's elsewhere.
PACKED_GEMM_UNIT = f"aten::addmm ({torch.backends.ember.packed_weights_info()['library']})"


def _fresh(t):
    """A new tensor with t's values: never seen before, so never packed."""
    return t * 1


# GEMMs of more than 16 rows (MKL or oneDNN, on a packed weight or not) and
# convolutions (ember's channel GEMM, oneDNN on a packed weight): launched
# into a result allocated at the call. name -> (fn(x, w, b), launched unit).
_GEMM_AND_CONV_CASES = {
    "linear_packed": (lambda x, w, b: F.linear(x, w, b), PACKED_GEMM_UNIT),
    "linear_packed_no_bias": (lambda x, w, b: F.linear(x, w), PACKED_GEMM_UNIT),
    "linear_packed_out": (
        lambda x, w, b: torch.addmm(b, x, w.t(), out=torch.empty(40, 32, device=x.device)),
        PACKED_GEMM_UNIT,
    ),
    "linear_skinny_out": (
        lambda x, w, b: torch.mm(x[:3], w.t(), out=torch.empty(3, 32, device=x.device)),
        "aten::addmm (skinny)",
    ),
    "mm": (lambda x, w, b: x @ _fresh(w).t(), "aten::mm"),
    "addmm_broadcast_self": (lambda x, w, b: torch.addmm(b, x, _fresh(w).t()), "aten::addmm"),
    "addmm_beta_alpha": (
        lambda x, w, b: torch.addmm(b, x, _fresh(w).t(), beta=0.5, alpha=2.0),
        "aten::addmm",
    ),
    "mm_out": (
        lambda x, w, b: torch.mm(x, _fresh(w).t(), out=torch.empty(0, device=x.device)),
        "aten::mm.out",
    ),
    "bmm": (
        lambda x, w, b: torch.bmm(x.view(4, 10, 24), _fresh(w).t().expand(4, 24, 32)),
        "aten::bmm",
    ),
    "baddbmm": (
        lambda x, w, b: torch.baddbmm(b, x.view(4, 10, 24), _fresh(w).t().expand(4, 24, 32)),
        "aten::baddbmm",
    ),
    # convolutions: x [1, 24, 9, 8], w [32, 24, k, k] (k = 1 for conv_1x1, else 3)
    "conv_1x1": (lambda x, w, b: F.conv2d(x, w, b), "aten::convolution (channel-gemm)"),
    "conv_3x3": (lambda x, w, b: F.conv2d(x, w, b, padding=1), "aten::convolution (onednn)"),
    "conv_1x1_strided": (  # 9 x 8 pixels gathered (x [1, 24, 18, 16]), channel GEMM
        lambda x, w, b: F.conv2d(x, w[:, :, :1, :1].contiguous(), b, stride=2),
        "aten::convolution (channel-gemm)",
    ),
    "conv_3x3_small_output": (  # 7 x 6 pixels: oneDNN's pack
        lambda x, w, b: F.conv2d(x, w, b, padding=1, dilation=2),
        "aten::convolution (onednn)",
    ),
    "conv_3x3_stride_2": (
        lambda x, w, b: F.conv2d(x, w, None, stride=2),
        "aten::convolution (onednn)",
    ),
    "conv_channels_last": (
        lambda x, w, b: F.conv2d(x.contiguous(memory_format=torch.channels_last), w, b, padding=1),
        "aten::convolution (onednn)",
    ),
}


@pytest.mark.parametrize("name", list(_GEMM_AND_CONV_CASES))
def test_gemms_and_convolutions_are_launched_and_equal_synchronous_execution(name):
    fn, unit = _GEMM_AND_CONV_CASES[name]
    torch.manual_seed(0)
    x = torch.randn(40, 24).to("ember")
    w = torch.randn(32, 24).to("ember")
    b = torch.randn(32).to("ember")
    if name.startswith("conv"):
        k = 1 if name == "conv_1x1" else 3
        # (the strided 1x1 on a larger image: outputs under 64 pixels stay on
        # oneDNN on AVX2 CPUs, Convolution.cpp)
        size = (18, 16) if name == "conv_1x1_strided" else (9, 8)
        x = torch.randn(1, 24, *size).to("ember")
        w = torch.randn(32, 24, k, k).to("ember")
    fn(x, w, b)  # packs weights on first sight
    fn(x, w, b)
    torch.ember.synchronize()
    torch_ember.reset_launch_stats()
    sleep_on_stream()
    begin = time.monotonic()
    launched = fn(x, w, b)
    assert returned_before_the_sleep_ended(begin)  # returned before its work ran
    # A 1x1 convolution is held for an epilogue (ConvEpilogue.h) until the
    # stream is next used: query() submits it, behind the sleep.
    torch.ember.current_stream().query()
    assert launched_count(unit) == 1, torch_ember.launch_stats()
    torch.backends.ember.async_execution = False
    synchronous = fn(x, w, b)
    torch.backends.ember.async_execution = True
    assert launched.shape == synchronous.shape
    assert launched.stride() == synchronous.stride()
    assert torch.equal(launched.cpu(), synchronous.cpu())


def _assert_launched_like_synchronous(fn, unit):
    """fn() returns before the work queued ahead of it ran, is counted once
    under `unit`, and equals its synchronous run (values, layout, dtype)."""
    torch_ember.reset_launch_stats()
    sleep_on_stream()
    begin = time.monotonic()
    launched = fn()
    assert returned_before_the_sleep_ended(begin)  # returned before its work ran
    assert launched_count(unit) == 1, torch_ember.launch_stats()
    torch.backends.ember.async_execution = False
    synchronous = fn()
    torch.backends.ember.async_execution = True
    pairs = (
        zip(launched, synchronous, strict=True)
        if isinstance(launched, tuple)
        else [(launched, synchronous)]
    )
    for a, b in pairs:
        assert a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype
        assert torch.equal(a.cpu(), b.cpu())


@pytest.mark.parametrize(
    "name, unit",
    [
        ("batch_norm", "aten::native_batch_norm"),
        ("batch_norm_channels_last", "aten::native_batch_norm"),
        ("max_pool", "aten::max_pool2d_with_indices"),
        ("max_pool_with_indices", "aten::max_pool2d_with_indices"),
    ],
)
@pytest.mark.skipif(
    not VECTOR_KERNELS, reason="ember's batch-norm and pooling kernels need AVX-512F or AVX2"
)
def test_inference_batch_norm_and_max_pool_are_launched(name, unit):
    torch.manual_seed(0)
    x = torch.randn(2, 6, 9, 11).to("ember")
    if name.endswith("channels_last"):
        x = x.contiguous(memory_format=torch.channels_last)
    mean, var = torch.randn(6).to("ember"), torch.rand(6).add(0.5).to("ember")
    weight, bias = torch.randn(6).to("ember"), torch.randn(6).to("ember")

    def fn():
        if name.startswith("batch_norm"):
            return F.batch_norm(x, mean, var, weight, bias, training=False)
        out = F.max_pool2d(x, 3, 2, 1, return_indices=name.endswith("indices"))
        return out if isinstance(out, tuple) else (out,)

    _assert_launched_like_synchronous(fn, unit)


@pytest.mark.parametrize(
    "name, unit",
    [
        ("mean_dim", "aten::mean.dim"),
        ("mean_keepdim_dtype", "aten::mean.dim"),
        ("sum_dim", "aten::sum.dim_IntList"),
        ("sum_all_int", "aten::sum.dim_IntList"),
        ("arange", "aten::arange.start_out"),
        ("arange_float_step", "aten::arange.start_out"),
    ],
)
def test_reductions_and_arange_are_launched(name, unit):
    """The last waits of ResNet-50 (its global average pool: mean.dim) and
    of a transformers decode step (cache_position: arange) are launched."""
    torch.manual_seed(0)
    x = torch.randn(2, 64, 7, 5).to("ember")
    ints = torch.randint(-9, 9, (33, 7)).to("ember")
    fn = {
        "mean_dim": lambda: x.mean((-2, -1)),
        "mean_keepdim_dtype": lambda: x.mean(1, keepdim=True, dtype=torch.float64),
        "sum_dim": lambda: x.sum(0),
        "sum_all_int": lambda: ints.sum(),
        "arange": lambda: torch.arange(130, 131, device="ember"),
        "arange_float_step": lambda: torch.arange(-1.5, 7.0, 0.25, device="ember"),
    }[name]
    _assert_launched_like_synchronous(fn, unit)


def test_arange_errors_are_raised_at_the_call_and_out_is_resized():
    sleep_on_stream(0.05)
    with pytest.raises(RuntimeError, match="step must be nonzero"):
        torch.arange(0, 5, 0, device="ember")
    with pytest.raises(RuntimeError, match="upper bound and lower bound inconsistent"):
        torch.arange(0, 5, -1, device="ember")
    out = torch.full((2, 3), 7, dtype=torch.int64, device="ember")
    torch.arange(4, 9, out=out)
    assert out.shape == (5,) and out.cpu().tolist() == [4, 5, 6, 7, 8]
    # A long range is computed where it lands (the synchronous delegation).
    long = torch.arange(0, 1 << 17, device="ember")
    assert torch.equal(long.cpu(), torch.arange(0, 1 << 17))


def test_gemm_argument_errors_are_raised_at_the_call():
    x = torch.randn(20, 8, device="ember")
    y = torch.randn(8, 6, device="ember")
    sleep_on_stream(0.05)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        x @ torch.randn(7, 6, device="ember")
    with pytest.raises(RuntimeError):  # self not broadcastable to 20x6
        torch.addmm(torch.randn(5, device="ember"), x, y)
    with pytest.raises(RuntimeError, match="same dtype|to have dtype"):
        torch.mm(x, y, out=torch.empty(20, 6, dtype=torch.float64, device="ember"))
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        x @ y.cpu()
    torch.testing.assert_close((x @ y).cpu(), x.cpu() @ y.cpu())  # nothing left broken


# name -> whether the op's domain is the non-negative numbers
_UNARY_MATH = {
    "exp": False,
    "expm1": False,
    "log": True,
    "log1p": True,
    "sqrt": True,
    "rsqrt": True,
    "reciprocal": False,
    "neg": False,
    "sin": False,
    "cos": False,
    "erf": False,
    "sigmoid": False,
    "silu": False,
}


@pytest.mark.parametrize("name", list(_UNARY_MATH))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_unary_math_is_launched_with_cpus_bits(name, dtype):
    """RMSNorm's rsqrt, rotary embeddings' sin, cos and neg, SwiGLU's silu
    and the other structured unary ops are launched (they ran at the call
    through the boxed delegation, draining the queue: a Llama decode step
    waited on each), with the bits of CPU's kernel."""
    if name in ("sigmoid", "silu") and dtype == torch.int64:
        pytest.skip("CPU's kernels take floating point only")
    op = getattr(F, name) if name == "silu" else getattr(torch, name)
    torch.manual_seed(0)
    x_cpu = torch.randn(3, 4000) * 4
    if _UNARY_MATH[name]:
        x_cpu = x_cpu.abs()
    x_cpu = x_cpu.to(dtype)
    x = x_cpu.to("ember")
    # > 4096 elements (tiny work on an idle stream runs at the call), strided
    _assert_launched_like_synchronous(lambda: op(x[:, ::2]), f"aten::{name}")
    assert torch.equal(op(x[:, ::2]).cpu(), op(x_cpu[:, ::2]))


@pytest.mark.parametrize(
    "name, op",
    [
        ("neg_bool", lambda x: torch.neg(x.bool())),
        ("silu_int", F.silu),
        ("gelu_int", F.gelu),
        ("softmax_int", lambda x: torch.softmax(x, -1)),
        ("log_softmax_int", lambda x: torch._log_softmax(x, -1, False)),
        ("erf_complex", lambda x: torch.erf(x.to(torch.complex64))),
    ],
)
def test_kernel_dtype_errors_are_raised_at_the_call(name, op):
    """Errors a launched op's CPU kernel would raise only when it ran (its
    dtype dispatch: "not implemented for 'Long'") are raised at the call,
    with CPU's message, as CUDA raises them; nothing is left for the worker
    to raise at the next synchronisation."""
    x_cpu = torch.ones(4, 3000, dtype=torch.int64)
    x = x_cpu.to("ember")
    sleep_on_stream(0.05)
    with pytest.raises(RuntimeError) as on_cpu:
        op(x_cpu)
    with pytest.raises(RuntimeError) as on_ember:
        op(x)
    assert str(on_ember.value).splitlines()[0] == str(on_cpu.value).splitlines()[0]
    torch.ember.synchronize()  # no asynchronous error left behind


_MASK_OPS = {
    "eq_tensor": lambda x, y: torch.eq(x, y),
    "ne_scalar": lambda x, y: torch.ne(x, 0.5),
    "lt_broadcast": lambda x, y: torch.lt(x, y[:1]),
    "le_tensor": lambda x, y: torch.le(x, y),
    "gt_scalar": lambda x, y: x > -0.25,
    "ge_strided": lambda x, y: x[:, ::2] >= y[:, 1::2],
    "isneginf": lambda x, y: torch.isneginf(x),
    "isposinf": lambda x, y: torch.isposinf(x),
    "all_dim": lambda x, y: (x > -3).all(-1, keepdim=True),
    "any_dim": lambda x, y: (x > 3).any(0),
    "cumsum": lambda x, y: torch.cumsum(x, 1),
    "cumsum_dtype": lambda x, y: torch.cumsum(x, 0, dtype=torch.float64),
}


@pytest.mark.parametrize("name", list(_MASK_OPS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool])
def test_masks_and_positions_are_launched_with_cpus_bits(name, dtype):
    """The comparisons, infinity tests, all/any along a dimension and cumsum
    that transformers' mask and position code runs each decode step are
    launched (through the boxed delegation they ran at the call, draining
    the queue: Falcon's `le` and the math attention's `isneginf`, OPT's
    `cumsum`), with the bits of CPU's kernels."""
    op = _MASK_OPS[name]
    torch.manual_seed(0)
    x_cpu = torch.randn(3, 4000) * 4
    y_cpu = torch.randn(3, 4000) * 4
    x_cpu[0, :7] = float("-inf")
    x_cpu[1, :5] = float("inf")
    x_cpu, y_cpu = x_cpu.to(dtype), y_cpu.to(dtype)
    x, y = x_cpu.to("ember"), y_cpu.to("ember")
    expected = op(x_cpu, y_cpu)
    torch_ember.reset_launch_stats()
    sleep_on_stream()
    begin = time.monotonic()
    launched = op(x, y)
    assert returned_before_the_sleep_ended(begin)
    stats = torch_ember.launch_stats()
    assert sum(v["waited"] for v in stats.values()) == 0, stats
    assert sum(v["launched"] for v in stats.values()) >= 1, stats
    assert launched.dtype == expected.dtype and launched.shape == expected.shape
    assert launched.stride() == expected.stride()
    # bitwise, NaN where CPU has NaN (a cumsum through -inf and inf)
    torch.testing.assert_close(launched.cpu(), expected, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize(
    "op",
    [
        lambda x: torch.lt(x, x),
        lambda x: torch.ge(x, 1.0),
        lambda x: torch.isneginf(x),
        lambda x: torch.all(x, 5),
        lambda x: torch.cumsum(x, 3),
    ],
    ids=["lt_complex", "ge_complex_scalar", "isneginf_complex", "all_bad_dim", "cumsum_bad_dim"],
)
def test_mask_op_errors_are_raised_at_the_call(op):
    """Ordering complex numbers, an infinity test of a complex tensor and a
    dimension out of range raise CPU's error at the call, with the stream's
    queue busy; nothing is left for the worker to raise later."""
    x_cpu = torch.ones(4, 3000, dtype=torch.complex64)
    x = x_cpu.to("ember")
    sleep_on_stream(0.05)
    with pytest.raises((RuntimeError, IndexError)) as on_cpu:
        op(x_cpu)
    with pytest.raises(type(on_cpu.value)) as on_ember:
        op(x)
    assert str(on_ember.value).splitlines()[0] == str(on_cpu.value).splitlines()[0]
    torch.ember.synchronize()


_INDEX_CASES = {
    "list_index": lambda t, dev: t[..., [-2], :],  # Falcon's fused QKV split
    "one_dim": lambda t, dev: t[:, torch.tensor([0, 3, 1], device=dev)],
    "non_adjacent": lambda t, dev: t[
        torch.tensor([[1, 0]], device=dev), :, torch.tensor([2], device=dev)
    ],
    "int32_broadcast": lambda t, dev: t[
        torch.tensor([[1], [0]], dtype=torch.int32, device=dev),
        torch.tensor([4, 2, 0], dtype=torch.int32, device=dev),
    ],
}


@pytest.mark.parametrize("name", list(_INDEX_CASES))
def test_indexing_by_integer_tensors_is_launched_with_cpus_result(name):
    """x[..., idx] with integer index tensors on ember is launched (it ran at
    the call through the boxed delegation, draining the queue: Falcon's
    fused QKV split, twice a layer and step); the result's shape and strides
    are CPU's, its values CPU's (indices read when the kernel runs)."""
    op = _INDEX_CASES[name]
    x_cpu = torch.arange(2 * 5 * 6 * 8, dtype=torch.float32).reshape(2, 5, 6, 8)
    x = x_cpu.to("ember")
    expected = op(x_cpu, "cpu")
    torch_ember.reset_launch_stats()
    sleep_on_stream()
    begin = time.monotonic()
    got = op(x, "ember")
    assert returned_before_the_sleep_ended(begin)
    assert launched_count("aten::index.Tensor") == 1, torch_ember.launch_stats()
    assert got.shape == expected.shape and got.stride() == expected.stride()
    assert torch.equal(got.cpu(), expected)


def test_indexing_by_masks_or_host_indices_stays_synchronous():
    """A boolean mask selects a count known only from its values, and a host
    index tensor is read at the call: both run synchronously, as before."""
    x_cpu = torch.randn(4, 5)
    x = x_cpu.to("ember")
    sleep_on_stream()
    torch_ember.reset_launch_stats()
    assert torch.equal(x[x > 0].cpu(), x_cpu[x_cpu > 0])
    assert torch.equal(x[:, torch.tensor([4, 1])].cpu(), x_cpu[:, torch.tensor([4, 1])])
    assert launched_count("aten::index.Tensor") == 0


def test_indexing_out_of_range_is_an_asynchronous_error_naming_the_op():
    """Index values are read when the kernel runs: one out of range is
    raised at the next synchronisation, naming the op and CPU's message (as
    CUDA reports a device-side assert); the stream works afterwards."""
    x = torch.randn(2, 5, device="ember")
    index = torch.tensor([7], device="ember")
    x[:, index]
    with pytest.raises(RuntimeError, match=r"aten::index.Tensor.*out of bounds"):
        torch.ember.synchronize()
    assert torch.equal(x[:, torch.tensor([4], device="ember")].cpu(), x.cpu()[:, [4]])
