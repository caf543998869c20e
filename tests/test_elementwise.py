"""ember's own elementwise kernels (ops/kernels/elementwise/): accuracy
against float64, special values, layouts, and the CPU-parity switch."""

import pytest
import torch

import torch_ember  # noqa: F401

DEVICE = "ember"
EPS32 = torch.finfo(torch.float32).eps
be = torch.backends.ember


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
def test_tanh_layouts_match_cpu(make):
    x = make()
    out = torch.tanh(x.to(DEVICE))
    ref = torch.tanh(x)
    assert out.shape == ref.shape and out.stride() == ref.stride()
    torch.testing.assert_close(out.cpu(), ref)


def test_tanh_autograd_and_reproducible():
    x = torch.randn(1000, requires_grad=True)
    xe = x.detach().to(DEVICE).requires_grad_()
    torch.tanh(x).sum().backward()
    torch.tanh(xe).sum().backward()
    torch.testing.assert_close(xe.grad.cpu(), x.grad)
    assert torch.equal(torch.tanh(xe).cpu(), torch.tanh(xe).cpu())


@pytest.mark.cpu_parity
def test_tanh_parity_is_bitwise():
    x = torch.randn(10_000) * 4
    assert torch.equal(torch.tanh(x.to(DEVICE)).cpu(), torch.tanh(x))


def test_tanh_route_is_ember_kernel(capfd):
    if not be.capabilities()["avx512f"]:
        pytest.skip("ember's vector kernels need AVX-512F")
    x = torch.randn(64, device=DEVICE)
    with be.verbose(1):
        torch.tanh(x)
    assert "ember/tanh" in capfd.readouterr().err
