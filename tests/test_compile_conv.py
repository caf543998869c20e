"""``torch.ops.ember.conv2d`` and the ``conv_pointwise`` compile pass.

The op computes relu?(conv2d + bias + other) with a channels-last result (on
ember: one oneDNN call on the packed weight, the add and ReLU as post-ops);
``torch.compile(backend="ember")`` turns each frozen convolution into it,
taking a following residual add and ReLU along (a folded ResNet block).
"""

import pytest
import torch
import torch._dynamo
import torch._inductor.config as inductor_config
import torch.nn.functional as F

import torch_ember  # noqa: F401
from torch_ember.compile import backend as ember_backend_module

DEVICE = "ember"
EPS32 = torch.finfo(torch.float32).eps
be = torch.backends.ember
CL = torch.channels_last


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    ember_backend_module.reset_counters()
    torch.ember.empty_cache()
    with inductor_config.patch(fx_graph_cache=False, fx_graph_remote_cache=False):
        yield
    torch._dynamo.reset()
    torch.ember.empty_cache()


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(len(shape) + shape[-1]))


def _check(out, x, w, b, other, relu, stride, padding):
    """Against float64: the error bound of a dot product of C*kh*kw terms."""
    ref = F.conv2d(x.double(), w.double(), b.double(), stride=stride, padding=padding)
    bound = F.conv2d(x.double().abs(), w.double().abs(), None, stride=stride, padding=padding)
    bound = w[0].numel() * EPS32 * bound + EPS32 * b.double().abs().view(1, -1, 1, 1)
    if other is not None:
        ref = ref + other.double()
        bound = bound + EPS32 * ref.abs()
    if relu:
        ref = ref.relu()
    err = (out.cpu().double() - ref).abs()
    assert (err <= bound + 1e-30).all(), f"max err/bound {(err / (bound + 1e-30)).max().item():.3g}"


# (N, C, H, W), (out channels, kernel), stride, padding
CASES = [
    ((1, 3, 32, 32), (16, 7), 2, 3),  # a stem
    ((1, 16, 14, 14), (32, 3), 1, 1),
    ((2, 24, 9, 11), (40, 1), 1, 0),  # 1x1, two images, odd sizes
    ((1, 32, 12, 12), (16, 1), 2, 0),  # strided 1x1 (a downsample)
]


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
@pytest.mark.parametrize("fused", ["none", "relu", "add", "add+relu"])
@pytest.mark.parametrize("async_execution", [False, True], ids=["sync", "async"])
def test_conv2d_op_matches_float64_with_a_channels_last_result(
    case, layout, fused, async_execution
):
    size, (out_channels, k), stride, padding = case
    x, w, b = _randn(*size), _randn(out_channels, size[1], k, k), _randn(out_channels)
    if layout == "channels_last":
        x = x.contiguous(memory_format=CL)
    meta = torch.ops.ember.conv2d(
        x.to("meta"), w.to("meta"), b.to("meta"), [stride] * 2, [padding] * 2, [1, 1], 1
    )
    other = _randn(*meta.shape) if "add" in fused else None
    relu = "relu" in fused
    args = (x.to(DEVICE), w.to(DEVICE), b.to(DEVICE), [stride] * 2, [padding] * 2, [1, 1], 1)
    extra = ("relu" if relu else "none", None if other is None else other.to(DEVICE))
    with torch.inference_mode(), be.flags(async_execution=async_execution):
        for _ in range(3):  # the weight is packed when it comes back unchanged
            out = torch.ops.ember.conv2d(*args, *extra)
        torch.ember.synchronize()
    assert out.is_contiguous(memory_format=CL)
    assert out.shape == meta.shape and out.stride() == meta.stride()
    _check(out, x, w, b, other, relu, stride, padding)


def test_conv2d_op_runs_one_onednn_call_on_the_packed_weight(capfd):
    x, w, b = _randn(1, 8, 10, 10).to(DEVICE), _randn(8, 8, 3, 3).to(DEVICE), _randn(8).to(DEVICE)
    other = _randn(1, 8, 10, 10).to(DEVICE)
    with torch.inference_mode(), be.flags(async_execution=False):
        for _ in range(2):
            torch.ops.ember.conv2d(x, w, b, [1, 1], [1, 1], [1, 1], 1, "relu", other)
        with be.verbose(1):
            torch.ops.ember.conv2d(x, w, b, [1, 1], [1, 1], [1, 1], 1, "relu", other)
    log = capfd.readouterr().err
    assert "onednn/packed" in log and "aten::relu" not in log and "aten::add" not in log, log


