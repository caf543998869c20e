"""torch.backends.ember.matmul / .conv fp32_precision, the BLAS library
choice and deterministic matmul: each switch changes what runs."""

import pytest
import torch
import torch.nn.functional as F
from isa import NATIVE_BF16, ONEDNN_MATMUL

DEVICE = "ember"
be = torch.backends.ember


def _operands(shape_a, shape_b, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape_a, generator=g), torch.randn(shape_b, generator=g)


def _max_err(result, reference):
    return (result.cpu().double() - reference).abs().max().item()


# --- fp32 precision ---------------------------------------------------------


def _mm_errors(fn, *cpu_args):
    """max |error| against float64 for each precision mode, and the results."""
    reference = fn(*(t.double() for t in cpu_args))
    args = [t.to(DEVICE) for t in cpu_args]
    errors, results = {}, {}
    for precision in ("ieee", "bf16", "bf16x3"):
        be.matmul.fp32_precision = precision
        out = fn(*args)
        assert out.dtype == torch.float32 and out.device.type == DEVICE
        results[precision] = out.cpu()
        errors[precision] = _max_err(out, reference)
    return errors, results


OPS = {
    "mm": (lambda a, b: a @ b, [(64, 256), (256, 48)]),
    "bmm": (torch.bmm, [(3, 32, 256), (3, 256, 40)]),
    "addmm": (
        lambda s, a, b: torch.addmm(s, a, b, beta=0.5, alpha=1.5),
        [(48,), (64, 256), (256, 48)],
    ),
    "baddbmm": (
        lambda s, a, b: torch.baddbmm(s, a, b, beta=2.0, alpha=0.5),
        [(3, 32, 40), (3, 32, 256), (3, 256, 40)],
    ),
    "matmul_4d": (torch.matmul, [(2, 3, 16, 256), (2, 3, 256, 24)]),
    "linear": (F.linear, [(8, 16, 256), (32, 256), (32,)]),
}


@pytest.mark.cpu_parity
@pytest.mark.parametrize("name", sorted(OPS))
def test_fp32_precision_changes_the_arithmetic(name):
    fn, shapes = OPS[name]
    g = torch.Generator().manual_seed(1)
    cpu_args = [torch.randn(s, generator=g) for s in shapes]
    errors, results = _mm_errors(fn, *cpu_args)
    # ieee under cpu_parity: CPU's kernel, bit for bit.
    assert torch.equal(results["ieee"], fn(*cpu_args))
    # bf16 rounds the operands to 8 significant bits: far less accurate.
    assert errors["bf16"] > 50 * errors["ieee"]
    # bf16x3 recovers nearly fp32 accuracy from three bf16 products.
    assert errors["bf16x3"] < errors["bf16"] / 50
    assert errors["bf16x3"] < 50 * errors["ieee"]


def test_bf16_mode_is_the_product_of_bf16_rounded_operands():
    a, b = _operands((64, 512), (512, 32))
    be.matmul.fp32_precision = "bf16"
    out = (a.to(DEVICE) @ b.to(DEVICE)).cpu()
    rounded = a.bfloat16().double() @ b.bfloat16().double()
    # What remains is the bf16 result's own rounding (2^-8 relative).
    scale = rounded.abs().max().item()
    assert _max_err(out, rounded) <= scale * 2**-7
    assert not torch.equal(out, a @ b)


def test_none_follows_set_float32_matmul_precision():
    a, b = _operands((64, 128), (128, 64))
    ae, bb = a.to(DEVICE), b.to(DEVICE)
    be.matmul.fp32_precision = "bf16"
    explicit_bf16 = (ae @ bb).cpu()
    be.matmul.fp32_precision = "none"
    torch.set_float32_matmul_precision("medium")
    if NATIVE_BF16:
        assert be.matmul.effective_fp32_precision == "bf16"
        assert torch.equal((ae @ bb).cpu(), explicit_bf16)
    else:  # bf16 would run scalar code here: "medium" stays fp32, as on CPU
        assert be.matmul.effective_fp32_precision == "ieee"
        assert not torch.equal((ae @ bb).cpu(), explicit_bf16)
    torch.set_float32_matmul_precision("highest")
    assert be.matmul.effective_fp32_precision == "ieee"
    assert torch.equal((ae @ bb).cpu(), a @ b)
    torch.set_float32_matmul_precision("high")
    # bf16x3 only where it measured faster than ieee on this CPU.
    assert be.matmul.effective_fp32_precision in ("bf16x3", "ieee")


