"""ember's max_pool2d kernel (ops/kernels/pooling/): values and indices equal
CPU's bit for bit (the max is exact and the first maximum's index wins),
across kernel sizes, strides, padding, dilation, ceil_mode, NaN and -inf
windows; backward through the indices; CPU's errors for invalid arguments."""

import pytest
import torch
import torch.nn.functional as F
from isa import VECTOR_KERNELS

import torch_ember  # noqa: F401

DEVICE = "ember"
be = torch.backends.ember

CASES = [
    # (N, C, H, W), kernel, stride, padding, dilation, ceil_mode
    ((1, 64, 112, 112), 3, 2, 1, 1, False),  # ResNet's stem pool
    ((2, 3, 17, 23), 3, 2, 1, 1, True),
    ((1, 5, 9, 40), (2, 3), (1, 2), (1, 0), 1, False),
    ((1, 4, 15, 15), 3, 1, 1, 2, False),
    ((3, 7, 8), 2, None, 0, 1, False),  # 3-D input, default stride
    ((1, 2, 33, 5), 5, 3, 2, 1, True),
    ((1, 3, 20, 150), 3, 1, 1, 1, False),  # loaded taps, 3 blocks of 64 columns
    ((1, 2, 12, 141), 3, 2, 1, 1, True),  # loaded stride-2 taps past 64 columns
    ((1, 2, 12, 70), (2, 9), 1, (1, 4), 1, False),  # a window too wide to load: gathers
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-k{c[1]}-s{c[2]}")
def test_values_and_indices_equal_cpu(case):
    shape, k, s, p, d, ceil = case
    x = torch.randn(shape, generator=torch.Generator().manual_seed(len(shape)))
    x.view(-1)[::7] = x.view(-1)[::7].round()  # ties: the first maximum wins
    kw = {"stride": s, "padding": p, "dilation": d, "ceil_mode": ceil, "return_indices": True}
    out, idx = F.max_pool2d(x, k, **kw)
    out_e, idx_e = F.max_pool2d(x.to(DEVICE), k, **kw)
    assert torch.equal(out_e.cpu(), out) and torch.equal(idx_e.cpu(), idx)


def test_nan_and_all_minus_inf_windows_equal_cpu():
    x = torch.randn(1, 2, 10, 10)
    x[0, 0, 2:5, 2:5] = float("-inf")
    x[0, 1, 3, 4] = float("nan")
    x[0, 1, 6, 6] = float("nan")
    x[0, 1, 6, 7] = 100.0
    out, idx = F.max_pool2d(x, 3, 2, 1, return_indices=True)
    out_e, idx_e = F.max_pool2d(x.to(DEVICE), 3, 2, 1, return_indices=True)
    torch.testing.assert_close(out_e.cpu(), out, equal_nan=True, rtol=0, atol=0)
    assert torch.equal(idx_e.cpu(), idx)


def test_backward_and_route(capfd):
    x = torch.randn(2, 3, 12, 12, requires_grad=True)
    xe = x.detach().to(DEVICE).requires_grad_()
    F.max_pool2d(x, 3, 2, 1).sum().backward()
    with be.verbose(1):
        F.max_pool2d(xe, 3, 2, 1).sum().backward()
    assert torch.equal(xe.grad.cpu(), x.grad)
    if VECTOR_KERNELS:
        assert "ember/max_pool2d" in capfd.readouterr().err


def test_invalid_arguments_raise_cpus_errors():
    xe = torch.randn(1, 1, 4, 4, device=DEVICE)
    with pytest.raises(RuntimeError, match="pad should be at most half"):
        F.max_pool2d(xe, 2, 1, 2)
    with pytest.raises(RuntimeError):
        F.max_pool2d(xe, 0)


def test_channels_last_and_strided_inputs_take_cpus_kernel():
    x = torch.randn(1, 8, 9, 9).contiguous(memory_format=torch.channels_last)
    out = F.max_pool2d(x.to(DEVICE), 3, 2)
    assert out.stride() == F.max_pool2d(x, 3, 2).stride()
    y = torch.randn(1, 2, 10, 20)[..., ::2]
    assert torch.equal(F.max_pool2d(y.to(DEVICE), 2).cpu(), F.max_pool2d(y, 2))
