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


pytestmark = pytest.mark.usefixtures("empty_caches")


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
    ((2, 150, 10, 11), (140, 3), 1, 1, 1, 1),  # re-layout blocks past 128, partial tiles
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
    # NCHW convolutions of 16 output pixels or more take the channel GEMM
    # (below) when 1x1 and unpadded: no pack.
    pixels = cpu.shape[2] * cpu.shape[3]
    channel_gemm = groups == 1 and not channels_last and pixels >= 16
    channel_gemm = channel_gemm and k == 1 and padding == 0
    cpu_path = c < 4  # an image of 1-3 channels: CPU's first-layer kernel
    assert be.packed_weights_info()["packs"] == (0 if channel_gemm or cpu_path else 1)
    for out in outs:
        assert out.shape == cpu.shape and out.stride() == cpu.stride()
        _check(out, x, w, b, **kw)
    assert torch.equal(outs[1].cpu(), outs[2].cpu())  # reproducible


def test_weight_write_invalidates_pack():
    # 10 x 10 outputs: above the gathered channel GEMM's 64 pixels.
    conv = torch.nn.Conv2d(8, 8, 3, padding=1).to(DEVICE)
    x = torch.randn(1, 8, 10, 10, device=DEVICE)
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


def test_a_pack_serves_only_the_thread_count_it_was_made_for():
    # oneDNN plans a primitive's work for the threads of the process when the
    # weight is reordered: a pack made on 1 thread and run on 2 (or the other
    # way) ran 2.5-5x the time on Zen 3 (128 channels, 28 x 28, 3 x 3).
    conv = torch.nn.Conv2d(16, 16, 3, padding=1).to(DEVICE)
    x = torch.randn(1, 16, 10, 10, device=DEVICE)
    ref = F.conv2d(x.cpu(), conv.weight.cpu(), conv.bias.cpu(), padding=1)
    before = torch.get_num_threads()
    outs = []
    try:
        with torch.no_grad():
            for threads, packs in ((1, 1), (2, 2), (1, 2), (2, 2)):
                torch.set_num_threads(threads)
                outs += [conv(x), conv(x)]
                assert be.packed_weights_info()["packs"] == packs
    finally:
        torch.set_num_threads(before)
    for out in outs:
        torch.testing.assert_close(out.cpu(), ref)
    assert be.packed_weights_info()["invalidations"] == 0


def test_pack_counts_in_memory_and_empty_cache_frees_it():
    conv = torch.nn.Conv2d(64, 64, 3).to(DEVICE)
    x = torch.randn(1, 64, 12, 12, device=DEVICE)
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


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_images_of_under_four_channels_take_cpus_path(channels, capfd):
    """A first layer (RGB: ResNet's 7x7 stem, ViT's patch embedding) runs
    CPU's convolution, bit for bit, with no pack: the packed route would pad
    its channels to oneDNN's blocks. Four channels take the packed route."""
    torch.manual_seed(channels)
    x, w, b = torch.randn(1, channels, 40, 40), torch.randn(16, channels, 7, 7), torch.randn(16)
    xe, we, be_ = x.to(DEVICE), w.to(DEVICE), b.to(DEVICE)
    with torch.no_grad():
        F.conv2d(xe, we, be_, stride=2, padding=3)
        with be.verbose(1):
            out = F.conv2d(xe, we, be_, stride=2, padding=3)
    err = capfd.readouterr().err
    if channels < 4:
        assert be.packed_weights_info()["packs"] == 0 and "onednn/packed" not in err
        assert torch.equal(out.cpu(), F.conv2d(x, w, b, stride=2, padding=3))
    else:
        assert be.packed_weights_info()["packs"] == 1 and "onednn/packed" in err
        _check(out, x, w, b, stride=2, padding=3)


def test_route_is_observable(capfd):
    conv = torch.nn.Conv2d(8, 8, 3).to(DEVICE)
    x = torch.randn(1, 8, 12, 12, device=DEVICE)
    with torch.no_grad():
        conv(x), conv(x)
        with be.verbose(1):
            conv(x)
    assert "onednn/packed" in capfd.readouterr().err


