"""Convolution epilogues (ops/kernels/ConvEpilogue.h): a 1x1 convolution
held on its stream takes the inference batch norm, residual add and ReLU
that follow it as steps applied to each output block in cache. Results must
be the bits of the ops run one by one, every way the host can observe them
(intermediates kept or dropped, in-place adds, strided and batched images).
Other windows on oneDNN's packed route hold too (their steps run as the
result is re-laid to NCHW); 3x3 convolutions on the Winograd route hold the
same way: test_conv_winograd.py."""

import pytest
import torch
from isa import VECTOR_KERNELS

import torch_ember

be = torch.backends.ember

pytestmark = [
    pytest.mark.usefixtures("held_work"),
    pytest.mark.skipif(
        not VECTOR_KERNELS,
        reason="ember's batch-norm kernel and the epilogues need AVX-512F or AVX2",
    ),
]


def _stats():
    s = torch_ember.chain_stats()
    return s["convolutions"], s["epilogue_steps"], s["epilogue_written"]


def _bn(channels, seed):
    g = torch.Generator().manual_seed(seed)
    bn = torch.nn.BatchNorm2d(channels).eval()
    with torch.no_grad():
        bn.weight.copy_(torch.rand(channels, generator=g) + 0.5)
        bn.bias.copy_(torch.randn(channels, generator=g))
        bn.running_mean.copy_(torch.randn(channels, generator=g))
        bn.running_var.copy_(torch.rand(channels, generator=g) + 0.1)
    return bn