def test_explicit_setting_wins_over_torch_global():
    torch.set_float32_matmul_precision("medium")
    be.matmul.fp32_precision = "ieee"
    a, b = _operands((32, 64), (64, 32))
    assert torch.equal((a.to(DEVICE) @ b.to(DEVICE)).cpu(), a @ b)


def test_precision_applies_to_out_variants_and_autograd():
    a, b = _operands((16, 128), (128, 8))
    be.matmul.fp32_precision = "bf16"
    out = torch.empty(0, device=DEVICE)
    torch.mm(a.to(DEVICE), b.to(DEVICE), out=out)
    assert out.shape == (16, 8)
    assert torch.equal(out.cpu(), (a.to(DEVICE) @ b.to(DEVICE)).cpu())
    ae = a.to(DEVICE).requires_grad_()
    (ae @ b.to(DEVICE)).sum().backward()
    assert ae.grad.dtype == torch.float32
    assert torch.allclose(ae.grad.cpu(), b.sum(1).expand(16, 128), rtol=2e-2, atol=2e-2)


def test_other_dtypes_are_untouched_by_fp32_precision():
    a, b = _operands((32, 64), (64, 32))
    be.matmul.fp32_precision = "bf16"
    assert torch.equal(
        (a.double().to(DEVICE) @ b.double().to(DEVICE)).cpu(), a.double() @ b.double()
    )


def test_conv_bf16_precision():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 16, 12, 12, generator=g)
    w = torch.randn(8, 16, 3, 3, generator=g)
    bias = torch.randn(8, generator=g)
    reference = F.conv2d(x.double(), w.double(), bias.double(), padding=1)
    xe, we, be_ = x.to(DEVICE), w.to(DEVICE), bias.to(DEVICE)
    ieee = F.conv2d(xe, we, be_, padding=1).cpu()
    assert torch.equal(ieee, F.conv2d(x, w, bias, padding=1))
    be.conv.fp32_precision = "bf16"
    reduced = F.conv2d(xe, we, be_, padding=1)
    assert reduced.dtype == torch.float32
    assert _max_err(reduced, reference) > 50 * _max_err(ieee, reference)
    rounded = F.conv2d(x.bfloat16().double(), w.bfloat16().double(), bias.double(), padding=1)
    assert _max_err(reduced, rounded) <= rounded.abs().max().item() * 2**-7
    with pytest.raises(ValueError, match="matmul only"):
        be.conv.fp32_precision = "bf16x3"
    assert be.conv.fp32_precision == "bf16"


# --- BLAS library -----------------------------------------------------------


def test_blas_library_choice_changes_the_route(capfd):
    assert "onednn" in be.available_blas_libraries()
    a, b = _operands((64, 96), (96, 80))
    ae, bb = a.to(DEVICE), b.to(DEVICE)
    assert be.preferred_blas_library() == "default"
    assert be.preferred_blas_library("onednn") == "onednn"
    with be.verbose(1):
        out = (ae @ bb).cpu()
    log = capfd.readouterr().err
    # without oneDNN's matmul (AVX2-only CPUs) "onednn" prefers ember's kernel
    route = "onednn" if ONEDNN_MATMUL else "panels"
    assert "aten::mm" in log and f"native {route}/ieee" in log
    assert torch.allclose(out, a @ b, rtol=1e-5, atol=1e-5)
    be.preferred_blas_library("mkl")
    with be.verbose(1):
        assert torch.equal((ae @ bb).cpu(), a @ b)  # ATen's MKL path: CPU's bits
    assert "native mkl/ieee" in capfd.readouterr().err
    with be.flags(cpu_parity=True), be.verbose(1):
        assert torch.equal((ae @ bb).cpu(), a @ b)
    assert "delegated" in capfd.readouterr().err
    with pytest.raises(ValueError, match="'onednn'"):
        be.preferred_blas_library("cublas")
    assert be.preferred_blas_library() == "mkl"


