"""ember's default GEMM route: packed weights, the skinny (decode) kernel,
MKL's (Intel CPUs) or oneDNN's packed GEMM, and the CPU-parity switch (the
pack cache itself: test_gemm_packs.py).

Results are checked against float64 references with the classic GEMM error
bound (|error| <= K * eps * (|A| @ |B|) elementwise), and against CPU's own
fp32 error: ember must be as accurate as CPU on average. Speed is the
benchmark's business (make bench), not these tests'.
"""

import os
import subprocess
import sys

import pytest
import torch
from gemm_reference import EPS32
from gemm_reference import check_fp32 as _check_fp32
from isa import NATIVE_BF16, ONEDNN_MATMUL, PANEL_GEMM, TALL_GEMM

import torch_ember

DEVICE = "ember"
BF16_EPS = 2.0**-8  # unit roundoff of bf16 (8 significant bits)

be = torch.backends.ember


def _packs():
    return be.packed_weights_info()


# The route of fp32 GEMMs of more than 16 rows on this CPU, as verbose names it.
LARGE_ROUTE = f"{be.packed_weights_info()['library']}/packed"


pytestmark = pytest.mark.usefixtures("empty_caches")


ROWS = [1, 2, 5, 16, 17, 64, 300]
SHAPES = [(768, 2304), (33, 17), (256, 256), (1, 40), (130, 1)]


@pytest.mark.parametrize("m", ROWS)
@pytest.mark.parametrize("k,n", SHAPES)
@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_float64(m, k, n, bias):
    torch.manual_seed(m * 1000 + k + n)
    lin = torch.nn.Linear(k, n, bias=bias)
    x = torch.randn(m, k)
    lin_e, x_e = lin.to(DEVICE), x.to(DEVICE)
    w = lin.weight.detach()
    first = lin_e(x_e)  # unpacked route (first sight of the weight)
    second = lin_e(x_e)  # packed
    third = lin_e(x_e)
    for out in (first, second, third):
        _check_fp32(out, x, w.t(), lin.bias.detach() if bias else None)
    assert torch.equal(second.cpu(), third.cpu()), "not reproducible run to run"
    assert _packs()["packs"] >= 1


@pytest.mark.parametrize("m", [1, 4, 64])
def test_conv1d_layout_and_strided_operands(m):
    """GPT-2's Conv1D: addmm(bias, x, W) with W stored K x N; also a sliced
    (non-contiguous) weight and a transposed input."""
    torch.manual_seed(m)
    k, n = 96, 80
    w = torch.randn(k, n)
    bias = torch.randn(n)
    x = torch.randn(m, k)
    we, be_, xe = w.to(DEVICE), bias.to(DEVICE), x.to(DEVICE)
    for _ in range(2):
        _check_fp32(torch.addmm(be_, xe, we), x, w, bias)
    sliced = we[:, ::2]
    for _ in range(2):
        _check_fp32(torch.mm(xe, sliced), x, w[:, ::2])
    xt = x.t().contiguous().t()  # column-major input
    for _ in range(2):
        _check_fp32(torch.addmm(be_, xt.to(DEVICE), we), xt, w, bias)
    # a broadcast [1, N] bias and non-unit beta/alpha take other routes
    out = torch.addmm(be_.view(1, n), xe, we, beta=0.5, alpha=2.0)
    ref = 0.5 * bias + 2.0 * (x @ w)
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-4)


def test_routes_are_native_and_packed(capfd):
    if not PANEL_GEMM:
        pytest.skip("the skinny kernel needs AVX-512F or AVX2 + FMA")
    lin = torch.nn.Linear(64, 48).to(DEVICE)
    x1, x64 = torch.randn(1, 64, device=DEVICE), torch.randn(64, 64, device=DEVICE)
    for _ in range(2):
        lin(x1), lin(x64)
    with be.verbose(1):
        lin(x1)
        lin(x64)
    err = capfd.readouterr().err
    assert "skinny/f32-packed" in err
    assert LARGE_ROUTE in err
    info = _packs()
    # ember's panel kernel runs both row counts on one pack of the weight.
    packs = 1 if info["library"] == "panels" else 2
    assert info["packs"] == packs and info["hits"] >= 2 and info["entries"] == packs