def test_conv2d_op_under_cpu_parity_is_cpus_unfused_ops_bitwise():
    x, w, b = _randn(1, 16, 12, 12), _randn(8, 16, 3, 3), _randn(8)
    other = _randn(1, 8, 12, 12)
    expected = torch.relu(F.conv2d(x, w, b, padding=1) + other)
    with be.flags(cpu_parity=True):
        got = torch.ops.ember.conv2d(
            x.to(DEVICE), w.to(DEVICE), b.to(DEVICE), [1, 1], [1, 1], [1, 1], 1, "relu",
            other.to(DEVICE),
        )
    assert torch.equal(got.cpu(), expected)


def test_conv2d_op_sees_an_in_place_weight_write():
    x, w, b = _randn(1, 4, 6, 6).to(DEVICE), _randn(4, 4, 3, 3).to(DEVICE), _randn(4).to(DEVICE)
    run = lambda: torch.ops.ember.conv2d(x, w, b, [1, 1], [1, 1], [1, 1], 1, "relu")  # noqa: E731
    run(), run()
    with torch.no_grad():
        w.mul_(-1)
    _check(run(), x.cpu(), w.cpu(), b.cpu(), None, True, 1, 1)


def test_conv2d_op_rejects_an_unknown_activation_and_a_bad_shape():
    x, w = _randn(1, 4, 6, 6).to(DEVICE), _randn(4, 4, 3, 3).to(DEVICE)
    with pytest.raises(ValueError, match="unknown activation 'gelu'"):
        torch.ops.ember.conv2d(x, w, None, [1, 1], [1, 1], [1, 1], 1, "gelu")
    with pytest.raises(RuntimeError):  # CPU's own error: 4 input channels, weight wants 5
        torch.ops.ember.conv2d(x, _randn(4, 5, 3, 3).to(DEVICE), None, [1, 1], [0, 0], [1, 1], 1)
    assert torch.isfinite(x.cpu()).all()  # the process and its data are intact


class _Block(torch.nn.Module):
    """A ResNet bottleneck-like block: conv-bn-relu, conv-bn, + residual, relu."""

    def __init__(self, channels: int = 16):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, channels, 3, padding=1, bias=False)
        self.bn0 = torch.nn.BatchNorm2d(channels)
        self.conv1 = torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(channels)
        self.conv2 = torch.nn.Conv2d(channels, channels, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(channels)
        for bn in (self.bn0, self.bn1, self.bn2):  # folded BN must matter
            torch.nn.init.uniform_(bn.weight, 0.5, 1.5)
            torch.nn.init.uniform_(bn.bias, -0.5, 0.5)
            bn.running_mean.uniform_(-0.2, 0.2)
            bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x):
        x = torch.relu(self.bn0(self.stem(x)))
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + x).mean((2, 3))


def test_named_backend_folds_a_residual_block_into_fused_convolutions():
    torch.manual_seed(0)
    model = _Block().eval().to(DEVICE)
    x = _randn(2, 3, 20, 20).to(DEVICE)
    with torch.inference_mode():
        expected = model(x)
        compiled = torch.compile(model, backend="ember")
        for _ in range(3):
            out = compiled(x)
    torch.testing.assert_close(out.cpu(), expected.cpu(), rtol=1e-4, atol=1e-5)
    assert ember_backend_module.counters["conv_pointwise"] == 3  # every convolution
    # stem -> relu, conv1 -> relu, conv2 -> add -> relu
    assert ember_backend_module.counters["conv_epilogue"] == 3


def test_default_backend_and_training_graphs_keep_aten_convolutions():
    model = _Block().to(DEVICE)
    x = _randn(2, 3, 12, 12).to(DEVICE)
    compiled = torch.compile(model, backend="ember")
    loss = compiled(x).sum()  # grad enabled: no freezing, no ember passes
    loss.backward()
    assert ember_backend_module.counters["conv_pointwise"] == 0
    assert model.stem.weight.grad is not None