# 1x1 unpadded convolutions of NCHW images with at least 16 output pixels
# run as ember's channel GEMM (out = W @ x per image on the NCHW layout, no
# pack); a strided one on the pixels it reads, gathered image by image.
POINTWISE_CASES = [
    ((1, 64, 16, 16), 256, 1),  # full 8-row x 48-column blocks
    ((2, 37, 20, 19), 13, 1),  # row and column tails, two images
    ((1, 5, 8, 16), 70, 1),  # 128 pixels, K below a register's width
    ((3, 300, 16, 17), 9, 1),  # long K, few rows: the rows split across threads
    ((2, 37, 7, 7), 19, 1),  # 49 pixels: 3 panels + 1 dot-product column, odd K
    ((1, 300, 14, 14), 12, 1),  # 196 pixels: 12 panels + 4 dot-product columns
    ((1, 16, 4, 5), 33, 1),  # 20 pixels: 1 panel + 4 dot-product columns
    ((1, 64, 16, 16), 128, 2),  # a downsampling shortcut: 8 x 8 pixels
    ((2, 37, 15, 13), 19, 2),  # odd sizes: the last row and column are read
    ((1, 8, 6, 33), 24, 2),  # rows of 17 gathered pixels: a vector group + 1
    ((1, 8, 5, 80), 16, 2),  # rows of 40: two vector groups + 8
    ((2, 16, 33, 35), 24, 3),
    ((3, 8, 40, 9), 5, (2, 1)),  # strides differ per dimension
    ((1, 64, 7, 7), 16, 2),  # 16 pixels: the smallest that runs here
]