def test_cpu_parity_is_bitwise_and_default_is_not_copying():
    torch.manual_seed(1)
    lin = torch.nn.Linear(300, 200)
    x = torch.randn(5, 300)
    ref = lin(x)
    lin_e, x_e = lin.to(DEVICE), x.to(DEVICE)
    with be.flags(cpu_parity=True):
        for _ in range(3):
            assert torch.equal(lin_e(x_e).cpu(), ref)
        assert be.cpu_parity is True
    assert be.cpu_parity is False
    torch_ember.reset_fallback_stats()
    for _ in range(3):
        lin_e(x_e)
    assert torch_ember.fallback_stats() == {}


def test_cpu_parity_from_environment(run_python):
    code = "import torch, torch_ember; print(torch.backends.ember.cpu_parity)"
    assert run_python(code, env={"EMBER_CPU_PARITY": "1"}).stdout.strip() == "True"
    assert run_python(code, env={"EMBER_CPU_PARITY": None}).stdout.strip() == "False"


@pytest.mark.parametrize("setting", ["medium", "bf16"])
@pytest.mark.parametrize(("m", "k", "n"), [(1, 200, 70), (3, 200, 70), (16, 200, 70), (5, 769, 33)])
def test_medium_precision_streams_bf16_panels(setting, m, k, n, capfd):
    """Under "medium" (or an explicit "bf16"), skinny GEMMs use bf16 panels:
    the result is the exact product of bf16-rounded operands, summed in fp32.
    On AVX2 CPUs too (no bf16 arithmetic: the panels are widened to fp32 in
    registers), where "medium" leaves every other GEMM in fp32."""
    if not PANEL_GEMM:
        pytest.skip("the panel GEMMs need AVX-512F or AVX2 + FMA")
    torch.manual_seed(m + k)
    lin = torch.nn.Linear(k, n).to(DEVICE)
    x = torch.randn(m, k, device=DEVICE)
    if setting == "medium":
        torch.set_float32_matmul_precision("medium")
        expected = "bf16" if NATIVE_BF16 else "ieee"
        assert be.matmul.effective_fp32_precision == expected
    else:
        be.matmul.fp32_precision = "bf16"
    with be.verbose(1):
        for _ in range(2):
            out = lin(x)
    assert "skinny/bf16-packed" in capfd.readouterr().err
    xr = x.cpu().bfloat16().double()
    wr = lin.weight.detach().cpu().bfloat16().double()
    ref = xr @ wr.t() + lin.bias.detach().cpu().double()
    bound = k * EPS32 * (xr.abs() @ wr.abs().t()) + 1e-6
    assert ((out.cpu().double() - ref).abs() <= bound).all()
    # and it is not fp32 (the bf16 rounding shows against the fp32 product;
    # computed in float64: CPU's own fp32 GEMM also takes bf16 operands under
    # "medium" on CPUs with AMX)
    x64, w64 = x.cpu().double(), lin.weight.detach().cpu().double()
    fp32 = (x64 @ w64.t() + lin.bias.detach().cpu().double()).float()
    assert not torch.allclose(out.cpu(), fp32, rtol=1e-6, atol=1e-6)


def test_high_precision_choice_is_stable_across_processes(run_python):
    code = (
        "import torch, torch_ember\n"
        "torch.set_float32_matmul_precision('high')\n"
        "print(torch.backends.ember.matmul.effective_fp32_precision)\n"
    )
    answers = {run_python(code).stdout.strip() for _ in range(3)}
    assert len(answers) == 1
    expected = "bf16x3" if be.capabilities().get("amx_bf16") else "ieee"
    assert answers == {expected}


@pytest.mark.parametrize("m", [1, 7, 40])
def test_out_variants_take_the_packed_route(m, capfd):
    """mm.out / addmm.out (what Inductor's generated code calls)."""
    torch.manual_seed(m)
    k, n = 48, 36
    w, bias, x = torch.randn(k, n), torch.randn(n), torch.randn(m, k)
    we, biase, xe = w.to(DEVICE), bias.to(DEVICE), x.to(DEVICE)
    out = torch.empty(m, n, device=DEVICE)
    for _ in range(2):
        torch.addmm(biase, xe, we, out=out)
    with be.verbose(1):
        result = torch.addmm(biase, xe, we, out=out)
        torch.mm(xe, we, out=out)
        torch.mm(xe, we, out=out)
    assert result is out
    assert "packed" in capfd.readouterr().err
    _check_fp32(out, x, w)
    # an out= that must be resized takes the general route
    small = torch.empty(0, device=DEVICE)
    torch.addmm(biase, xe, we, out=small)
    _check_fp32(small, x, w, bias)


