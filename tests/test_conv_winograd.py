"""3x3 stride-1 convolutions on Winograd's F(2x2, 3x3) (csrc/ops/kernels/conv/).

The route takes NCHW fp32 convolutions with at least 16 channels in and out,
48 tiles (2x2 output blocks) and a transformed filter of at most 2 Mi floats,
from a weight's second call (its transformed filter is a pack). Checked
against float64 references with a bound a few times direct convolution's
(the transforms add and subtract up to 4 inputs before, and 4 products after,
the sums over channels), for reproducibility on any thread count, the pack's
life (memory stats, writes, empty_cache), autograd, graphs, and the cases it
leaves to oneDNN.
"""

import pytest
import torch
import torch.nn.functional as F
from isa import AVX512
from test_conv_epilogue import _bn

import torch_ember

DEVICE = "ember"
EPS32 = torch.finfo(torch.float32).eps
be = torch.backends.ember

pytestmark = [
    pytest.mark.usefixtures("empty_caches"),
    pytest.mark.skipif(not AVX512, reason="the Winograd kernels need AVX-512F"),
]

# Each of the input transform's 16 values adds up to 4 inputs, each output
# sums 9 of the products: a slack of 16 over direct convolution's bound.
SLACK = 16


def _check(out, x, w, b, padding):
    ref = F.conv2d(x.double(), w.double(), None if b is None else b.double(), padding=padding)
    bound = F.conv2d(x.double().abs(), w.double().abs(), None, padding=padding)
    terms = w.shape[1] * 9
    bound = SLACK * terms * EPS32 * bound + 1e-30
    if b is not None:
        bound = bound + EPS32 * b.double().abs().view(1, -1, 1, 1)
    err = (out.cpu().double() - ref).abs()
    assert (err <= bound).all(), f"max err/bound {(err / bound).max().item():.3g}"


def _routes(capfd, fn):
    with be.verbose(1):
        out = fn()
    return out, capfd.readouterr().err


# (N, C, H, W), out channels, padding
CASES = [
    ((1, 64, 28, 28), 64, 1),  # ResNet-50's layer2 shape, 14 x 14 tiles
    ((1, 16, 16, 16), 16, 1),  # the smallest channel counts
    ((3, 33, 13, 9), 40, 1),  # odd sizes: half tiles at the bottom and right
    ((2, 20, 11, 14), 24, 2),  # padding 2: output larger than the input
    ((1, 24, 20, 20), 17, 0),  # no padding, odd output channels
    ((1, 150, 10, 40), 140, 1),  # 20 tiles a row: a vector and a partial one
]


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_winograd_matches_float64(case, bias, capfd):
    (n, c, h, w_), k, padding = case
    torch.manual_seed(n + c + h + k)
    x, w = torch.randn(n, c, h, w_), torch.randn(k, c, 3, 3)
    b = torch.randn(k) if bias else None
    xe, we = x.to(DEVICE), w.to(DEVICE)
    be_ = None if b is None else b.to(DEVICE)
    F.conv2d(xe, we, be_, padding=padding)  # the weight's first call: no pack yet
    outs, err = _routes(capfd, lambda: [F.conv2d(xe, we, be_, padding=padding) for _ in range(2)])
    assert err.count("winograd") == 2, err
    cpu = F.conv2d(x, w, b, padding=padding)
    for out in outs:
        assert out.shape == cpu.shape and out.stride() == cpu.stride()
        _check(out, x, w, b, padding)
    assert torch.equal(outs[0].cpu(), outs[1].cpu())  # reproducible
    # within PyTorch's float32 conv tolerance of CPU's result
    torch.testing.assert_close(outs[0].cpu(), cpu, rtol=1.3e-6, atol=1e-5 * cpu.abs().max().item())


def test_images_in_several_groups():
    """Batch 8 of ResNet's 56x56 layer needs 1.6 Mi floats of scratch per
    image: the images go through in groups of one."""
    torch.manual_seed(5)
    x, w, b = torch.randn(8, 64, 56, 56), torch.randn(64, 64, 3, 3), torch.randn(64)
    xe, we, be_ = x.to(DEVICE), w.to(DEVICE), b.to(DEVICE)
    for _ in range(2):
        out = F.conv2d(xe, we, be_, padding=1)
    _check(out, x, w, b, 1)
    assert torch.equal(out[3:4].cpu(), F.conv2d(xe[3:4], we, be_, padding=1).cpu())


def test_same_bits_on_any_thread_count():
    torch.manual_seed(6)
    x = torch.randn(2, 48, 18, 18, device=DEVICE)
    w = torch.randn(56, 48, 3, 3, device=DEVICE)
    F.conv2d(x, w, padding=1)
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            results.append(F.conv2d(x, w, padding=1).cpu())
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(results[0], r) for r in results[1:])


def test_the_transformed_filter_is_a_pack():
    conv = torch.nn.Conv2d(32, 32, 3, padding=1).to(DEVICE)
    x = torch.randn(1, 32, 16, 16, device=DEVICE)
    with torch.no_grad():
        conv(x), conv(x)
        info = be.packed_weights_info()
        assert info["packs"] == 1
        # 16 floats per 3x3 filter
        assert (
            torch.ember.memory_stats()["packed_weight_bytes"] == conv.weight.numel() * 4 * 16 // 9
        )
        conv.weight.mul_(-1)  # invalidates it: the next calls see the new weight
        out = conv(x)
        out2 = conv(x)
    ref = F.conv2d(x.cpu(), conv.weight.cpu(), conv.bias.cpu(), padding=1)
    torch.testing.assert_close(out.cpu(), ref)
    torch.testing.assert_close(out2.cpu(), ref)
    assert be.packed_weights_info()["invalidations"] == 1
    torch.ember.empty_cache()
    assert torch.ember.memory_stats()["packed_weight_bytes"] == 0