@pytest.mark.parametrize("case", POINTWISE_CASES, ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_pointwise_conv_runs_as_a_channel_gemm_on_the_nchw_layout(case, bias, capfd):
    (n, c, h, w_), co, stride = case
    torch.manual_seed(n * c + co)
    x, w = torch.randn(n, c, h, w_), torch.randn(co, c, 1, 1)
    b = torch.randn(co) if bias else None
    cpu = F.conv2d(x, w, b, stride=stride)
    xe, we = x.to(DEVICE), w.to(DEVICE)
    be_ = None if b is None else b.to(DEVICE)
    with be.verbose(1):
        outs = [F.conv2d(xe, we, be_, stride=stride) for _ in range(3)]
    err = capfd.readouterr().err
    assert cpu.shape[2] * cpu.shape[3] >= 16
    assert "channel-gemm" in err and "onednn" not in err
    assert be.packed_weights_info()["packs"] == 0  # the weight is read as it is
    for out in outs:
        assert out.shape == cpu.shape and out.stride() == cpu.stride()
        _check(out, x, w, b, stride=stride)
    assert torch.equal(outs[0].cpu(), outs[2].cpu())


# Other windows take oneDNN's pack whatever their size, the small outputs of
# ResNet's 3x3 layers on 7x7 images included (they ran as the channel GEMM
# on im2col columns until oneDNN measured faster).
SMALL_WINDOW_CASES = [
    ((1, 64, 7, 7), (32, 3, 3), {"padding": 1}),  # ResNet's last stage, narrower
    ((2, 48, 14, 14), (40, 3, 3), {"padding": 1, "stride": 2}),  # into 7 x 7
    ((1, 5, 9, 8), (7, 2, 3), {"padding": (1, 0), "stride": (1, 2), "dilation": (2, 1)}),
    ((1, 16, 6, 6), (8, 1, 1), {"padding": 1}),  # a padded 1x1: 8 x 8 pixels
]


@pytest.mark.parametrize("case", SMALL_WINDOW_CASES, ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_small_outputs_of_other_windows_run_on_the_onednn_pack(case, bias, capfd):
    (n, c, h, w_), (co, kh, kw_), kw = case
    torch.manual_seed(n * c + co + kh)
    x, w = torch.randn(n, c, h, w_), torch.randn(co, c, kh, kw_)
    b = torch.randn(co) if bias else None
    cpu = F.conv2d(x, w, b, **kw)
    assert 16 <= cpu.shape[2] * cpu.shape[3] <= 64
    xe, we = x.to(DEVICE), w.to(DEVICE)
    be_ = None if b is None else b.to(DEVICE)
    with be.verbose(1):
        outs = [F.conv2d(xe, we, be_, **kw) for _ in range(3)]
    err = capfd.readouterr().err
    assert "channel-gemm" not in err and "onednn/packed" in err
    assert be.packed_weights_info()["packs"] == 1
    for out in outs:
        assert out.shape == cpu.shape and out.stride() == cpu.stride()
        _check(out, x, w, b, **kw)
    assert torch.equal(outs[1].cpu(), outs[2].cpu())


def test_a_strided_pointwise_conv_below_16_output_pixels_stays_on_onednn(capfd):
    x, w = torch.randn(1, 64, 6, 6), torch.randn(32, 64, 1, 1)
    xe, we = x.to(DEVICE), w.to(DEVICE)
    with be.verbose(1):
        outs = [F.conv2d(xe, we, stride=2) for _ in range(3)]  # 3 x 3 pixels
    assert "channel-gemm" not in capfd.readouterr().err
    assert be.packed_weights_info()["packs"] == 1
    _check(outs[2], x, w, None, stride=2)


# Images whose last pixel group is a lone panel (ResNet's 28x28), a
# dot-product tail (7x7, 14x14), several images, row counts that are
# not whole blocks: threads split the work by cost, so their runs start
# inside groups and inside an image's rows.
@pytest.mark.parametrize(
    "images,channels,out_channels,size",
    [(1, 96, 40, 20), (1, 96, 40, 7), (1, 64, 44, 28), (3, 48, 20, 14), (2, 32, 8, 9)],
)
def test_channel_gemm_is_bitwise_the_same_on_any_thread_count(
    images, channels, out_channels, size, capfd
):
    torch.manual_seed(3)
    x = torch.randn(images, channels, size, size)
    w = torch.randn(out_channels, channels, 1, 1)
    b = torch.randn(out_channels)
    xe, we, be_ = x.to(DEVICE), w.to(DEVICE), b.to(DEVICE)
    before = torch.get_num_threads()
    shape = (images, out_channels, size, size)
    try:
        results = []
        with be.verbose(1):
            for threads in (1, 2, 3, 4):
                torch.set_num_threads(threads)
                # The result's block from the allocator holds NaN, not the
                # last call's values: an output no thread writes shows.
                torch.full(shape, float("nan"), device=DEVICE)
                results.append(F.conv2d(xe, we, be_).cpu())
    finally:
        torch.set_num_threads(before)
    assert "channel-gemm" in capfd.readouterr().err
    assert all(torch.equal(results[0], r) for r in results[1:])
    _check(results[0].to(DEVICE), x, w, b)


def test_channel_gemm_sees_weight_writes_and_trains():
    torch.manual_seed(4)
    conv = torch.nn.Conv2d(24, 32, 1)
    conv_e = torch.nn.Conv2d(24, 32, 1).to(DEVICE)
    conv_e.load_state_dict(conv.state_dict())
    x = torch.randn(2, 24, 16, 16)
    for _ in range(2):
        conv(x).square().sum().backward()
        conv_e(x.to(DEVICE)).square().sum().backward()
    # The forward's sums run in another order than oneDNN's: fp32 rounding.
    close = {"rtol": 1e-4, "atol": 1e-4}
    torch.testing.assert_close(conv_e.weight.grad.cpu(), conv.weight.grad, **close)
    torch.testing.assert_close(conv_e.bias.grad.cpu(), conv.bias.grad, **close)
    with torch.no_grad():
        conv.weight.mul_(-2)
        conv_e.weight.mul_(-2)
        torch.testing.assert_close(conv_e(x.to(DEVICE)).cpu(), conv(x), **close)


@pytest.mark.parametrize(
    "layout",
    ["channels_last_input", "strided_input", "padded", "small_image"],
)
def test_other_pointwise_convs_keep_the_onednn_route(layout, capfd):
    torch.manual_seed(5)
    x, w, kw = torch.randn(1, 32, 16, 16), torch.randn(48, 32, 1, 1), {}
    xe = None
    if layout == "channels_last_input":
        x = x.contiguous(memory_format=torch.channels_last)
    elif layout == "strided_input":
        wide = torch.randn(1, 32, 16, 32)
        x, xe = wide[..., ::2], wide.to(DEVICE)[..., ::2]
    elif layout == "padded":
        kw = {"padding": 1}
    else:
        x = torch.randn(1, 32, 3, 5)  # 15 pixels
    cpu = F.conv2d(x, w, **kw)
    xe = x.to(DEVICE) if xe is None else xe
    we = w.to(DEVICE)
    with be.verbose(1):
        out = [F.conv2d(xe, we, **kw) for _ in range(2)][-1]
    assert "channel-gemm" not in capfd.readouterr().err
    assert out.stride() == cpu.stride()
    _check(out, x, w, None, **kw)


# Invalid windows raise CPU's errors on every route (the channel GEMM's
# 1x1 and small-output routes, oneDNN's), and the process goes on.
@pytest.mark.parametrize("kernel", [1, 3])
@pytest.mark.parametrize(
    "bad",
    [
        {"stride": 0},
        {"stride": (1, 0)},
        {"padding": -1},
        {"dilation": 0},
        {"dilation": (1, 9)},  # the dilated window is wider than the image
    ],
    ids=str,
)
def test_invalid_windows_raise_cpus_errors(kernel, bad):
    x, w = torch.randn(1, 4, 8, 8), torch.randn(6, 4, kernel, kernel)
    if kernel == 1 and "dilation" in bad and bad["dilation"] != 0:
        w = torch.randn(6, 4, 1, 2)  # a 1x1 window never exceeds the image
    with pytest.raises(RuntimeError) as cpu_error:
        F.conv2d(x, w, **bad)
    xe, we = x.to(DEVICE), w.to(DEVICE)
    for _ in range(2):  # the second call would find a pack
        with pytest.raises(RuntimeError) as ember_error:
            F.conv2d(xe, we, **bad)
        assert str(ember_error.value) == str(cpu_error.value)
    _check(F.conv2d(xe, we), x, w, None)
