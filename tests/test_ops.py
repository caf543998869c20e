"""Ops on ember run CPU's kernels on the same bytes: results must be bitwise equal.

Also covers the delegation mechanics: in-place ops, out= arguments that must
be resized, ops returning views of their inputs, zero-copy accounting and
strict mode.
"""

import os
import struct
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import torch_ember

DTYPES = [
    torch.float32,
    torch.float64,
    torch.bfloat16,
    torch.float16,
    torch.int8,
    torch.int32,
    torch.int64,
    torch.bool,
    torch.complex64,
]


def make(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype)
    return torch.randint(-50, 50, shape, generator=g, dtype=dtype)


def same(ember_result, cpu_result):
    if isinstance(cpu_result, (tuple, list)):
        assert len(ember_result) == len(cpu_result)
        for e, c in zip(ember_result, cpu_result, strict=True):
            same(e, c)
        return
    if isinstance(cpu_result, float):
        # Bitwise, as for tensors: -0.0 != +0.0, NaN payloads count.
        assert isinstance(ember_result, float)
        assert struct.pack("<d", ember_result) == struct.pack("<d", cpu_result)
        return
    if not isinstance(cpu_result, torch.Tensor):
        assert ember_result == cpu_result
        return
    assert ember_result.device.type == "ember"
    assert ember_result.dtype == cpu_result.dtype
    assert ember_result.shape == cpu_result.shape
    assert ember_result.stride() == cpu_result.stride()
    ember_bits, cpu_bits = _bits(ember_result.cpu()), _bits(cpu_result)
    if not torch.equal(ember_bits, cpu_bits):
        # Bitwise equal, not just equal: -0.0 != +0.0, NaN payloads count.
        torch.testing.assert_close(ember_result.cpu(), cpu_result, rtol=0, atol=0, equal_nan=True)
        raise AssertionError("equal values but different bits (signed zero or NaN payload)")