def test_training_through_the_winograd_forward():
    torch.manual_seed(7)
    conv = torch.nn.Conv2d(16, 24, 3, padding=1)
    conv_e = torch.nn.Conv2d(16, 24, 3, padding=1).to(DEVICE)
    conv_e.load_state_dict(conv.state_dict())
    x = torch.randn(2, 16, 12, 12)
    for _ in range(2):  # the second forward takes the route
        conv(x).square().sum().backward()
        conv_e(x.to(DEVICE)).square().sum().backward()
    close = {"rtol": 1e-4, "atol": 1e-4}
    torch.testing.assert_close(conv_e.weight.grad.cpu(), conv.weight.grad, **close)
    torch.testing.assert_close(conv_e.bias.grad.cpu(), conv.bias.grad, **close)


def test_a_graph_replays_the_route_and_sees_weight_writes():
    torch.manual_seed(8)
    conv = torch.nn.Conv2d(32, 32, 3, padding=1).to(DEVICE).eval()
    x = torch.randn(1, 32, 16, 16, device=DEVICE)
    with torch.inference_mode():
        conv(x), conv(x)
        graph = torch.ember.EmberGraph()
        with torch.ember.graph(graph):
            out = conv(x)
        captured = out.clone()
        x.mul_(0.5)
        graph.replay()
        assert torch.equal(out.cpu(), conv(x).cpu())  # the replay is the route's bits
        x.mul_(2)
        graph.replay()
        assert torch.equal(out.cpu(), captured.cpu())
        conv.weight.mul_(-1)
        graph.replay()
    ref = F.conv2d(x.cpu(), conv.weight.cpu(), conv.bias.cpu(), padding=1)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)


LEFT_TO_ONEDNN = [
    pytest.param((1, 32, 16, 16), 32, {"padding": 1, "stride": 2}, id="strided"),
    pytest.param((1, 32, 16, 16), 32, {"padding": 2, "dilation": 2}, id="dilated"),
    pytest.param((1, 32, 16, 16), 32, {"padding": 1, "groups": 2}, id="grouped"),
    pytest.param((1, 8, 16, 16), 32, {"padding": 1}, id="8-channels"),
    pytest.param((1, 256, 7, 7), 256, {"padding": 1}, id="16-tiles"),
    pytest.param((1, 512, 14, 14), 512, {"padding": 1}, id="512x512-filter"),
]


@pytest.mark.parametrize("shape,k,kw", LEFT_TO_ONEDNN)
def test_other_convolutions_keep_the_onednn_route(shape, k, kw, capfd):
    torch.manual_seed(9)
    groups = kw.get("groups", 1)
    x = torch.randn(*shape, device=DEVICE)
    w = torch.randn(k, shape[1] // groups, 3, 3, device=DEVICE)
    F.conv2d(x, w, **kw)
    _, err = _routes(capfd, lambda: F.conv2d(x, w, **kw))
    assert "winograd" not in err and "onednn/packed" in err, err


def test_channels_last_and_cpu_parity_keep_their_routes(capfd):
    x = torch.randn(1, 32, 16, 16, device=DEVICE)
    w = torch.randn(32, 32, 3, 3, device=DEVICE)
    F.conv2d(x, w, padding=1)
    xl = x.contiguous(memory_format=torch.channels_last)
    out, err = _routes(capfd, lambda: F.conv2d(xl, w, padding=1))
    assert "winograd" not in err and out.is_contiguous(memory_format=torch.channels_last)
    with be.flags(cpu_parity=True):
        out, err = _routes(capfd, lambda: F.conv2d(x, w, padding=1))
    assert "winograd" not in err
    assert torch.equal(out.cpu(), F.conv2d(x.cpu(), w.cpu(), padding=1))


class BasicBlock(torch.nn.Module):
    """ResNet's basic block: 3x3 conv-bn-relu, 3x3 conv-bn, += input, relu."""

    def __init__(self, channels):
        super().__init__()
        torch.manual_seed(channels)
        self.conv1 = torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = _bn(channels, 1)
        self.conv2 = torch.nn.Conv2d(channels, channels, 3, padding=1, bias=True)
        self.bn2 = _bn(channels, 2)
        self.relu = torch.nn.ReLU()

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += x
        return self.relu(out)


@pytest.mark.parametrize("shape", [(1, 32, 28, 28), (3, 24, 13, 9)], ids=str)
def test_batch_norm_add_and_relu_join_a_held_winograd_convolution(shape, held_work):
    """With held work on (asynchronous execution, fuse_elementwise), the ops
    after a Winograd convolution join it as steps on each output row: the
    bits of the ops run one by one, whichever way the images are grouped."""
    block = BasicBlock(shape[1]).eval()
    ember_block = BasicBlock(shape[1]).eval().to(DEVICE)
    ember_block.load_state_dict(block.state_dict())
    x = torch.randn(shape)
    xe = x.to(DEVICE)
    with torch.inference_mode():
        ember_block(xe).cpu()  # the weights' first calls: no transformed filter yet
        torch_ember.reset_chain_stats()
        out = ember_block(xe).cpu()
        stats = torch_ember.chain_stats()
        # conv1 [bn, relu], conv2 [bn, +=, relu]; written: conv1's relu and the output
        assert (stats["convolutions"], stats["epilogue_steps"]) == (2, 5)
        assert stats["epilogue_written"] == 2
        with be.flags(fuse_elementwise=False):
            unfused = ember_block(xe).cpu()
    assert torch.equal(out, unfused)
    torch.testing.assert_close(out, block(x), rtol=1e-4, atol=1e-4)
