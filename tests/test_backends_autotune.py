"""torch.backends.ember.benchmark: conv and matmul time their algorithms once
per signature and reuse the fastest; the cache is bounded and cleared by
torch.ember.empty_cache()."""

import pytest
import torch
import torch.nn.functional as F
from isa import ONEDNN_MATMUL

DEVICE = "ember"
be = torch.backends.ember


pytestmark = pytest.mark.usefixtures("empty_caches")


def _conv_args(seed=0, channels=8, size=10):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, channels, size, size, generator=g)
    w = torch.randn(4, channels, 3, 3, generator=g)
    b = torch.randn(4, generator=g)
    return x, w, b


def test_off_by_default_and_nothing_cached():
    assert be.benchmark is False
    x, w, b = _conv_args()
    F.conv2d(x.to(DEVICE), w.to(DEVICE), b.to(DEVICE))
    torch.randn(16, 16, device=DEVICE) @ torch.randn(16, 16, device=DEVICE)
    assert be.benchmark_cache_info()["entries"] == 0


def test_conv_and_matmul_are_tuned_once_per_signature():
    be.benchmark = True
    x, w, b = _conv_args()
    out = F.conv2d(x.to(DEVICE), w.to(DEVICE), b.to(DEVICE), padding=1)
    assert torch.allclose(out.cpu(), F.conv2d(x, w, b, padding=1), atol=1e-5)
    a, m = torch.randn(32, 48), torch.randn(48, 24)
    assert torch.allclose((a.to(DEVICE) @ m.to(DEVICE)).cpu(), a @ m, atol=1e-5)
    info = be.benchmark_cache_info()
    assert info["entries"] == 2
    by_op = {c["op"]: c for c in info["choices"]}
    assert set(by_op) == {"convolution", "mm"}
    assert set(by_op["convolution"]["timings_us"]) == {"onednn", "im2col"}
    # ember's own library where the CPU has no oneDNN matmul
    assert set(by_op["mm"]["timings_us"]) == {"mkl", "onednn" if ONEDNN_MATMUL else "panels"}
    for choice in info["choices"]:
        # The chosen algorithm is the fastest one measured.
        timings = choice["timings_us"]
        assert choice["algorithm"] == min(timings, key=timings.get)
        assert all(t > 0 for t in timings.values())
    # Same signatures again: served from the cache, no new entry.
    F.conv2d(x.to(DEVICE), w.to(DEVICE), b.to(DEVICE), padding=1)
    a.to(DEVICE) @ m.to(DEVICE)
    assert be.benchmark_cache_info()["entries"] == 2
    # A new shape is a new signature.
    a[:16].to(DEVICE) @ m.to(DEVICE)
    assert be.benchmark_cache_info()["entries"] == 3


def test_tuned_addmm_accumulates_exactly_once():
    be.benchmark = True
    g = torch.Generator().manual_seed(1)
    s, a, m = (
        torch.randn(8, 6, generator=g),
        torch.randn(8, 5, generator=g),
        torch.randn(5, 6, generator=g),
    )
    expected = torch.addmm(s, a, m, beta=0.75, alpha=-2.0)
    out_e = torch.empty(8, 6, device=DEVICE)
    torch.addmm(s.to(DEVICE), a.to(DEVICE), m.to(DEVICE), beta=0.75, alpha=-2.0, out=out_e)
    assert torch.allclose(out_e.cpu(), expected, atol=1e-5)


def test_limit_bounds_the_cache_and_evicts_the_oldest():
    be.benchmark = True
    be.benchmark_limit = 2
    for rows in (3, 4, 5):
        # a fresh B each time: a B used again would run packed, untuned
        torch.randn(rows, 8, device=DEVICE) @ torch.randn(8, 8, device=DEVICE)
    info = be.benchmark_cache_info()
    assert info["entries"] == 2 and info["limit"] == 2
    signatures = " ".join(c["signature"] for c in info["choices"])
    assert "[3, 8]" not in signatures and "[5, 8]" in signatures


def test_empty_cache_frees_the_tuning_cache():
    be.benchmark = True
    torch.randn(4, 4, device=DEVICE) @ torch.randn(4, 4, device=DEVICE)
    assert be.benchmark_cache_info()["entries"] == 1
    torch.ember.empty_cache()
    assert be.benchmark_cache_info()["entries"] == 0


def test_grouped_and_dilated_convolutions_under_benchmark():
    be.benchmark = True
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 6, 12, 12, generator=g)
    w_grouped = torch.randn(6, 2, 3, 3, generator=g)
    out = F.conv2d(x.to(DEVICE), w_grouped.to(DEVICE), groups=3)
    assert torch.allclose(out.cpu(), F.conv2d(x, w_grouped, groups=3), atol=1e-5)
    w = torch.randn(4, 6, 3, 3, generator=g)
    out = F.conv2d(x.to(DEVICE), w.to(DEVICE), dilation=2, stride=2)
    assert torch.allclose(out.cpu(), F.conv2d(x, w, dilation=2, stride=2), atol=1e-5)
    # Backward runs through CPU's convolution_backward, unaffected.
    xe = x.to(DEVICE).requires_grad_()
    F.conv2d(xe, w.to(DEVICE), dilation=2).sum().backward()
    xc = x.clone().requires_grad_()
    F.conv2d(xc, w, dilation=2).sum().backward()
    assert torch.allclose(xe.grad.cpu(), xc.grad, atol=1e-5)


def test_bad_limits_are_rejected():
    with pytest.raises(ValueError, match=r"in \[0, 2\*\*63 - 1\].*got -1"):
        be.benchmark_limit = -1
    with pytest.raises(ValueError, match="True or False"):
        be.benchmark = "yes"
    assert be.benchmark is False
