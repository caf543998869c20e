"""Defaults PyTorch keys by device type resolve on ember as on CPU
(torch_ember/cpu_defaults.py): ember runs CPU's kernels, so CPU's pick is
the fast and the bitwise-equal one."""

import pytest
import torch
import torch.nn.functional as F

import torch_ember  # noqa: F401

options_module = pytest.importorskip("torch.nn.modules.linear_cross_entropy_options")
Options = options_module.LinearCrossEntropyOptions


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_linear_cross_entropy_auto_options_are_cpus(dtype):
    as_cpu = Options()._adjust(64, 16, 1000, dtype, torch.device("cpu"))
    as_ember = Options()._adjust(64, 16, 1000, dtype, torch.device("ember"))
    assert as_ember == as_cpu
    assert as_ember.acc_dtype == torch.float32  # not the fallback's input dtype


@pytest.mark.cpu_parity
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_linear_cross_entropy_equals_cpu_bitwise(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(12, 8, generator=g).to(dtype)
    w = torch.randn(40, 8, generator=g).to(dtype)
    target = torch.randint(0, 40, (12,), generator=g)
    results = []
    for device in ("cpu", "ember"):
        leaf = x.detach().to(device).requires_grad_()
        loss = F.linear_cross_entropy(
            leaf, w.to(device), target.to(device), reduction="sum", options=Options()
        )
        loss.backward()
        results.append((loss.detach().cpu(), leaf.grad.cpu()))
    for ours, cpus in zip(results[1], results[0]):
        assert torch.equal(ours, cpus)
