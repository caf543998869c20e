"""ember's batch-norm inference kernel (ops/kernels/BatchNorm.cpp,
elementwise/ChannelAffine.h): the running statistics, weight and bias folded
into a scale and shift per channel as CPU folds them, one pass over the
data; results equal CPU's bit for bit in CPU's layouts, for NCHW and
channels-last images and other ranks, with and without affine terms.
Training, backward and unusual layouts stay with CPU's kernel."""

import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from isa import VECTOR_KERNELS

import torch_ember  # noqa: F401

DEVICE = "ember"
be = torch.backends.ember

SHAPES = [
    ((1, 64, 56, 56), False),  # a ResNet layer
    ((2, 17, 5, 3), False),  # channels and planes off the vector width
    ((2, 17, 5, 3), True),  # channels-last
    ((4, 96, 7, 7), False),  # parallel chunks starting inside an image
    ((1, 40, 14, 14), False),  # planes of 196: a last partial vector
    ((2, 9, 2, 4), False),  # planes of exactly one AVX2 vector
    ((2, 9, 4, 6), False),  # planes of 24: the 16-wide loop, then one vector
    ((1, 3, 224, 224), True),
    ((5, 33), False),  # BatchNorm1d on (N, C)
    ((2, 3, 7), False),  # (N, C, L)
    ((2, 3, 2, 3, 2), False),  # BatchNorm3d
]


def _stats(channels, seed):
    g = torch.Generator().manual_seed(seed)
    mean = torch.randn(channels, generator=g)
    var = torch.rand(channels, generator=g) + 0.5
    weight = torch.randn(channels, generator=g)
    bias = torch.randn(channels, generator=g)
    return mean, var, weight, bias


def _ember(t):
    return None if t is None else t.to(DEVICE)


@pytest.mark.parametrize("affine", ["weight+bias", "weight", "none"])
@pytest.mark.parametrize("shape,channels_last", SHAPES, ids=str)
def test_inference_equals_cpu_bitwise(shape, channels_last, affine):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
    x.view(-1)[:3] = torch.tensor([float("nan"), float("inf"), -0.0])
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    mean, var, weight, bias = _stats(shape[1], seed=2)
    weight = weight if affine != "none" else None
    bias = bias if affine == "weight+bias" else None
    ref = torch.native_batch_norm(x, weight, bias, mean, var, False, 0.1, 1e-5)
    out = torch.native_batch_norm(
        _ember(x), _ember(weight), _ember(bias), _ember(mean), _ember(var), False, 0.1, 1e-5
    )
    assert out[0].stride() == ref[0].stride()
    assert torch.equal(out[0].cpu().view(torch.int32), ref[0].view(torch.int32))
    assert out[1].shape == ref[1].shape == (0,) and out[2].shape == ref[2].shape


_AVX2_SCRIPT = """
import sys, torch, torch_ember
import torch.nn.functional as F
assert not torch.backends.ember.capabilities()["avx512f"]
g = torch.Generator().manual_seed(5)
for shape in [(2, 9, 1, 1), (2, 9, 1, 7), (2, 9, 2, 4), (2, 9, 3, 5), (2, 9, 4, 6), (1, 64, 7, 7),
              (1, 40, 14, 14)]:
    x = torch.randn(shape, generator=g)
    mean, weight, bias = (torch.randn(shape[1], generator=g) for _ in range(3))
    var = torch.rand(shape[1], generator=g) + 0.5
    ref = F.batch_norm(x, mean, var, weight, bias)
    out = F.batch_norm(*(t.to("ember") for t in (x, mean, var, weight, bias)))
    assert torch.equal(out.cpu().view(torch.int32), ref.view(torch.int32)), shape
"""


def test_avx2_kernel_equals_cpus_avx2_kernel_bitwise():
    """The AVX2 form (fused multiply-adds as ATen's AVX2 kernel computes
    them; planes off the vector width end in one unmasked vector that
    overlaps the loop's last one, planes under 8 elements in scalar fused
    multiply-adds) against CPU's AVX2 kernel, with both capped to AVX2 in a
    subprocess, so AVX-512 hosts test it too."""
    if not VECTOR_KERNELS:
        pytest.skip("ember's batch-norm kernel needs AVX-512F or AVX2")
    env = dict(os.environ, EMBER_MAX_ISA="avx2", ATEN_CPU_CAPABILITY="avx2")
    subprocess.run([sys.executable, "-c", _AVX2_SCRIPT], env=env, check=True, timeout=120)


def test_module_in_eval_takes_embers_kernel(capfd):
    if not VECTOR_KERNELS:
        pytest.skip("ember's batch-norm kernel needs AVX-512F or AVX2")
    bn = torch.nn.BatchNorm2d(8).eval()
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 8, 9, 9)
    on_ember = bn.to(DEVICE)
    with be.verbose(1):
        out = on_ember(x.to(DEVICE))
    assert "ember/batch_norm" in capfd.readouterr().err
    assert torch.equal(out.cpu(), bn.cpu()(x))


def test_training_updates_running_stats_as_cpu():
    x = torch.randn(4, 6, 5, 5)
    cpu_bn = torch.nn.BatchNorm2d(6).train()
    ember_bn = torch.nn.BatchNorm2d(6).train().to(DEVICE)
    out_cpu = cpu_bn(x)
    out = ember_bn(x.to(DEVICE))
    torch.testing.assert_close(out.cpu(), out_cpu)
    torch.testing.assert_close(ember_bn.running_mean.cpu(), cpu_bn.running_mean)
    torch.testing.assert_close(ember_bn.running_var.cpu(), cpu_bn.running_var)


def test_backward_in_eval_matches_cpu():
    mean, var, weight, bias = _stats(5, seed=3)
    x = torch.randn(3, 5, 4, 4)
    leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
    leaves_e = [t.to(DEVICE).requires_grad_() for t in (x, weight, bias)]
    F.batch_norm(leaves[0], mean, var, leaves[1], leaves[2]).square().sum().backward()
    F.batch_norm(
        leaves_e[0], _ember(mean), _ember(var), leaves_e[1], leaves_e[2]
    ).square().sum().backward()
    for a, b in zip(leaves_e, leaves):
        torch.testing.assert_close(a.grad.cpu(), b.grad)


def test_strided_input_and_bad_arguments_take_cpus_kernel():
    mean, var, weight, bias = _stats(4, seed=4)
    full = torch.randn(2, 4, 6, 6)
    x = full[..., ::2]  # neither layout
    on_ember = _ember(full)[..., ::2]
    out = F.batch_norm(on_ember, _ember(mean), _ember(var), _ember(weight), _ember(bias))
    assert torch.equal(out.cpu(), F.batch_norm(x, mean, var, weight, bias))
    with pytest.raises(RuntimeError) as cpu_error:
        F.batch_norm(x, mean[:3], var, weight, bias)
    with pytest.raises(RuntimeError) as ember_error:
        F.batch_norm(on_ember, _ember(mean[:3]), _ember(var), _ember(weight), _ember(bias))
    assert str(ember_error.value) == str(cpu_error.value)


def test_graph_replay_recomputes_from_the_static_input():
    bn = torch.nn.BatchNorm2d(3).eval().to(DEVICE)
    static = torch.randn(1, 3, 8, 8, device=DEVICE)
    with torch.inference_mode():
        bn(static)  # warm-up
        graph = torch.ember.EmberGraph()
        with torch.ember.graph(graph):
            out = bn(static)
        fresh = torch.randn(1, 3, 8, 8)
        static.copy_(fresh)
        graph.replay()
        assert torch.equal(out.cpu(), bn.cpu()(fresh))