def test_onednn_library_handles_addmm_semantics():
    be.preferred_blas_library("onednn")
    g = torch.Generator().manual_seed(5)
    s, a, b = (
        torch.randn(7, 5, generator=g),
        torch.randn(7, 9, generator=g),
        torch.randn(9, 5, generator=g),
    )
    out = torch.addmm(s.to(DEVICE), a.to(DEVICE), b.to(DEVICE), beta=-0.5, alpha=3.0)
    assert torch.allclose(out.cpu(), torch.addmm(s, a, b, beta=-0.5, alpha=3.0), atol=1e-5)
    # beta=0 ignores self entirely, NaNs included (as on CPU).
    s_nan = torch.full((7, 5), float("nan"))
    out = torch.addmm(s_nan.to(DEVICE), a.to(DEVICE), b.to(DEVICE), beta=0)
    assert not out.isnan().any()
    # Transposed and batch-broadcast (stride 0) operands.
    t = torch.randn(4, 7, 9, generator=g)
    u = torch.randn(1, 7, 5, generator=g)
    out = t.to(DEVICE).transpose(1, 2) @ u.to(DEVICE).expand(4, 7, 5)
    assert torch.allclose(out.cpu(), t.transpose(1, 2) @ u.expand(4, 7, 5), atol=1e-5)


def test_shape_errors_are_cpus_under_the_engine():
    be.matmul.fp32_precision = "bf16"
    a, b = torch.randn(3, 4, device=DEVICE), torch.randn(5, 6, device=DEVICE)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        torch.mm(a, b)
    with pytest.raises(RuntimeError, match="same dtype"):
        torch.mm(a, torch.randn(4, 2, device=DEVICE, dtype=torch.float64))


# --- determinism --------------------------------------------------------------


SHAPES = {
    "square": ((300, 520), (520, 270)),
    "skinny_long_k": ((4, 60000), (60000, 3)),
    "gemv_like": ((1, 4096), (4096, 700)),
}


@pytest.mark.parametrize("name", sorted(SHAPES))
@pytest.mark.parametrize("precision", ["ieee", "bf16x3"])
def test_deterministic_matmul_is_bitwise_across_thread_counts(name, precision):
    a, b = _operands(*SHAPES[name], seed=7)
    ae, bb = a.to(DEVICE), b.to(DEVICE)
    be.deterministic = True
    be.matmul.fp32_precision = precision
    results = []
    for threads in (1, 2, 3, 4):
        torch.set_num_threads(threads)
        results.append((ae @ bb).cpu())
        results.append(torch.addmm(bb[0, :1], ae, bb).cpu())
    for r in results[2::2]:
        assert torch.equal(r, results[0])
    for r in results[3::2]:
        assert torch.equal(r, results[1])
    reference = a.double() @ b.double()
    tolerance = 1e-3 * reference.abs().max().item()
    assert _max_err(results[0], reference) < tolerance


def test_deterministic_bmm_and_backward_across_thread_counts():
    g = torch.Generator().manual_seed(9)
    a, b = torch.randn(3, 70, 900, generator=g), torch.randn(3, 900, 50, generator=g)
    torch.use_deterministic_algorithms(True)  # honoured as well as the ember switch
    grads, outs = [], []
    for threads in (1, 2, 4):
        torch.set_num_threads(threads)
        ae = a.to(DEVICE).requires_grad_()
        out = torch.bmm(ae, b.to(DEVICE))
        out.backward(torch.ones_like(out))
        outs.append(out.detach().cpu())
        grads.append(ae.grad.cpu())
    assert all(torch.equal(o, outs[0]) for o in outs)
    assert all(torch.equal(gr, grads[0]) for gr in grads)


def test_single_row_addmm_stays_within_its_buffers(run_python):
    """oneDNN's single-row addmm wrote past a scratch buffer it allocated from
    ember memory (corrupting a neighbour); ember keeps those on ATen's path.
    EMBER_DEBUG_HEAP=1 puts canaries after every such allocation."""
    code = (
        "import gc, torch, torch_ember\n"
        "be = torch.backends.ember\n"
        "for setting in ({'blas_library': 'onednn'}, {'benchmark': True}):\n"
        "    with be.flags(**setting):\n"
        "        for k in (2048, 4096):\n"
        "            x = torch.randn(1, k, device='ember')\n"
        "            w = torch.randn(1000, k, device='ember')\n"
        "            b = torch.randn(1000, device='ember')\n"
        "            for weight in (w.t(), w.t().contiguous()):\n"
        "                y = torch.addmm(b, x, weight)\n"
        "                del y\n"
        "                gc.collect()\n"
        "print('ok')\n"
    )
    done = run_python(code, env={"EMBER_DEBUG_HEAP": "1"}, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "heap check" not in done.stderr
    assert done.stdout.strip() == "ok"