_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as raw integers of the same width."""
    tensor = tensor.detach().resolve_conj().resolve_neg()
    if tensor.is_complex():
        tensor = torch.view_as_real(tensor)
    if tensor.is_floating_point():
        tensor = tensor.view(_INT_OF_WIDTH[tensor.element_size()])
    return tensor


def test_same_is_bitwise():
    """same() itself: what torch.equal / assert_close would let through."""
    zero = torch.zeros(3)
    nan = torch.full((3,), float("nan"))
    other_nan = nan.view(torch.int32).add(1).view(torch.float32)  # another payload
    assert torch.isnan(other_nan).all()
    for ember, cpu in [
        (-zero, zero),
        (other_nan, nan),
        (torch.complex(zero, -zero), torch.complex(zero, zero)),
        (-zero.double(), zero.double()),
        (-zero.half(), zero.half()),
    ]:
        with pytest.raises(AssertionError):
            same(ember.to("ember"), cpu)
    same(nan.to("ember"), nan.clone())
    with pytest.raises(AssertionError):  # scalar results too (item(), max of a 0-dim)
        same(-0.0, 0.0)
    same(float("nan"), float("nan"))
    same((-zero).to("ember"), -zero)


UNARY = {
    "neg": lambda x: -x,
    "abs": torch.abs,
    "clone": torch.clone,
    "flip": lambda x: x.flip(0),
    "cumsum": lambda x: x.cumsum(0),
    "sum": lambda x: x.sum(0),
    "amax": lambda x: x.amax(1),
    "sort": lambda x: x.sort(1),
    "argsort": lambda x: x.argsort(dim=1, stable=True),
    "transpose_contig": lambda x: x.t().contiguous(),
    "cat": lambda x: torch.cat([x, x], 1),
    "where": lambda x: torch.where(x > x.flip(0), x, x.flip(0)),
    "roll": lambda x: x.roll(2, 1),
    "eq": lambda x: x == x.flip(0),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_family_bitwise(name, dtype):
    fn = UNARY[name]
    x = make((5, 7), dtype)
    try:
        expected = fn(x)
    except (RuntimeError, NotImplementedError) as error:
        # Unsupported on CPU too: ember must raise the same type.
        with pytest.raises(type(error)):
            fn(x.to("ember"))
        return
    same(fn(x.to("ember")), expected)


FLOAT_OPS = {
    "matmul": lambda a, b: a @ b.T,
    "addmm": lambda a, b: torch.addmm(a[:, :5], a, b.T[:, :5]),
    "bmm": lambda a, b: torch.bmm(a[None], b.T[None]),
    "softmax": lambda a, b: a.softmax(-1),
    "log_softmax": lambda a, b: a.log_softmax(0),
    "layer_norm": lambda a, b: F.layer_norm(a, (7,), b[0], b[1]),
    "group_norm": lambda a, b: F.group_norm(a[None], 5),
    "gelu": lambda a, b: F.gelu(a),
    "silu": lambda a, b: F.silu(a),
    "var_mean": lambda a, b: torch.var_mean(a, 1),
    "norm": lambda a, b: torch.linalg.vector_norm(a, dim=1),
    "pow": lambda a, b: a.abs().pow(b.abs()),
    "lerp": lambda a, b: torch.lerp(a, b, 0.3),
    "linalg_solve": lambda a, b: torch.linalg.solve(a[:, :5] @ a[:, :5].T + 5 * torch.eye(5), a),
    "topk": lambda a, b: a.topk(3, dim=1),
    "median": lambda a, b: a.median(dim=1),
    "unique": lambda a, b: torch.unique(a.round(), return_counts=True),
    "nonzero": lambda a, b: (a > 0).nonzero(),
    "masked_select": lambda a, b: a.masked_select(a > 0),
    "embedding": lambda a, b: F.embedding(torch.tensor([[0, 2], [4, 1]]), a),
    "conv2d": lambda a, b: F.conv2d(a[None, None], b[None, None, :3, :3], padding=1),
    "max_pool2d": lambda a, b: F.max_pool2d(a[None, None], 2),
    "interpolate": lambda a, b: F.interpolate(a[None, None], scale_factor=2, mode="bilinear"),
    "sdpa": lambda a, b: F.scaled_dot_product_attention(a[None], b[None], a[None], is_causal=True),
    "cross_entropy": lambda a, b: F.cross_entropy(a, torch.tensor([0, 1, 2, 3, 4])),
    "gather": lambda a, b: a.gather(1, torch.tensor([[0, 1], [2, 3], [4, 5], [6, 0], [1, 2]])),
    "index_select": lambda a, b: a.index_select(1, torch.tensor([6, 0, 3])),
    "fft": lambda a, b: torch.fft.rfft(a),
    "complex_mul": lambda a, b: torch.complex(a, b) * torch.complex(b, a),
}


@pytest.mark.cpu_parity
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("name", sorted(FLOAT_OPS))
def test_float_ops_bitwise(name, dtype):
    fn = FLOAT_OPS[name]
    a, b = make((5, 7), dtype, 1), make((5, 7), dtype, 2)
    expected = fn(a, b)

    def on_ember(*tensors):
        # Index tensors built inside fn stay on CPU; move them like a user would.
        return fn(*tensors)

    if name in {"cross_entropy", "gather", "index_select", "embedding", "linalg_solve"}:
        with torch.device("ember"):
            result = fn(a.to("ember"), b.to("ember"))
    else:
        result = on_ember(a.to("ember"), b.to("ember"))
    same(result, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("name", sorted(FLOAT_OPS))
def test_float_ops_close_with_default_kernels(name, dtype):
    """ember's default kernels: same structure as CPU, values within the
    dtype's assert_close tolerances."""
    fn = FLOAT_OPS[name]
    a, b = make((5, 7), dtype, 1), make((5, 7), dtype, 2)
    expected = fn(a, b)
    with torch.device("ember"):
        result = fn(a.to("ember"), b.to("ember"))
    results = result if isinstance(result, (tuple, list)) else [result]
    expecteds = expected if isinstance(expected, (tuple, list)) else [expected]
    for r, e in zip(results, expecteds, strict=True):
        if isinstance(e, torch.Tensor):
            assert r.device.type == "ember" and r.shape == e.shape and r.dtype == e.dtype
            torch.testing.assert_close(r.cpu(), e)
        else:
            assert r == e


def test_inplace_op_writes_the_ember_tensor_and_returns_it():
    x = make((4, 6), torch.float32)
    e = x.to("ember")
    returned = e.add_(1.5)
    assert returned is e
    same(e, x + 1.5)


def test_inplace_on_a_view_reaches_the_base():
    x = make((4, 6), torch.float32)
    e = x.to("ember")
    e[:, 2:4].mul_(0)
    x[:, 2:4].mul_(0)
    same(e, x)


