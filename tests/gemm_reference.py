"""The accuracy check of the GEMM tests: a result against float64 with the
classic GEMM error bound (|error| <= K * eps * (|A| @ |B|) elementwise), and
against CPU's own fp32 error (ember must be as accurate as CPU on average)."""

import torch

EPS32 = torch.finfo(torch.float32).eps


def check_fp32(out, a, b, bias=None):
    """out (ember) against float64; CPU's fp32 result sets the scale."""
    a64, b64 = a.double().cpu(), b.double().cpu()
    ref = a64 @ b64
    if bias is not None:
        ref = ref + bias.double().cpu()
    bound = a.shape[-1] * EPS32 * (a64.abs() @ b64.abs()) + 1e-30
    if bias is not None:
        bound = bound + EPS32 * bias.double().cpu().abs()
    err = (out.cpu().double() - ref).abs()
    assert (err <= bound).all(), f"max err/bound {(err / bound).max().item():.3g}"
    cpu = (a.cpu() @ b.cpu()) + (bias.cpu() if bias is not None else 0)
    cpu_err = (cpu.double() - ref).abs().mean().item()
    assert err.mean().item() <= 4 * cpu_err + 1e-7
