"""ember's default convolution route: oneDNN on a prepacked weight.

Checked against float64 references (the error bound of a dot product of
C*kh*kw terms), with CPU's memory-format rules for the output, pack reuse
and invalidation, training through the packed forward, and the CPU-parity
switch restoring CPU's kernel bit for bit.
"""

import pytest
import torch
import torch.nn.functional as F

import torch_ember  # noqa: F401

DEVICE = "ember"
EPS32 = torch.finfo(torch.float32).eps
be = torch.backends.ember


@pytest.fixture(autouse=True)
def _fresh_packs():
    torch.ember.empty_cache()
    yield
    torch.ember.empty_cache()


def _check(out, x, w, b, **kw):
    ref = F.conv2d(x.double(), w.double(), None if b is None else b.double(), **kw)
    bound = F.conv2d(x.double().abs(), w.double().abs(), None, **kw)
    terms = w.shape[1] * w.shape[2] * w.shape[3]
    bound = terms * EPS32 * bound + 1e-30
    if b is not None:
        bound = bound + EPS32 * b.double().abs().view(1, -1, 1, 1)
    err = (out.cpu().double() - ref).abs()
    assert (err <= bound).all(), f"max err/bound {(err / bound).max().item():.3g}"


# (input N, C, H, W), (out channels, kernel), stride, padding, dilation, groups
CASES = [
    ((1, 3, 32, 32), (16, 7), 2, 3, 1, 1),  # a stem
    ((2, 32, 14, 14), (32, 3), 1, 1, 1, 1),
    ((1, 64, 9, 9), (128, 1), 1, 0, 1, 1),  # 1x1
    ((2, 150, 12, 13), (140, 1), 1, 0, 1, 1),  # re-layout blocks past 128, partial tiles
    ((1, 24, 11, 13), (24, 3), 1, 1, 1, 24),  # depthwise
    ((1, 8, 10, 10), (16, 3), 2, 1, 1, 2),  # grouped, strided
    ((1, 16, 12, 12), (20, 3), 1, 2, 2, 1),  # dilated, odd channel count
    ((3, 17, 5, 7), (5, 2), 1, 0, 1, 1),  # odd sizes, even kernel
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}-g{c[5]}")
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_conv_matches_float64_and_cpu_layout(case, channels_last, bias):
    (n, c, h, w_), (co, k), stride, padding, dilation, groups = case
    torch.manual_seed(sum(case[0]) + co + k)
    x = torch.randn(n, c, h, w_)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(co, c // groups, k, k)
    b = torch.randn(co) if bias else None
    kw = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    cpu = F.conv2d(x, w, b, **kw)
    xe, we = x.to(DEVICE), w.to(DEVICE)
    be_ = None if b is None else b.to(DEVICE)
    outs = [F.conv2d(xe, we, be_, **kw) for _ in range(3)]  # 2nd call packs
    assert be.packed_weights_info()["packs"] == 1
    for out in outs:
        assert out.shape == cpu.shape and out.stride() == cpu.stride()
        _check(out, x, w, b, **kw)
    assert torch.equal(outs[1].cpu(), outs[2].cpu())  # reproducible


def test_weight_write_invalidates_pack():
    conv = torch.nn.Conv2d(8, 8, 3, padding=1).to(DEVICE)
    x = torch.randn(1, 8, 6, 6, device=DEVICE)
    with torch.no_grad():
        conv(x), conv(x)
        assert be.packed_weights_info()["packs"] == 1
        conv.weight.mul_(-1)
        out = conv(x)
        out2 = conv(x)
    ref = F.conv2d(x.cpu(), conv.weight.cpu(), conv.bias.cpu(), padding=1)
    torch.testing.assert_close(out.cpu(), ref)
    torch.testing.assert_close(out2.cpu(), ref)
    info = be.packed_weights_info()
    assert info["invalidations"] == 1 and info["packs"] == 2


def test_pack_counts_in_memory_and_empty_cache_frees_it():
    conv = torch.nn.Conv2d(64, 64, 3).to(DEVICE)
    x = torch.randn(1, 64, 8, 8, device=DEVICE)
    with torch.no_grad():
        conv(x), conv(x)
    packed = torch.ember.memory_stats()["packed_weight_bytes"]
    assert packed >= conv.weight.numel() * 4
    torch.ember.empty_cache()
    assert torch.ember.memory_stats()["packed_weight_bytes"] == 0


def test_training_gradients_through_packed_forward():
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(4, 6, 3, padding=1)
    conv_e = torch.nn.Conv2d(4, 6, 3, padding=1).to(DEVICE)
    conv_e.load_state_dict(conv.state_dict())
    x = torch.randn(2, 4, 7, 7)
    for _ in range(2):  # same weight twice: the second forward is packed
        conv(x).square().sum().backward()
        conv_e(x.to(DEVICE)).square().sum().backward()
    torch.testing.assert_close(conv_e.weight.grad.cpu(), conv.weight.grad)
    torch.testing.assert_close(conv_e.bias.grad.cpu(), conv.bias.grad)


@pytest.mark.cpu_parity
def test_parity_switch_is_bitwise_and_packs_nothing():
    torch.manual_seed(1)
    x, w, b = torch.randn(1, 16, 12, 12), torch.randn(32, 16, 3, 3), torch.randn(32)
    for _ in range(3):
        out = F.conv2d(x.to(DEVICE), w.to(DEVICE), b.to(DEVICE), padding=1)
    assert torch.equal(out.cpu(), F.conv2d(x, w, b, padding=1))
    assert be.packed_weights_info()["packs"] == 0


def test_route_is_observable(capfd):
    conv = torch.nn.Conv2d(8, 8, 3).to(DEVICE)
    x = torch.randn(1, 8, 6, 6, device=DEVICE)
    with torch.no_grad():
        conv(x), conv(x)
        with be.verbose(1):
            conv(x)
    assert "onednn/packed" in capfd.readouterr().err
