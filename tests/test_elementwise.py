"""ember's own elementwise kernels (ops/kernels/elementwise/): accuracy
against float64, special values, layouts, and the CPU-parity switch."""

import math

import pytest
import torch
import torch.nn.functional as F
from isa import VECTOR_KERNELS

import torch_ember

DEVICE = "ember"
EPS32 = torch.finfo(torch.float32).eps
be = torch.backends.ember


OPS = {
    "tanh": torch.tanh,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
}


def _gelu_tanh64(x):
    """gelu(approximate="tanh") in float64 as x / (1 + exp(-2u)): the same
    function as x (1 + tanh(u)) / 2, without its cancellation for x < 0."""
    x = x.double()
    return x / (1 + torch.exp(-2 * math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _ulp_error(out, ref64):
    scale = ref64.abs().clamp_min(torch.finfo(torch.float32).tiny)
    return ((out.double() - ref64).abs() / (EPS32 * scale)).max().item()


def test_tanh_within_two_ulp_everywhere():
    x = torch.cat(
        [
            torch.linspace(-12, 12, 400_001),
            torch.randn(50_000) * 1e-3,
            torch.randn(50_000) * 0.55,  # around the switch of formulas
            torch.tensor([0.55, -0.55, 0.5499999, 9.999, 10.0, 88.0, -88.0]),
        ]
    )
    out = torch.tanh(x.to(DEVICE)).cpu()
    assert _ulp_error(out, torch.tanh(x.double())) <= 2.0
    torch.testing.assert_close(out, torch.tanh(x))


def test_tanh_special_values():
    x = torch.tensor([0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1e-40, -1e-40])
    out = torch.tanh(x.to(DEVICE)).cpu()
    ref = torch.tanh(x)
    assert torch.equal(out.signbit(), ref.signbit())
    torch.testing.assert_close(out, ref, equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(3, 5, 7),
        lambda: torch.randn(2, 8, 4, 4).contiguous(memory_format=torch.channels_last),
        lambda: torch.randn(6, 9).t(),  # dense, transposed
        lambda: torch.randn(6, 9)[:, ::2],  # strided: CPU's kernel
        lambda: torch.randn(0, 4),
        lambda: torch.randn(7, 0).t(),  # empty, transposed: CPU's kernel
        lambda: torch.randn(1, 5, 1)[:, ::2],  # size-1 dims, odd strides
        lambda: torch.randn(17, dtype=torch.float64),  # other dtype: CPU's kernel
    ],
    ids=[
        "contiguous",
        "channels_last",
        "transposed",
        "strided",
        "empty",
        "empty_transposed",
        "size1",
        "float64",
    ],
)
@pytest.mark.parametrize("op", ["tanh", "gelu_tanh"])
def test_layouts_match_cpu(make, op):
    fn = OPS[op]
    x = make()
    out = fn(x.to(DEVICE))
    ref = fn(x)
    assert out.shape == ref.shape and out.stride() == ref.stride()
    torch.testing.assert_close(out.cpu(), ref)


@pytest.mark.parametrize("op", ["tanh", "gelu_tanh"])
def test_autograd_and_reproducible(op):
    fn = OPS[op]
    x = torch.randn(1000, requires_grad=True)
    xe = x.detach().to(DEVICE).requires_grad_()
    fn(x).sum().backward()
    fn(xe).sum().backward()
    torch.testing.assert_close(xe.grad.cpu(), x.grad)
    assert torch.equal(fn(xe).cpu(), fn(xe).cpu())


@pytest.mark.cpu_parity
@pytest.mark.parametrize("op", ["tanh", "gelu_tanh", "gelu"])
def test_parity_is_bitwise(op):
    x = torch.randn(10_000) * 4
    assert torch.equal(OPS[op](x.to(DEVICE)).cpu(), OPS[op](x))


def test_tanh_route_is_ember_kernel(capfd):
    if not VECTOR_KERNELS:
        pytest.skip("ember's vector kernels need AVX-512F or AVX2")
    x = torch.randn(64, device=DEVICE)
    with be.verbose(1):
        torch.tanh(x)
    assert "ember/tanh" in capfd.readouterr().err


def _round_to_bf16(x32):
    """fp32 -> bf16 bits rounded to nearest even, as float64 (a reference)."""
    return x32.bfloat16().double()


def test_bf16_tanh_is_the_fp32_kernel_rounded_once(capfd):
    """bf16 tanh runs ember's fp32 kernel on the exact fp32 values and rounds
    once to the nearest bf16: bitwise the fp32 kernel's result rounded, and
    within one bf16 rounding of float64 (CPU's bf16 kernel rounds the same
    way from SLEEF's fp32 tanh)."""
    if not VECTOR_KERNELS:
        pytest.skip("ember's vector kernels need AVX-512F or AVX2")
    x = torch.cat([torch.linspace(-12, 12, 100_003), torch.randn(20_000) * 1e-3])
    x = x.bfloat16()
    special = torch.tensor([0.0, -0.0, float("nan"), float("inf"), -float("inf")])
    x = torch.cat([x, special.bfloat16()])
    with be.verbose(1):
        out = torch.tanh(x.to(DEVICE))
    assert "ember/tanh" in capfd.readouterr().err
    assert out.dtype == torch.bfloat16
    fp32 = torch.tanh(x.float().to(DEVICE)).cpu()  # ember's fp32 kernel
    assert torch.equal(out.cpu().view(torch.int16)[:-5], fp32.bfloat16().view(torch.int16)[:-5])
    ref = torch.tanh(x.double())
    err = (out.cpu().double() - ref).abs()[:-5]
    assert (err <= 2.0**-8 * ref.abs()[:-5] + 1e-30).all()  # one bf16 rounding, + fp32's ulps
    torch.testing.assert_close(out.cpu()[-5:], torch.tanh(special).bfloat16(), equal_nan=True)
    assert torch.equal(out.cpu()[-5:].signbit(), torch.tanh(special).signbit())


@pytest.mark.parametrize("op", ["tanh", "gelu_tanh"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_launched_equals_the_call_and_parity_is_cpus(op, dtype):
    fn = OPS[op]
    x = torch.randn(3, 3072).to(dtype)
    xe = x.to(DEVICE)
    with be.flags(async_execution=False):
        at_call = fn(xe).cpu()
    with be.flags(async_execution=True):
        launched = fn(xe).cpu()
    assert torch.equal(at_call, launched)
    with be.flags(cpu_parity=True):
        assert torch.equal(fn(xe).cpu(), fn(x))


def test_gelu_tanh_accurate_where_cpus_is_not():
    """Within 8 ulp of float64 for |x| <= 3 and 2e-5 relative out to -12,
    results of 1e-30 included (CPU's kernel: 100+ ulp at |x| <= 3, and 0
    for a result of 1e-10 at x = -6); within CPU's own tolerance of CPU's
    result everywhere."""
    if not VECTOR_KERNELS:
        pytest.skip("ember's vector kernels need AVX-512F or AVX2")
    x = torch.cat([torch.linspace(-12, 12, 400_001), torch.randn(50_000) * 1e-3])
    out = F.gelu(x.to(DEVICE), approximate="tanh").cpu()
    ref = _gelu_tanh64(x)
    near = x.abs() <= 3
    assert _ulp_error(out[near], ref[near]) <= 8.0
    tail = (x < -3) & (ref.abs() > 1e-30)
    assert ((out[tail].double() - ref[tail]).abs() <= 2e-5 * ref[tail].abs()).all()
    torch.testing.assert_close(out, F.gelu(x, approximate="tanh"))


def test_gelu_tanh_special_values_and_route(capfd):
    if not VECTOR_KERNELS:
        pytest.skip("ember's vector kernels need AVX-512F or AVX2")
    x = torch.tensor(
        [0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1e-40, -1e-40, -30.0, 88.0]
    )
    with be.verbose(1):
        out = F.gelu(x.to(DEVICE), approximate="tanh").cpu()
    assert "ember/gelu_tanh" in capfd.readouterr().err
    ref = F.gelu(x, approximate="tanh")  # inf -> inf, -inf -> NaN, as CPU's
    assert torch.equal(out.signbit(), ref.signbit())
    torch.testing.assert_close(out, ref, equal_nan=True, rtol=0, atol=0)
    # The erf form stays CPU's kernel.
    with be.verbose(1):
        F.gelu(x.to(DEVICE))
    assert "ember/gelu" not in capfd.readouterr().err


def test_bf16_gelu_tanh_is_the_fp32_kernel_rounded_once():
    if not VECTOR_KERNELS:
        pytest.skip("ember's vector kernels need AVX-512F or AVX2")
    x = torch.cat([torch.linspace(-8, 8, 100_003), torch.randn(20_000) * 1e-3]).bfloat16()
    out = F.gelu(x.to(DEVICE), approximate="tanh").cpu()
    fp32 = F.gelu(x.float().to(DEVICE), approximate="tanh").cpu()
    assert torch.equal(out.view(torch.int16), fp32.bfloat16().view(torch.int16))
    torch.testing.assert_close(out, F.gelu(x, approximate="tanh"))


# --------------------------------------------------- add, sub, mul, div, relu
# ember's loop over flat fp32 operands (elementwise/Arithmetic.cpp): one
# correctly rounded IEEE operation per element, so CPU's bits exactly.

ARITH = {
    "add": lambda x, y: x + y,
    "sub": lambda x, y: x - y,
    "mul": lambda x, y: x * y,
    "div": lambda x, y: x / y,
    "relu": lambda x, y: torch.relu(x),
}
ARITH_ROUTE = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "relu": "relu"}


def _special_fp32(shape, seed):
    """Random values with NaN, infinities, signed zeros, denormals and
    values near fp32's range mixed in."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp(torch.randn(shape, generator=g) * 4)
    flat = x.view(-1)
    special = torch.tensor(
        [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-40, -1e-40, 3e38, -3e38]
    )
    take = min(flat.numel(), special.numel())
    pos = torch.randperm(flat.numel(), generator=g)[:take]
    flat[pos] = special[:take]
    return x


def _bits(t):
    return t.contiguous().view(torch.int32)


def _needs_avx512():
    if not VECTOR_KERNELS:
        pytest.skip("ember's arithmetic loop needs AVX-512F or AVX2")


@pytest.fixture
def _async_execution():
    previous = be.async_execution
    be.async_execution = True
    yield
    torch.ember.synchronize()
    be.async_execution = previous


@pytest.mark.usefixtures("_async_execution")
@pytest.mark.parametrize("shape", [(8, 8), (1, 1, 3072), (2, 1, 3), (), (100_003,)])
@pytest.mark.parametrize("other", ["tensor", "float", "int", "huge"])
@pytest.mark.parametrize("op", sorted(ARITH))
def test_arithmetic_is_cpus_bits_and_layout(op, other, shape, capfd):
    _needs_avx512()
    x = _special_fp32(shape, 1)
    y = {
        "tensor": _special_fp32(shape, 2),
        "float": 0.044715,
        "int": 3,
        "huge": 1e300,  # inf in fp32, as CPU's kernel converts it
    }[other]
    ye = y.to(DEVICE) if isinstance(y, torch.Tensor) else y
    with be.verbose(1):
        out = ARITH[op](x.to(DEVICE), ye)
    assert f"ember/{ARITH_ROUTE[op]}" in capfd.readouterr().err
    ref = ARITH[op](x, y)
    assert out.shape == ref.shape and out.stride() == ref.stride() and out.dtype == ref.dtype
    assert torch.equal(_bits(out.cpu()), _bits(ref))


@pytest.mark.usefixtures("_async_execution")
@pytest.mark.parametrize(
    "name, fn",
    [
        ("alpha", lambda x, y: torch.add(x, y, alpha=2)),
        ("broadcast", lambda x, y: x + y[:1]),
        ("transposed", lambda x, y: x.t() * y.t()),
        ("strided", lambda x, y: x[:, ::2] - y[:, ::2]),
        ("size1_odd_strides", lambda x, y: x[:1, :1].expand(1, 1) / y[:1, :1]),
        ("bf16", lambda x, y: x.bfloat16() * y.bfloat16()),
        ("host_tensor", lambda x, y: x * torch.tensor(2.0)),
        ("complex_scalar", lambda x, y: x * 1j),
        ("empty", lambda x, y: x[:0] + y[:0]),
    ],
)
def test_arithmetic_outside_the_loop_is_cpus(name, fn, capfd):
    x, y = torch.randn(6, 8), torch.randn(6, 8)
    with be.verbose(1):
        out = fn(x.to(DEVICE), y.to(DEVICE))
    log = capfd.readouterr().err
    assert not any(f"ember/{r}" in log for r in ARITH_ROUTE.values()), name
    ref = fn(x, y)
    assert out.shape == ref.shape and out.stride() == ref.stride() and out.dtype == ref.dtype
    assert torch.equal(out.cpu(), ref)


@pytest.mark.usefixtures("_async_execution")
@pytest.mark.parametrize("chained", [False, True], ids=["op_by_op", "chained"])
def test_arithmetic_is_launched_and_keeps_its_operands_alive(chained):
    _needs_avx512()
    with be.flags(fuse_elementwise=chained):
        _arithmetic_is_launched_and_keeps_its_operands_alive(chained)


def _arithmetic_is_launched_and_keeps_its_operands_alive(chained):
    torch_ember.reset_launch_stats()
    base = torch.ember.memory_allocated()
    a = torch.full((1 << 16,), 3.0, device=DEVICE)
    b = torch.full((1 << 16,), 0.5, device=DEVICE)
    stream = torch.ember.current_stream()
    torch_ember._C._engine_enqueue_sleep(stream.device_index, stream.stream_id, 0.1)
    c = torch.relu(a * b - 1.0)  # queued behind the sleep
    assert not stream.query()
    del a, b  # the queued work still reads them
    junk = [torch.full((1 << 16,), -7.0, device=DEVICE) for _ in range(4)]
    assert torch.equal(c.cpu(), torch.full((1 << 16,), 0.5))
    stats = torch_ember.launch_stats()
    # One launched unit per op, or the three as one chain (ElementwiseChain.h)
    units = (
        ["ember::elementwise_chain"]
        if chained
        else ["aten::mul.Tensor", "aten::sub.Tensor", "aten::relu"]
    )
    for unit in units:
        assert stats[unit]["launched"] == 1, stats
    del c, junk
    torch.ember.synchronize()
    assert torch.ember.memory_allocated() == base


@pytest.mark.cpu_parity
@pytest.mark.parametrize("op", sorted(ARITH))
def test_arithmetic_under_cpu_parity_is_cpus_kernel(op, capfd):
    x, y = torch.randn(64), torch.randn(64)
    with be.flags(cpu_parity=True), be.verbose(1):
        out = ARITH[op](x.to(DEVICE), y.to(DEVICE))
    assert "ember/" not in capfd.readouterr().err
    assert torch.equal(out.cpu(), ARITH[op](x, y))


@pytest.mark.parametrize("shape", [(8, 8), (1, 1, 3072), (2, 1, 3), (), (4097,)])
@pytest.mark.parametrize("op", sorted(ARITH))
def test_tiny_arithmetic_on_the_synchronous_engine_is_the_loop_with_cpus_bits(op, shape, capfd):
    """The synchronous engine runs tiny work (up to _tiny_work_numel
    elements) in ember's loop too, where CPU's delegated kernel cost more
    than the op; larger work keeps CPU's kernel there."""
    _needs_avx512()
    x, y = _special_fp32(shape, 3), _special_fp32(shape, 4)
    with be.flags(async_execution=False), be.verbose(1):
        out = ARITH[op](x.to(DEVICE), y.to(DEVICE))
    tiny = x.numel() <= torch_ember._C._tiny_work_numel()
    assert (f"ember/{ARITH_ROUTE[op]}" in capfd.readouterr().err) == tiny
    ref = ARITH[op](x, y)
    assert out.shape == ref.shape and out.stride() == ref.stride()
    assert torch.equal(_bits(out.cpu()), _bits(ref))
