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


def _round_to_bf16(x32):
    """fp32 -> bf16 bits rounded to nearest even, as float64 (a reference)."""
    return x32.bfloat16().double()


def test_bf16_tanh_is_the_fp32_kernel_rounded_once(capfd):
    """bf16 tanh runs ember's fp32 kernel on the exact fp32 values and rounds
    once to the nearest bf16: bitwise the fp32 kernel's result rounded, and
    within one bf16 rounding of float64 (CPU's bf16 kernel rounds the same
    way from SLEEF's fp32 tanh)."""
    if not be.capabilities()["avx512f"]:
        pytest.skip("ember's vector kernels need AVX-512F")
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


def test_bf16_tanh_launched_equals_the_call_and_parity_is_cpus():
    x = torch.randn(3, 3072).bfloat16()
    xe = x.to(DEVICE)
    with be.flags(async_execution=False):
        at_call = torch.tanh(xe).cpu()
    with be.flags(async_execution=True):
        launched = torch.tanh(xe).cpu()
    assert torch.equal(at_call, launched)
    with be.flags(cpu_parity=True):
        assert torch.equal(torch.tanh(xe).cpu(), torch.tanh(x))
