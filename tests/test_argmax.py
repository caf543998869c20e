"""ember's argmax row kernel (ops/kernels/elementwise/RowArgmax.cpp): CPU's
answer exactly (first index of the maximum, NaN above every number, -0.0
equal to 0.0), for fp32 and bf16 rows of every length around the vector
width, under both engines; the layouts it does not take stay CPU's."""

import pytest
import torch

import torch_ember  # noqa: F401

DEVICE = "ember"
be = torch.backends.ember

needs_avx512 = pytest.mark.skipif(
    not be.capabilities()["avx512f"], reason="ember's row kernel needs AVX-512F"
)

LENGTHS = [1, 2, 15, 16, 17, 31, 32, 33, 47, 48, 100, 1000, 50257]


def _check(x, dim=-1, keepdim=False):
    ref = torch.argmax(x, dim=dim, keepdim=keepdim)
    out = torch.argmax(x.to(DEVICE), dim=dim, keepdim=keepdim)
    assert out.dtype == torch.int64 and out.shape == ref.shape
    assert torch.equal(out.cpu(), ref), (out.cpu(), ref)


@needs_avx512
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", LENGTHS)
def test_random_rows_match_cpu(dtype, n):
    g = torch.Generator().manual_seed(n)
    _check(torch.randn(3, n, generator=g).to(dtype))
    _check(torch.randn(1, 1, n, generator=g).to(dtype), keepdim=True)


@needs_avx512
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 16, 17, 40, 1000])
@pytest.mark.parametrize("where", ["first", "last", "middle", "every"])
def test_ties_give_the_first_index(dtype, n, where):
    x = torch.zeros(n, dtype=dtype)
    if where == "every":
        x.fill_(3.0)
    else:
        x[{"first": [0], "last": [n - 1], "middle": [n // 3, n - 1]}[where]] = 5.0
    _check(x.unsqueeze(0))
    # bf16 rounds neighbours of a maximum onto it: many ties at once
    _check((torch.randn(4, n) * 1e-3 + 1.0).to(dtype))


@needs_avx512
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 17, 40, 333])
def test_special_values(dtype, n):
    nan, inf = float("nan"), float("inf")
    g = torch.Generator().manual_seed(7)
    rows = []
    for specials in (
        {n // 2: nan},  # a NaN is the maximum
        {n - 1: nan, n // 2: nan},  # the first NaN wins
        {0: inf, n - 1: inf},  # +inf ties: the first
        {},  # filled with -inf below
        {n // 3: -0.0, n - 1: 0.0},  # -0.0 == 0.0 over a negative row
    ):
        row = -torch.rand(n, generator=g) - 1
        for i, v in specials.items():
            row[i] = v
        rows.append(row)
    rows[3].fill_(-inf)
    _check(torch.stack(rows).to(dtype))


@needs_avx512
def test_whole_tensor_and_keepdim_shapes_match_cpu():
    x = torch.randn(2, 3, 37)
    for dim in (None, -1, 2):
        for keepdim in (False, True):
            _check(x, dim=dim, keepdim=keepdim)
    _check(torch.tensor(4.0), dim=None)  # 0-d
    _check(torch.tensor(4.0), dim=0, keepdim=True)


@needs_avx512
def test_route_is_the_row_kernel_and_other_layouts_are_cpus(capfd):
    x = torch.randn(4, 50)
    with be.verbose(1):
        torch.argmax(x.to(DEVICE), -1)
    assert "ember/argmax" in capfd.readouterr().err
    for view in (lambda t: t.t(), lambda t: t[:, ::2], torch.Tensor.double, torch.Tensor.half):
        with be.verbose(1):
            out = torch.argmax(view(x.to(DEVICE)), -1)
        assert "ember/argmax" not in capfd.readouterr().err
        assert torch.equal(out.cpu(), torch.argmax(view(x), -1))
    _check(x, dim=0)  # not the last dimension: CPU's kernel
    with pytest.raises(IndexError):
        torch.argmax(x.to(DEVICE), dim=2)
    with pytest.raises((RuntimeError, IndexError)):
        torch.argmax(torch.empty(0, device=DEVICE))


@needs_avx512
@pytest.mark.parametrize("async_execution", [False, True])
def test_both_engines_and_parity_agree(async_execution):
    x = torch.randn(8, 50257).bfloat16()
    ref = torch.argmax(x, -1)
    with be.flags(async_execution=async_execution):
        assert torch.equal(torch.argmax(x.to(DEVICE), -1).cpu(), ref)
        with be.flags(cpu_parity=True):
            assert torch.equal(torch.argmax(x.to(DEVICE), -1).cpu(), ref)


@needs_avx512
def test_replays_in_a_graph():
    x = torch.randn(2, 999, device=DEVICE)
    g = torch.ember.EmberGraph()
    stream = torch.ember.Stream()
    with torch.ember.stream(stream):
        torch.argmax(x, -1)  # warm-up
        g.capture_begin()
        out = torch.argmax(x, -1)
        g.capture_end()
    x.copy_(torch.randn(2, 999))
    g.replay()
    torch.ember.synchronize()
    assert torch.equal(out.cpu(), torch.argmax(x.cpu(), -1))