def test_inplace_op_refuses_to_broadcast_its_own_argument_as_cpu_does():
    """addr_ on a 0-dim tensor: CPU's kernel refuses it (it tells the
    in-place call from out= by argument identity, which ember's boxed
    delegation would lose) instead of resizing the tensor in place."""
    vec1, vec2 = make((5,), torch.float32), make((10,), torch.float32)
    with pytest.raises(RuntimeError) as cpu_error:
        torch.tensor(1.0).addr_(vec1, vec2)
    scalar = torch.tensor(1.0, device="ember")
    with pytest.raises(RuntimeError) as ember_error:
        scalar.addr_(vec1.to("ember"), vec2.to("ember"))
    assert str(ember_error.value) == str(cpu_error.value)
    assert scalar.shape == () and scalar.item() == 1.0
    matrix = torch.ones(5, 10)
    on_ember = matrix.to("ember")
    assert on_ember.addr_(vec1.to("ember"), vec2.to("ember"), beta=2) is on_ember
    same(on_ember, matrix.addr_(vec1, vec2, beta=2))


def test_out_argument_is_resized_in_place_without_copy():
    x = make((8, 16), torch.float32)
    e = x.to("ember")
    out = torch.empty(0, device="ember")
    storage_before = out.untyped_storage()
    result = torch.mm(e, e.T, out=out)
    assert result is out
    assert out.shape == (8, 8)
    assert out.untyped_storage()._cdata == storage_before._cdata  # same StorageImpl grown
    torch.testing.assert_close(out.cpu(), x @ x.T)  # ember's GEMM: within rounding


def test_out_argument_of_right_size_keeps_its_memory():
    e = make((8, 8), torch.float32).to("ember")
    out = torch.empty(8, 8, device="ember")
    pointer = out.data_ptr()
    torch.add(e, e, out=out)
    assert out.data_ptr() == pointer


def test_view_returned_by_a_delegated_op_shares_memory():
    e = make((6, 6), torch.float32).to("ember")
    windows = e.unfold(0, 2, 2)  # CPU kernel returns a view of its input
    assert windows.device.type == "ember"
    assert windows.data_ptr() == e.data_ptr()
    windows.zero_()
    assert e.abs().sum().item() == 0.0


def test_split_returns_views_on_ember():
    e = make((6, 4), torch.float32).to("ember")
    parts = e.split(2)
    assert all(p.device.type == "ember" for p in parts)
    assert parts[1].data_ptr() == e.data_ptr() + 2 * 4 * 4


def test_new_results_are_adopted_without_copies():
    torch_ember.reset_fallback_stats()
    e = make((16, 16), torch.float32).to("ember")
    before = torch.ember.memory_allocated()
    outputs = [e @ e, e.sort(1)[0], (e > 0).nonzero(), torch.cat([e, e]), e.softmax(1)]
    assert torch.ember.memory_allocated() > before  # outputs live in the ember pool
    assert torch_ember.fallback_stats() == {}
    del outputs


def test_strict_mode_is_off_by_default_and_toggles():
    assert not torch_ember.is_strict()
    torch_ember.set_strict(True)
    try:
        assert torch_ember.is_strict()
        e = make((4, 4), torch.float32).to("ember")
        same(e + e, make((4, 4), torch.float32) * 2)  # zero-copy ops still run
    finally:
        torch_ember.set_strict(False)


def test_scalar_ops_and_item():
    x = make((3, 3), torch.float64)
    e = x.to("ember")
    assert (e * 2 + 1).sum().item() == (x * 2 + 1).sum().item()
    assert bool((e == x.to("ember")).all())
    assert e[1, 2].item() == x[1, 2].item()


def test_factories_on_ember():
    same(torch.arange(10, device="ember"), torch.arange(10))
    same(torch.zeros(3, 4, device="ember"), torch.zeros(3, 4))
    same(torch.full((2, 3), 7, device="ember"), torch.full((2, 3), 7))
    same(torch.eye(4, device="ember"), torch.eye(4))
    same(torch.linspace(0, 1, 5, device="ember"), torch.linspace(0, 1, 5))
    e = torch.empty_strided((3, 4), (1, 3), device="ember")
    assert e.stride() == (1, 3)