def test_large_m_and_odd_shapes():
    torch.manual_seed(3)
    for m, k, n in [(1024, 96, 130), (1024, 1, 7), (513, 257, 3)]:
        w, bias, x = torch.randn(n, k), torch.randn(n), torch.randn(m, k)
        we, biase, xe = w.to(DEVICE), bias.to(DEVICE), x.to(DEVICE)
        for _ in range(2):
            _check_fp32(torch.nn.functional.linear(xe, we, biase), x, w.t(), bias)


def test_large_gemm_bits_do_not_depend_on_which_row_count_came_first():
    """The pack of B is laid out for a fixed row count (MKL's layout depends
    on the M it is packed for), so a GEMM's result is the same whichever M
    first made the pack: reproducible run to run whatever the call history."""
    torch.manual_seed(5)
    lin = torch.nn.Linear(192, 160).to(DEVICE)
    x17, x300 = torch.randn(17, 192, device=DEVICE), torch.randn(300, 192, device=DEVICE)
    results = []
    for first in (x17, x300):
        torch.ember.empty_cache()
        for _ in range(2):
            lin(first)  # the second call packs
        assert _packs()["packs"] == 1
        results.append((lin(x17).cpu(), lin(x300).cpu()))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])
    w = lin.weight.detach().cpu()
    _check_fp32(results[0][1], x300.cpu(), w.t(), lin.bias.detach().cpu())


@pytest.mark.parametrize(
    "m,k,n",
    [
        (300, 130, 40),  # one panel group: the rows are split between threads
        (64, 768, 2304),  # many groups
        (17, 33, 47),  # one row past the skinny kernel
    ],
)
def test_tall_gemm_bits_do_not_depend_on_the_thread_count(m, k, n):
    """More than 16 rows split between threads by panel groups, and by row
    slices when B is narrow; every output's sum runs over K in one task, so
    one thread and two give the same bits (and a row's result does not
    depend on its neighbours in the batch)."""
    torch.manual_seed(m + k + n)
    lin = torch.nn.Linear(k, n).to(DEVICE)
    x = torch.randn(m, k, device=DEVICE)
    lin(x)  # packs on the second sight
    threads = torch.get_num_threads()
    results = []
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            results.append(lin(x).cpu())
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(results[0], results[1])
    rows = lin(x[5:9]).cpu()
    if TALL_GEMM == "mkl":
        # Intel CPUs: 4 rows run ember's skinny kernel, more than 16 MKL's
        # packed GEMM: the same sums, rounded in another order.
        torch.testing.assert_close(rows, results[0][5:9])
    else:
        assert torch.equal(rows, results[0][5:9])
    w = lin.weight.detach().cpu()
    _check_fp32(results[0], x.cpu(), w.t(), lin.bias.detach().cpu())


@pytest.mark.parametrize("layout", ["row-major", "transposed", "padded-rows"])
def test_large_gemm_packs_every_weight_layout(layout):
    """B as a Linear weight's transpose, as stored row-major (GPT-2's Conv1D),
    and as a row-major slice with padded rows; A with padded rows; out= with
    padded rows."""
    torch.manual_seed(6)
    m, k, n = 40, 72, 56
    if layout == "transposed":
        b = torch.randn(n, k).t()
    elif layout == "row-major":
        b = torch.randn(k, n)
    else:
        b = torch.randn(k, n + 8)[:, :n]
    a = torch.randn(m, k + 5)[:, :k]
    bias = torch.randn(n)
    be_, ae, biase = b.to(DEVICE), a.to(DEVICE), bias.to(DEVICE)
    out = torch.empty(m, n + 3, device=DEVICE)[:, :n]
    for _ in range(3):
        _check_fp32(torch.addmm(biase, ae, be_), a, b, bias)
        torch.addmm(biase, ae, be_, out=out)
        _check_fp32(out, a, b, bias)
    assert _packs()["packs"] >= 1