class Bottleneck(torch.nn.Module):
    """ResNet's bottleneck with 1x1 convolutions only (the ones that hold),
    as transformers' ResNet runs it: conv-bn-relu, conv-bn, then the
    shortcut (the input, or conv-bn), ``+=``, relu."""

    def __init__(self, channels, hidden, stride=1, conv_shortcut=False, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.conv1 = torch.nn.Conv2d(channels, hidden, 1, bias=False)
        self.bn1 = _bn(hidden, seed + 1)
        self.conv2 = torch.nn.Conv2d(hidden, channels, 1, stride=stride, bias=False)
        self.bn2 = _bn(channels, seed + 2)
        self.shortcut = None
        if conv_shortcut:
            self.shortcut = torch.nn.Sequential(
                torch.nn.Conv2d(channels, channels, 1, stride=stride, bias=False),
                _bn(channels, seed + 3),
            )
        self.relu = torch.nn.ReLU()

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += x if self.shortcut is None else self.shortcut(x)
        return self.relu(out)


def _unfused(fn, *args):
    with be.flags(fuse_elementwise=False):
        out = fn(*args)
        return out.cpu()


@pytest.mark.parametrize(
    "shape,stride,conv_shortcut,expected",
    [
        # identity shortcut: conv1 [bn, relu], conv2 [bn, +=, relu]; written:
        # conv1's relu (conv2's input) and the block's output
        ((1, 64, 56, 56), 1, False, (2, 5, 2)),
        ((2, 32, 14, 14), 1, False, (2, 5, 2)),
        ((1, 64, 7, 7), 1, False, (2, 5, 2)),  # 49 pixels: the dot-product tail
        # conv shortcut: conv1 [bn, relu], conv2 [bn], shortcut [bn]; the add
        # and the last relu follow the shortcut's batch norm, not conv2's
        ((1, 48, 28, 28), 2, True, (3, 4, 3)),
    ],
    ids=["56x56", "batch2-14x14", "7x7-dot-tail", "stride2-conv-shortcut"],
)
def test_a_bottleneck_gives_the_unfused_bits(shape, stride, conv_shortcut, expected):
    block = Bottleneck(shape[1], 32, stride=stride, conv_shortcut=conv_shortcut).eval()
    x = torch.randn(shape)
    ember_block = Bottleneck(shape[1], 32, stride=stride, conv_shortcut=conv_shortcut)
    ember_block = ember_block.eval().to("ember")
    ember_block.load_state_dict(block.state_dict())
    xe = x.to("ember")
    with torch.inference_mode():
        out = ember_block(xe).cpu()
        assert _stats() == expected
        assert torch.equal(out, _unfused(ember_block, xe))
        torch.testing.assert_close(out, block(x), rtol=1e-4, atol=1e-4)


def test_kept_intermediates_are_written_with_their_bits():
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(32, 64, 1, bias=True).to("ember")
    bn = _bn(64, 3).to("ember")
    x = torch.randn(1, 32, 20, 20).to("ember")

    def run(x):
        y = conv(x)
        z = bn(y)
        r = torch.relu(z)
        return y, z, r

    with torch.inference_mode():
        y, z, r = run(x)
        assert _stats()[:2] == (0, 0)  # still held
        got = [t.cpu() for t in (y, z, r)]
        assert _stats() == (1, 2, 3)
        with be.flags(fuse_elementwise=False):
            want = [t.cpu() for t in run(x)]
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    torch.testing.assert_close(got[2], torch.relu(got[1]))


def test_an_in_place_add_on_the_product_and_a_dropped_temporary():
    torch.manual_seed(1)
    conv = torch.nn.Conv2d(16, 24, 1, bias=False).to("ember")
    other = torch.randn(2, 24, 9, 9).to("ember")
    x = torch.randn(2, 16, 9, 9).to("ember")

    def run(x):
        y = conv(x)
        y += other
        return torch.relu(y)

    with torch.inference_mode():
        out = run(x).cpu()
        assert _stats() == (1, 2, 1)  # the product itself was a temporary
        assert torch.equal(out, _unfused(run, x))
        ref = torch.relu(torch.nn.functional.conv2d(x.cpu(), conv.weight.cpu()) + other.cpu())
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_an_addend_the_held_work_computes_does_not_join():
    torch.manual_seed(2)
    conv = torch.nn.Conv2d(8, 8, 1, bias=False).to("ember")
    x = torch.randn(1, 8, 12, 12).to("ember")

    def run(x):
        y = conv(x)
        z = torch.relu(y)
        return z + y  # y: the product, not in memory while held

    with torch.inference_mode():
        out = run(x).cpu()
        assert torch.equal(out, _unfused(run, x))


def test_nothing_is_held_without_the_switch_the_async_engine_or_in_parity():
    conv = torch.nn.Conv2d(8, 8, 1).to("ember")
    x = torch.randn(1, 8, 12, 12).to("ember")
    with torch.inference_mode():
        for flags in (
            {"fuse_elementwise": False},
            {"async_execution": False},
            {"cpu_parity": True},
        ):
            with be.flags(**flags):
                torch.relu(conv(x)).cpu()
        assert _stats() == (0, 0, 0)


def test_autograd_and_training_batch_norm():
    """With grad enabled a ReLU still joins (autograd keeps its result, so
    it is written); a training batch norm (batch statistics) does not."""
    torch.manual_seed(3)
    conv = torch.nn.Conv2d(8, 16, 1).to("ember")
    bn = torch.nn.BatchNorm2d(16).to("ember")
    x = torch.randn(2, 8, 10, 10, device="ember", requires_grad=True)
    out = bn(torch.relu(conv(x)))
    out.sum().backward()
    cpu_conv = torch.nn.Conv2d(8, 16, 1)
    cpu_conv.load_state_dict({k: v.cpu() for k, v in conv.state_dict().items()})
    xc = x.detach().cpu().requires_grad_()
    ref = torch.nn.BatchNorm2d(16)(torch.relu(cpu_conv(xc)))
    ref.sum().backward()
    torch.testing.assert_close(out.detach().cpu(), ref.detach(), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(x.grad.cpu(), xc.grad, rtol=1e-4, atol=1e-4)
    assert _stats()[:2] == (1, 1)


def test_a_stream_switch_or_a_host_read_submits_the_held_convolution():
    torch.manual_seed(4)
    conv = torch.nn.Conv2d(8, 8, 1, bias=False).to("ember")
    bn = _bn(8, 5).to("ember")
    x = torch.randn(1, 8, 16, 16).to("ember")
    side = torch.ember.Stream()
    with torch.inference_mode():
        y = bn(conv(x))
        side.wait_stream(torch.ember.current_stream())
        with torch.ember.stream(side):
            r = torch.relu(y)  # another stream: not joined
        torch.ember.current_stream().wait_stream(side)
        got = r.cpu()
        assert _stats()[:2] == (1, 1)
        with be.flags(fuse_elementwise=False):
            want = torch.relu(bn(conv(x))).cpu()
    assert torch.equal(got, want)


class ConvBnRelu(torch.nn.Module):
    """A 3x3 (or other window) convolution, batch norm, an optional residual
    add, ReLU: the layers of ResNet that take oneDNN's packed route."""

    def __init__(self, cin, cout, kernel, stride, bias, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.conv = torch.nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=bias)
        self.bn = _bn(cout, seed + 1)

    def forward(self, x, residual=None, keep=False):
        y = self.conv(x)
        z = self.bn(y)
        if residual is not None:
            z += residual
        r = torch.relu(z)
        return (y, z, r) if keep else r


# (N, C, H, W), out channels, kernel, stride: windows no other route takes
# on any CPU (Winograd takes stride-1 3x3 ones on AVX-512), so these run on
# oneDNN's pack everywhere.
ONEDNN_CASES = [
    ((1, 32, 15, 15), 48, 3, 2),  # ResNet's strided 3x3, odd image
    ((2, 24, 12, 12), 40, 3, 2),  # a batch: the steps address image 1 too
    ((1, 16, 11, 13), 136, 5, 1),  # 5x5; 136 channels: two channel blocks
]


@pytest.mark.parametrize("shape,cout,kernel,stride", ONEDNN_CASES, ids=str)
@pytest.mark.parametrize("keep", [False, True], ids=["dropped", "kept"])
def test_a_held_onednn_convolution_gives_the_unfused_bits(shape, cout, kernel, stride, keep):
    block = ConvBnRelu(shape[1], cout, kernel, stride, bias=stride == 2, seed=7)
    block = block.eval().to("ember")
    x = torch.randn(shape).to("ember")
    out_hw = (
        (shape[2] + 2 * (kernel // 2) - kernel) // stride + 1,
        (shape[3] + 2 * (kernel // 2) - kernel) // stride + 1,
    )
    residual = torch.randn(shape[0], cout, *out_hw).to("ember")
    with torch.inference_mode():
        for _ in range(2):  # the weight is packed from its second call
            block(x).cpu()
        torch_ember.reset_chain_stats()
        got = block(x, residual, keep=keep)
        got = [t.cpu() for t in got] if keep else [got.cpu()]
        # conv [bn, +=, relu]; written: the block's output, and with the
        # intermediates kept the product and the batch norm's result too
        assert _stats() == (1, 3, 3 if keep else 1)
        with be.flags(fuse_elementwise=False):
            want = block(x, residual, keep=keep)
            want = [t.cpu() for t in want] if keep else [want.cpu()]
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    ref = block.cpu()(x.cpu(), residual.cpu())
    torch.testing.assert_close(got[-1], ref, rtol=1e-4, atol=1e-4)