def test_resize_and_set():
    e = torch.tensor([1.0, 2.0, 3.0], device="ember")
    e.resize_(6)
    assert e.shape == (6,) and e[:3].cpu().tolist() == [1.0, 2.0, 3.0]
    f = torch.empty(0, device="ember")
    f.set_(e.untyped_storage(), 0, (2, 3), (3, 1))
    assert f.data_ptr() == e.data_ptr()
    same(f, e.cpu().view(2, 3))


def test_foreach_ops():
    xs = [make((3, 4), torch.float32, i) for i in range(3)]
    es = [x.to("ember") for x in xs]
    torch._foreach_add_(es, 1.0)
    for e, x in zip(es, xs, strict=True):
        same(e, x + 1.0)


# A CPU kernel that hands back memory it did not allocate during the op (a
# buffer made beforehand), which ember can only copy: the one case the
# fallback counter and strict mode exist for.
_FOREIGN = torch.arange(6.0)
_LIB = torch.library.Library("ember_test", "DEF")
_LIB.define("foreign_buffer(Tensor x) -> Tensor")
_LIB.impl("foreign_buffer", lambda x: _FOREIGN, "CPU")


def test_unavoidable_copy_is_counted_per_op_and_refused_in_strict_mode():
    torch_ember.reset_fallback_stats()
    x = torch.ones(3, device="ember")
    result = torch.ops.ember_test.foreign_buffer(x)
    assert result.device.type == "ember"
    assert result.cpu().tolist() == _FOREIGN.tolist()
    assert result.data_ptr() != _FOREIGN.data_ptr()  # a copy, not the CPU buffer
    stats = torch_ember.fallback_stats()
    assert stats == {"ember_test::foreign_buffer": {"copies": 1, "bytes": 24}}

    torch_ember.set_strict(True)
    try:
        with pytest.raises(RuntimeError, match="ember_test::foreign_buffer"):
            torch.ops.ember_test.foreign_buffer(x)
    finally:
        torch_ember.set_strict(False)
    assert torch_ember.fallback_stats()["ember_test::foreign_buffer"]["copies"] == 1


def test_strict_mode_from_environment():
    code = (
        "import torch, torch_ember; assert torch_ember.is_strict(); "
        "x = torch.ones(2, device='ember'); print((x + x).sum().item())"
    )
    env = {**os.environ, "EMBER_STRICT": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "4.0"


# ---------------------------------------------------------------------------
# Module buffers: a train-mode forward updates BatchNorm's running mean and
# variance and its batch count; they are results too.


@pytest.mark.parametrize(
    ("module", "shape"),
    [
        (lambda: torch.nn.BatchNorm1d(5), (8, 5)),
        (lambda: torch.nn.BatchNorm1d(5, momentum=None), (8, 5, 7)),  # cumulative average
        (lambda: torch.nn.BatchNorm2d(3), (4, 3, 6, 6)),
        (lambda: torch.nn.BatchNorm3d(2, affine=False), (2, 2, 3, 4, 5)),
    ],
)
@pytest.mark.parametrize("parity", [True, False])
def test_batchnorm_running_stats_match_cpu(module, shape, parity):
    torch.manual_seed(0)
    cpu_module = module().train()
    dev_module = module().train().to("ember")
    dev_module.load_state_dict(cpu_module.state_dict())
    inputs = [torch.randn(shape) * 3 + 1 for _ in range(3)]
    with torch.backends.ember.flags(cpu_parity=parity):
        for x in inputs:  # three steps: the running averages accumulate
            out_cpu, out_dev = cpu_module(x), dev_module(x.to("ember"))
        cpu_module.eval(), dev_module.eval()
        eval_cpu, eval_dev = cpu_module(inputs[0]), dev_module(inputs[0].to("ember"))
    cpu_buffers, dev_buffers = dict(cpu_module.named_buffers()), dict(dev_module.named_buffers())
    assert list(cpu_buffers) == list(dev_buffers)
    assert cpu_buffers["num_batches_tracked"].item() == 3
    pairs = [(out_dev, out_cpu), (eval_dev, eval_cpu)] + [
        (dev_buffers[name], buffer) for name, buffer in cpu_buffers.items()
    ]
    for dev, cpu in pairs:
        if parity:
            same(dev.detach(), cpu.detach())
        else:
            assert dev.device.type == "ember"
            torch.testing.assert_close(dev.detach().cpu(), cpu.detach())
    # The buffers moved from their initial values (the check is not vacuous).
    assert not torch.equal(
        cpu_buffers["running_mean"], torch.zeros_like(cpu_buffers["running_mean"])
    )