ACTIVATIONS = {
    "relu": torch.nn.ReLU,
    "gelu": torch.nn.GELU,
    "gelu_tanh": lambda: torch.nn.GELU(approximate="tanh"),
    "silu": torch.nn.SiLU,
    "tanh": torch.nn.Tanh,
    "sigmoid": torch.nn.Sigmoid,
}


@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
@pytest.mark.parametrize("m", [1, 64])
def test_linear_then_activation_eager_and_compiled(act, m):
    """Linear -> activation on the packed route, eager and with
    torch.compile(backend="ember") (one-row fusion or packed extern GEMM),
    against float64."""
    torch.manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(96, 80), ACTIVATIONS[act]()).eval()
    x = torch.randn(m, 96)
    ref = model.double()(x.double()).float()
    model = model.float().to(DEVICE)
    xe = x.to(DEVICE)
    with torch.inference_mode():
        eager = [model(xe) for _ in range(2)][-1]
        compiled = torch.compile(model, backend="ember")
        out = [compiled(xe) for _ in range(2)][-1]
    for result in (eager, out):
        torch.testing.assert_close(result.cpu(), ref, rtol=1e-5, atol=2e-5)


def test_medium_precision_many_rows_uses_a_bf16_pack(capfd):
    """Under "medium", GEMMs with more than 16 rows run oneDNN on a bf16 pack
    of the weight: bf16 operands, fp32 accumulation, the product rounded to
    bf16 (as ATen's bf16 GEMM returns it), the bias added in fp32."""
    if not (ONEDNN_MATMUL and NATIVE_BF16):
        pytest.skip("oneDNN's bf16 reorder needs AVX512BW/VL/DQ, bf16 speed AVX512_BF16")
    torch.manual_seed(11)
    k, n, m = 200, 70, 64
    lin = torch.nn.Linear(k, n).to(DEVICE)
    x = torch.randn(m, k, device=DEVICE)
    torch.set_float32_matmul_precision("medium")
    with be.verbose(1):
        for _ in range(2):
            out = lin(x)
    assert "onednn/bf16-packed" in capfd.readouterr().err
    assert _packs()["bytes"] >= k * n * 2
    xr = x.cpu().bfloat16().double()
    wr = lin.weight.detach().cpu().bfloat16().double()
    product = xr @ wr.t()
    ref = product + lin.bias.detach().cpu().double()
    bound = product.abs() * 2.0**-8 + k * EPS32 * (xr.abs() @ wr.abs().t()) + 1e-6
    assert ((out.cpu().double() - ref).abs() <= bound).all()
    torch.set_float32_matmul_precision("highest")
    fp32 = [lin(x) for _ in range(2)][-1]
    _check_fp32(fp32, x.cpu(), lin.weight.detach().cpu().t(), lin.bias.detach().cpu())


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(
    "k,n,m",
    [(200, 70, 64), (33, 130, 17), (768, 768, 300), (33, 130, 1), (768, 2304, 16), (7, 5, 3)],
)
def test_bf16_operands_take_a_bf16_pack(k, n, m, bias, capfd):
    """bf16 operands run on a bf16 pack of the weight: up to 16 rows ember's
    skinny kernel on bf16 panels, more rows oneDNN's bf16 matmul (CPU's bf16
    GEMM re-lays B on every call). fp32 accumulation, one rounding to bf16,
    like CPU's; a write to the weight drops the pack."""
    if not be.capabilities()["avx512_bf16"]:
        pytest.skip("the bf16 route needs AVX512_BF16")
    torch.manual_seed(k + n)
    lin = torch.nn.Linear(k, n, bias=bias).to(DEVICE, torch.bfloat16)
    x = torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16)

    def check(out):
        w = lin.weight.detach().cpu()
        cpu = torch.nn.functional.linear(x.cpu(), w, lin.bias.detach().cpu() if bias else None)
        ref = x.cpu().double() @ w.double().t()
        if bias:
            ref = ref + lin.bias.detach().cpu().double()
        assert out.dtype == torch.bfloat16
        # fp32 accumulation, then one rounding to bf16 (CPU's result too)
        accumulation = k * EPS32 * (x.cpu().double().abs() @ w.double().abs().t())
        bound = BF16_EPS * ref.abs() + accumulation + 1e-30
        assert ((out.cpu().double() - ref).abs() <= bound).all()
        assert ((cpu.double() - ref).abs() <= bound).all()  # the same bound holds for CPU

    with be.verbose(1):
        for _ in range(2):
            out = lin(x)
    assert ("skinny/bf16-packed" if m <= 16 else "onednn/bf16-packed") in capfd.readouterr().err
    assert _packs()["bytes"] >= k * n * 2
    check(out)
    with torch.no_grad():
        lin.weight.mul_(-0.5)
    check(lin(x))
    assert _packs()["invalidations"] >= 1
    with be.flags(cpu_parity=True):
        parity = lin(x)
    w = lin.weight.detach().cpu()
    cpu = torch.nn.functional.linear(x.cpu(), w, lin.bias.detach().cpu() if bias else None)
    assert torch.equal(parity.cpu(), cpu)


