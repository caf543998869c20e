"""Property tests: random shapes, strides, dtypes and broadcasting, ember vs CPU.

hypothesis draws shapes of 0-4 dims (zero-size included), a memory layout
(contiguous, permuted, sliced with steps and an offset, or expanded from
size-1 dims), dtypes (float32, float64, int32, int64, bool, bfloat16),
broadcast-compatible shape pairs and reduction dims, for the elementwise,
reduction and matmul families. The same view is built over the same bytes
on CPU and on ember, and every example runs on ember in both modes:

``parity``   ``torch.backends.ember.flags(cpu_parity=True)`` (CPU's kernels):
             the same dtype, shape, strides and the same bytes as CPU
``default``  ember's own kernels (``cpu_parity=False``): the same dtype, shape
             and strides, values within ``assert_close``'s default tolerances
             for the dtype (what the conformance kit's default sweep uses)

or, in both modes, the call raises the exception type CPU raises.

Under CI (``CI`` set) examples are derandomized so a run is reproducible.
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

settings.register_profile(
    "ember",
    max_examples=250,
    deadline=None,
    derandomize=bool(os.environ.get("CI")),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("ember")

DTYPES = [torch.float32, torch.float64, torch.int32, torch.int64, torch.bool, torch.bfloat16]
FLOAT_DTYPES = [torch.float32, torch.float64, torch.bfloat16]
LAYOUTS = ["contiguous", "permuted", "stepped", "expanded"]

dtypes = st.sampled_from(DTYPES)
shapes = st.lists(st.integers(0, 5), min_size=0, max_size=4).map(tuple)
layouts = st.sampled_from(LAYOUTS)
seeds = st.integers(0, 2**31 - 1)


def _values(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point:
        t = torch.randn(shape, generator=g, dtype=torch.float64)
        flat = t.view(-1)
        if flat.numel() >= 4:  # special values where they fit
            flat[0], flat[1] = float("nan"), float("-inf")
            flat[2], flat[3] = -0.0, float("inf")
        return t.to(dtype)
    return torch.randint(-20, 20, shape, generator=g, dtype=dtype)


def make_pair(shape, dtype, layout, seed):
    """The same strided view, over the same bytes, on CPU and on ember."""
    n = len(shape)
    if layout == "permuted" and n >= 2:
        perm = list(range(n))[::-1]
        base = _values(tuple(shape[p] for p in perm), dtype, seed)
        inverse = [perm.index(i) for i in range(n)]
        view = lambda t: t.permute(inverse)
    elif layout == "stepped" and n >= 1:
        base = _values(tuple(2 * s + 1 for s in shape), dtype, seed)
        view = lambda t: t[tuple(slice(1, 1 + 2 * s, 2) for s in shape)]
    elif layout == "expanded" and n >= 1:
        small = tuple(1 if i % 2 == seed % 2 else s for i, s in enumerate(shape))
        base = _values(small, dtype, seed)
        view = lambda t: t.expand(shape)
    else:
        base = _values(shape, dtype, seed)
        view = lambda t: t
    cpu, ember = view(base), view(base.to("ember"))
    assert cpu.shape == ember.shape == torch.Size(shape)
    assert cpu.stride() == ember.stride()
    return cpu, ember


def _bytes(t: torch.Tensor) -> torch.Tensor:
    flat = torch.empty((t.numel(),), dtype=t.dtype)
    flat.copy_(t.reshape(-1))
    return flat.view(torch.uint8)


# mode -> torch.backends.ember.cpu_parity
MODES = {"parity": True, "default": False}


def assert_same(ember_result, cpu_result, mode="parity"):
    """Structure exact; values bitwise (parity) or within the dtype's default
    tolerances (default)."""
    if isinstance(cpu_result, (tuple, list)):
        assert len(ember_result) == len(cpu_result)
        for e, c in zip(ember_result, cpu_result, strict=True):
            assert_same(e, c, mode)
        return
    assert ember_result.device.type == "ember"
    assert ember_result.dtype == cpu_result.dtype
    assert ember_result.shape == cpu_result.shape
    assert ember_result.stride() == cpu_result.stride()
    if mode == "parity":
        assert torch.equal(_bytes(ember_result.cpu()), _bytes(cpu_result))
    else:
        torch.testing.assert_close(ember_result.cpu(), cpu_result, equal_nan=True)


def on_ember(fn, args, mode):
    with torch.backends.ember.flags(cpu_parity=MODES[mode]):
        return fn(*args)


def check(fn, cpu_args, ember_args, modes=tuple(MODES)):
    """In each mode ember gives CPU's result (see assert_same), or raises what
    CPU raises. ``fn`` must not modify its arguments (it runs once per mode)."""
    try:
        expected = fn(*cpu_args)
    except Exception as error:  # noqa: BLE001 - ember must fail the same way
        for mode in modes:
            with pytest.raises(type(error)):
                on_ember(fn, ember_args, mode)
        return
    for mode in modes:
        assert_same(on_ember(fn, ember_args, mode), expected, mode)


@st.composite
def broadcast_shapes(draw):
    """Two shapes that broadcast (right-aligned dims equal or 1, one may be shorter)."""
    a = draw(shapes)
    b = []
    for size in a[len(a) - draw(st.integers(0, len(a))) :]:
        b.append(draw(st.sampled_from([size, 1])))
    if draw(st.booleans()):
        a = tuple(1 if draw(st.booleans()) and s else s for s in a)
    pair = (tuple(a), tuple(b))
    return pair if draw(st.booleans()) else pair[::-1]


BINARY = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "div": torch.div,
    "maximum": torch.maximum,
    "eq": torch.eq,
    "lt": torch.lt,
    "ge": torch.ge,
    "ne": torch.ne,
}


@pytest.mark.parametrize("name", sorted(BINARY))
@given(
    shapes=broadcast_shapes(),
    dtype_a=dtypes,
    dtype_b=dtypes,
    layout_a=layouts,
    layout_b=layouts,
    seed=seeds,
)
def test_binary_elementwise(name, shapes, dtype_a, dtype_b, layout_a, layout_b, seed):
    a, ea = make_pair(shapes[0], dtype_a, layout_a, seed)
    b, eb = make_pair(shapes[1], dtype_b, layout_b, seed + 1)
    check(BINARY[name], (a, b), (ea, eb))


@given(
    shapes=broadcast_shapes(),
    dtype=dtypes,
    layout=layouts,
    seed=seeds,
)
def test_where(shapes, dtype, layout, seed):
    cond, econd = make_pair(shapes[0], torch.bool, layout, seed)
    x, ex = make_pair(shapes[1], dtype, "contiguous", seed + 1)
    y, ey = make_pair(shapes[1], dtype, layout, seed + 2)
    check(torch.where, (cond, x, y), (econd, ex, ey))


@given(shapes=broadcast_shapes(), dtype=dtypes, layout=layouts, seed=seeds)
def test_inplace_add(shapes, dtype, layout, seed):
    a, ea = make_pair(shapes[0], dtype, layout, seed)
    b, eb = make_pair(shapes[1], dtype, "contiguous", seed + 1)
    for mode in MODES:  # each mode adds in place into its own copy
        # (an expanded view cannot be written in place: clone)
        cpu_a, ember_a = a.clone(), ea.clone()
        check(lambda x, y: x.add_(y), (cpu_a, b), (ember_a, eb), modes=(mode,))
        assert_same(ember_a, cpu_a, mode)


REDUCTIONS = {
    "sum": torch.sum,
    "mean": torch.mean,
    "amax": torch.amax,
    "prod": torch.prod,
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
@given(
    shape=shapes,
    dtype=dtypes,
    layout=layouts,
    seed=seeds,
    dims=st.lists(st.integers(0, 3), min_size=1, max_size=3, unique=True),
    keepdim=st.booleans(),
)
def test_reduction(name, shape, dtype, layout, seed, dims, keepdim):
    x, ex = make_pair(shape, dtype, layout, seed)
    dims = [d for d in dims if d < max(len(shape), 1)] or [0]
    if not shape:
        dims = [0]
    fn = REDUCTIONS[name]
    if name == "prod":  # prod takes one dim
        check(lambda t: fn(t, dims[0], keepdim=keepdim), (x,), (ex,))
    else:
        check(lambda t: fn(t, dims, keepdim=keepdim), (x,), (ex,))
    check(lambda t: fn(t), (x,), (ex,))


@given(shape=shapes, dtype=dtypes, layout=layouts, seed=seeds, keepdim=st.booleans())
def test_argmax(shape, dtype, layout, seed, keepdim):
    x, ex = make_pair(shape, dtype, layout, seed)
    dim = len(shape) - 1 if shape else None
    check(lambda t: torch.argmax(t, dim=dim, keepdim=keepdim), (x,), (ex,))


# ember's default fp32 GEMM (cpu_parity off) leaves the result of an empty
# reduction (k = 0) uninitialized instead of zero (addmm: instead of
# beta * self): a kernel bug, pinned by test_empty_reduction_gemm_default_mode
# (strict xfail). Until it is fixed, the default-mode leg of the matmul
# properties skips k = 0 in float32; the parity leg keeps every example.
@st.composite
def matmul_shapes(draw):
    n, k, m = draw(st.integers(0, 6)), draw(st.integers(0, 6)), draw(st.integers(0, 6))
    batch = tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
    kind = draw(st.sampled_from(["vv", "mv", "mm", "bmm", "broadcast"]))
    if kind == "vv":
        return (k,), (k,)
    if kind == "mv":
        return (n, k), (k,)
    if kind == "mm":
        return (n, k), (k, m)
    if kind == "bmm":
        return (*batch, n, k), (*batch, k, m)
    return (*batch, n, k), (k, m)


@given(
    shapes=matmul_shapes(),
    dtype=st.sampled_from([*FLOAT_DTYPES, torch.int64]),
    layout_a=layouts,
    layout_b=layouts,
    seed=seeds,
)
def test_matmul(shapes, dtype, layout_a, layout_b, seed):
    a, ea = make_pair(shapes[0], dtype, layout_a, seed)
    b, eb = make_pair(shapes[1], dtype, layout_b, seed + 1)
    check(torch.matmul, (a, b), (ea, eb))


@given(
    n=st.integers(0, 6),
    k=st.integers(0, 6),
    m=st.integers(0, 6),
    dtype=st.sampled_from(FLOAT_DTYPES),
    transpose=st.booleans(),
    seed=seeds,
)
def test_addmm(n, k, m, dtype, transpose, seed):
    bias, ebias = make_pair((m,), dtype, "contiguous", seed)
    a, ea = make_pair((n, k), dtype, "permuted" if transpose else "contiguous", seed + 1)
    b, eb = make_pair((k, m), dtype, "stepped", seed + 2)
    check(
        lambda c, x, y: torch.addmm(c, x, y, beta=0.5, alpha=2.0),
        (bias, a, b),
        (ebias, ea, eb),
    )


def test_empty_reduction_gemm_default_mode():
    """k = 0: the result is zeros (addmm: beta * self), whatever the reused memory held."""
    ember = torch.device("ember")
    calls = {
        "mm": lambda a, b, c: torch.mm(a, b),
        "matmul": lambda a, b, c: a @ b,
        "bmm": lambda a, b, c: torch.bmm(a.expand(2, 5, 0), b.expand(2, 0, 10)),
        "linear": lambda a, b, c: torch.nn.functional.linear(a, b.t()),
        "addmm": lambda a, b, c: torch.addmm(c, a, b, beta=0.5),
    }
    wrong = []
    for name, call in calls.items():
        a, b, c = torch.zeros(5, 0), torch.zeros(0, 10), torch.ones(10)
        expected = call(a, b, c)
        ea, eb, ec = a.to(ember), b.to(ember), c.to(ember)
        with torch.backends.ember.flags(cpu_parity=False):
            # A freed block full of NaN, the size of the result, to be reused.
            junk = torch.full(expected.shape, float("nan"), device=ember)
            del junk
            got = call(ea, eb, ec).cpu()
        if not torch.equal(got, expected):
            wrong.append(name)
    assert not wrong, f"k = 0 results are not zeros in the default mode: {wrong}"


def test_addmm_scalar_self_default_mode():
    """addmm with a 0-dim self broadcasts it, as CPU does (conformance:
    forward/backward addmm.decomposed float32 in the default sweep)."""
    self, a, b = torch.tensor(1.5), torch.randn(2, 2), torch.randn(2, 3)
    expected = torch.addmm(self, a, b)
    with torch.backends.ember.flags(cpu_parity=False):
        got = torch.addmm(self.to("ember"), a.to("ember"), b.to("ember"))
    assert_same(got, expected, "default")