@pytest.mark.parametrize("m", [1, 40])
def test_bf16_row_major_weight_and_out_variant(m):
    """A Conv1D-style bf16 weight (K x N, row-major) through addmm and
    addmm(out=): the same packed routes, CPU's result to one bf16 rounding."""
    if not be.capabilities()["avx512_bf16"]:
        pytest.skip("the bf16 route needs AVX512_BF16")
    torch.manual_seed(m)
    k, n = 96, 72
    w = torch.randn(k, n, dtype=torch.bfloat16)
    bias = torch.randn(n, dtype=torch.bfloat16)
    x = torch.randn(m, k, dtype=torch.bfloat16)
    we, biase, xe = w.to(DEVICE), bias.to(DEVICE), x.to(DEVICE)
    cpu = torch.addmm(bias, x, w)
    out = torch.empty(m, n, dtype=torch.bfloat16, device=DEVICE)
    for _ in range(3):
        result = torch.addmm(biase, xe, we)
        torch.addmm(biase, xe, we, out=out)
    assert _packs()["entries"] == 1 and _packs()["hits"] >= 2
    for got in (result, out):
        torch.testing.assert_close(got.cpu(), cpu, rtol=2**-8, atol=1e-2)


_ISA_SCRIPT = """
import sys
import torch
import torch_ember

torch.manual_seed(0)
lin = torch.nn.Linear(96, 80).to("ember")
conv = torch.nn.Conv2d(24, 40, 1).to("ember")
outs = []
with torch.inference_mode():
    for m in (1, 5, 64):
        x = torch.randn(m, 96, device="ember")
        for _ in range(2):
            y = lin(x)
        outs.append(y.cpu())
    outs.append(conv(torch.randn(2, 24, 8, 8, device="ember")).cpu())
    # dot-product tails: 1 column (7 x 7) and 4 (14 x 14)
    for size in (7, 14):
        outs.append(conv(torch.randn(1, 24, size, size, device="ember")).cpu())
be = torch.backends.ember
torch.save({"caps": be.capabilities(), "library": be.packed_weights_info()["library"],
            "outs": outs}, sys.argv[1])
"""


def test_avx2_kernels_give_the_bits_of_the_avx512_kernels(tmp_path):
    """EMBER_MAX_ISA=avx2 runs the AVX2 panel GEMMs on an AVX-512 CPU (where
    CI has one): skinny, tall and 1x1-convolution results equal the
    AVX-512 kernels' bit for bit (the same fused multiply-adds in the same
    order; the convolutions' dot-product tails reduced in the same order)."""
    if not PANEL_GEMM:
        pytest.skip("the panel kernels need AVX-512F or AVX2 + FMA")
    results = {}
    for isa in ("", "avx2"):
        path = tmp_path / f"out-{isa or 'native'}.pt"
        env = dict(os.environ, EMBER_MAX_ISA=isa)
        subprocess.run(
            [sys.executable, "-c", _ISA_SCRIPT, str(path)], env=env, check=True, timeout=300
        )
        results[isa] = torch.load(path)
    # Intel CPUs keep MKL's packed GEMM above 16 rows under the cap too (its
    # bits in both runs); the skinny and 1x1-convolution results compare the
    # panel kernels there.
    tall = "mkl" if TALL_GEMM == "mkl" else "panels"
    assert not results["avx2"]["caps"]["avx512f"] and results["avx2"]["library"] == tall
    for native, avx2 in zip(results[""]["outs"], results["avx2"]["outs"], strict=True):
        assert torch.equal(native, avx2)
