"""ember's own attention kernel (ops/kernels/attention/): the default for
scaled_dot_product_attention's flash path on ember. Checked against float64
across shapes, masks and layouts, with CPU's result layouts and logsumexp
(backward uses it), and the CPU-parity switch restoring CPU's kernel bit for
bit. Kernel selection itself is tests/test_backends_sdpa.py's."""

import time

import pytest
import torch
import torch.nn.functional as F
from async_helpers import launched_count, returned_before_the_sleep_ended, sleep_on_stream
from isa import VECTOR_KERNELS

import torch_ember

DEVICE = "ember"
be = torch.backends.ember
FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def _qkv(b, h, lq, lk, d, dv=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    # transformers' layout: [batch, seq, head, dim] seen as [batch, head, seq, dim]
    q = torch.randn(b, lq, h, d, generator=g).transpose(1, 2)
    k = torch.randn(b, lk, h, d, generator=g).transpose(1, 2)
    v = torch.randn(b, lk, h, dv or d, generator=g).transpose(1, 2)
    return q, k, v


def _reference(q, k, v, mask, causal):
    m = None if mask is None else mask.double()
    return F.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), attn_mask=m, is_causal=causal
    )


def _mask(kind, b, h, lq, lk):
    g = torch.Generator().manual_seed(7)
    if kind is None:
        return None
    if kind == "additive":
        return torch.randn(b, h, lq, lk, generator=g)
    if kind == "broadcast":
        return torch.randn(b, 1, 1, lk, generator=g)
    if kind == "padding":  # BERT's: padded keys at -inf
        m = torch.zeros(b, 1, lq, lk)
        m[..., lk - lk // 3 :] = float("-inf")
        return m
    raise ValueError(kind)


SHAPES = [
    (1, 12, 128, 128, 64),  # BERT-base
    (2, 3, 37, 53, 16),
    (1, 4, 200, 200, 32),
    (2, 2, 17, 9, 24),  # head dim not a multiple of 16
    (1, 12, 1, 77, 64),  # decode: one query row
    (3, 2, 5, 300, 8),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mask_kind", [None, "additive", "broadcast", "padding"])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_float64_with_cpu_layouts(shape, mask_kind, causal):
    b, h, lq, lk, d = shape
    q, k, v = _qkv(b, h, lq, lk, d, seed=lq + lk)
    mask = _mask(mask_kind, b, h, lq, lk)
    out_cpu, lse_cpu = FLASH(q, k, v, 0.0, causal, attn_mask=mask)
    qe, ke, ve = (t.to(DEVICE) for t in (q, k, v))
    me = None if mask is None else mask.to(DEVICE)
    out, lse = FLASH(qe, ke, ve, 0.0, causal, attn_mask=me)
    assert out.stride() == out_cpu.stride() and lse.stride() == lse_cpu.stride()
    ref = _reference(q, k, v, mask, causal)
    err = (out.cpu().double() - ref).abs().max().item()
    cpu_err = (out_cpu.double() - ref).abs().max().item()
    assert err <= 4 * cpu_err + 1e-6, (err, cpu_err)
    torch.testing.assert_close(lse.cpu(), lse_cpu, rtol=1e-5, atol=1e-5)
    out2, _ = FLASH(qe, ke, ve, 0.0, causal, attn_mask=me)
    assert torch.equal(out.cpu(), out2.cpu())  # reproducible


def test_fully_masked_rows_and_nan_match_cpu():
    q, k, v = _qkv(1, 2, 3, 5, 4)
    mask = torch.zeros(1, 1, 3, 5)
    mask[..., 1, :] = float("-inf")
    mask[..., 2, 0] = float("nan")
    out_cpu, lse_cpu = FLASH(q, k, v, 0.0, False, attn_mask=mask)
    out, lse = FLASH(*(t.to(DEVICE) for t in (q, k, v)), 0.0, False, attn_mask=mask.to(DEVICE))
    torch.testing.assert_close(out.cpu(), out_cpu, equal_nan=True)
    torch.testing.assert_close(lse.cpu(), lse_cpu, equal_nan=True)


def test_sdpa_with_boolean_mask_and_scale():
    q, k, v = _qkv(2, 4, 33, 33, 32)
    keep = torch.rand(2, 1, 33, 33, generator=torch.Generator().manual_seed(3)) > 0.3
    keep[..., 0] = True
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, scale=0.3)
    out = F.scaled_dot_product_attention(
        *(t.to(DEVICE) for t in (q, k, v)), attn_mask=keep.to(DEVICE), scale=0.3
    )
    torch.testing.assert_close(out.cpu(), ref)


def test_backward_matches_cpu():
    q, k, v = _qkv(1, 3, 20, 20, 16)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    leaves_e = [t.detach().to(DEVICE).requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*leaves, is_causal=True).square().sum().backward()
    F.scaled_dot_product_attention(*leaves_e, is_causal=True).square().sum().backward()
    for a, b in zip(leaves_e, leaves):
        torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=1e-4, atol=1e-5)


def test_route_is_observable(capfd):
    if not VECTOR_KERNELS:
        pytest.skip("ember's attention kernel needs AVX-512F or AVX2")
    q, k, v = (t.to(DEVICE) for t in _qkv(1, 2, 20, 20, 16))
    with be.verbose(1):
        F.scaled_dot_product_attention(q, k, v)
    assert "ember/attention" in capfd.readouterr().err


@pytest.mark.cpu_parity
def test_parity_is_bitwise():
    q, k, v = _qkv(1, 12, 64, 64, 64)
    mask = _mask("additive", 1, 12, 64, 64)
    ref = FLASH(q, k, v, 0.0, False, attn_mask=mask)
    out = FLASH(*(t.to(DEVICE) for t in (q, k, v)), 0.0, False, attn_mask=mask.to(DEVICE))
    assert torch.equal(out[0].cpu(), ref[0]) and torch.equal(out[1].cpu(), ref[1])


@pytest.mark.parametrize(
    "layout",
    [
        lambda s: torch.randn(s),  # [batch, head, row, dim]
        lambda s: torch.randn(s[0], s[2], s[1], s[3]).transpose(1, 2),
        lambda s: torch.randn(s[1], s[0], s[2], s[3]).transpose(0, 1),
    ],
    ids=["contiguous", "blhd", "hbld"],
)
def test_output_laid_out_like_cpus(layout):
    q = layout((4, 4, 3, 8))
    k, v = torch.randn(4, 4, 6, 8), torch.randn(4, 4, 6, 8)
    out_cpu, lse_cpu = FLASH(q, k, v, 0.0, True)
    out, lse = FLASH(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), 0.0, True)
    assert out.stride() == out_cpu.stride() and lse.stride() == lse_cpu.stride()
    torch.testing.assert_close(out.cpu(), out_cpu)


def test_different_head_sizes_raise_like_cpu():
    q, k, v = torch.randn(1, 2, 3, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 16)
    with pytest.raises(RuntimeError, match="same head size"):
        FLASH(q, k, v, 0.0, False)
    with pytest.raises(RuntimeError, match="same head size"):
        FLASH(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE), 0.0, False)


def test_strided_head_dim_through_sdpa_matches_float64():
    # CPU's flash op itself is wrong for a query whose last dim is strided
    # (off by ~1 on torch 2.13 when called directly); SDPA's selection never
    # sends one there, and neither does ember.
    q = torch.randn(4, 4, 3, 16, device=DEVICE)[..., ::2]
    k, v = torch.randn(4, 4, 6, 8, device=DEVICE), torch.randn(4, 4, 6, 8, device=DEVICE)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref = _reference(q.cpu(), k.cpu(), v.cpu(), None, True)
    torch.testing.assert_close(out.cpu().double(), ref, rtol=1e-5, atol=1e-6)


def test_split_views_like_gpt2_take_embers_kernel(capfd):
    # GPT-2 splits one [b, s, 3*h*d] projection into q, k, v: views that are
    # not dense. CPU lays the output out as empty_like(q) does for them.
    qkv = torch.randn(2, 20, 3 * 4 * 16)
    q, k, v = (t.view(2, 20, 4, 16).transpose(1, 2) for t in qkv.split(64, dim=2))
    out_cpu, lse_cpu = FLASH(q, k, v, 0.0, True)
    qkv_e = qkv.to(DEVICE)
    qe, ke, ve = (t.view(2, 20, 4, 16).transpose(1, 2) for t in qkv_e.split(64, dim=2))
    with be.verbose(1):
        out, lse = FLASH(qe, ke, ve, 0.0, True)
    if VECTOR_KERNELS:
        assert "ember/attention" in capfd.readouterr().err
    assert out.stride() == out_cpu.stride() and lse.stride() == lse_cpu.stride()
    torch.testing.assert_close(out.cpu(), out_cpu)
    torch.testing.assert_close(lse.cpu(), lse_cpu)


@pytest.mark.parametrize("shape", SHAPES[:5], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mask_kind", [None, "additive", "padding"])
@pytest.mark.parametrize("causal", [False, True])
def test_bf16_is_computed_in_fp32_and_rounded_once(shape, mask_kind, causal, capfd):
    """bf16 operands run ember's fp32 kernel on exact fp32 copies, rounding
    the probabilities to bf16 before P V as CPU's bf16 kernel does: CPU's
    result within bf16 rounding, as close to float64 as CPU's,
    logsumexp in fp32 as CPU's, output in bf16 laid out like CPU's."""
    if not VECTOR_KERNELS:
        pytest.skip("ember's attention kernel needs AVX-512F or AVX2")
    b, h, lq, lk, d = shape
    q, k, v = (t.bfloat16() for t in _qkv(b, h, lq, lk, d, seed=lq + 3 * lk))
    mask = _mask(mask_kind, b, h, lq, lk)
    mask = None if mask is None else mask.bfloat16()
    out_cpu, lse_cpu = FLASH(q, k, v, 0.0, causal, attn_mask=mask)
    qe, ke, ve = (t.to(DEVICE) for t in (q, k, v))
    me = None if mask is None else mask.to(DEVICE)
    with be.verbose(1):
        out, lse = FLASH(qe, ke, ve, 0.0, causal, attn_mask=me)
    assert "ember/attention-bf16" in capfd.readouterr().err
    assert out.dtype == torch.bfloat16 and lse.dtype == lse_cpu.dtype == torch.float32
    assert out.stride() == out_cpu.stride() and lse.stride() == lse_cpu.stride()
    ref = _reference(q, k, v, mask, causal)
    err = (out.cpu().double() - ref).abs().max().item()
    cpu_err = (out_cpu.double() - ref).abs().max().item()
    assert err <= cpu_err + 2**-8 * ref.abs().max().item(), (err, cpu_err)
    # near-zero outputs (sums that cancel) differ by accumulation order only
    scale = ref.abs().max().item()
    torch.testing.assert_close(out.cpu(), out_cpu, rtol=1.6e-2, atol=2**-8 * scale)
    torch.testing.assert_close(lse.cpu(), lse_cpu, rtol=1e-3, atol=1e-3)


@pytest.mark.usefixtures("queued_launches")
@pytest.mark.parametrize(
    "shape", [SHAPES[4], SHAPES[0], SHAPES[1]], ids=lambda s: "x".join(map(str, s))
)
@pytest.mark.parametrize("causal", [False, True])
def test_bf16_reads_its_operands_in_place_and_launches(shape, causal):
    """Without a mask, bf16 attention is launched on the stream as fp32's is,
    and its kernel reads the bf16 operands where they are (widening each
    row as it goes): no fp32 copy of Q, K or V is allocated (a decode step
    used to copy the whole KV cache to fp32), and the result is bitwise the
    one computed at the call."""
    if not VECTOR_KERNELS:
        pytest.skip("ember's attention kernel needs AVX-512F or AVX2")
    b, h, lq, lk, d = shape
    q, k, v = (t.bfloat16().to(DEVICE) for t in _qkv(b, h, lq, lk, d, seed=5 * lk + lq))
    with be.flags(async_execution=False):
        out_sync, lse_sync = FLASH(q, k, v, 0.0, causal)
    torch.ember.synchronize()
    torch_ember.reset_launch_stats()
    torch.ember.reset_peak_memory_stats()
    before = torch.ember.memory_allocated()
    with be.flags(async_execution=True):
        out, lse = FLASH(q, k, v, 0.0, causal)
        torch.ember.synchronize()
    peak = torch.ember.max_memory_allocated() - before
    # the results (bf16 out, its fp32 staging, fp32 logsumexp), nothing of K's size in fp32
    assert peak < out.nbytes * 3 + lse.nbytes + 4 * 512, (peak, k.nbytes)
    stats = torch_ember.launch_stats()
    name = "aten::_scaled_dot_product_flash_attention_for_cpu"
    if out.numel() < 1 << 16:  # larger results run at the call on an idle stream
        assert stats.get(name, {}).get("launched", 0) == 1, stats
    assert torch.equal(out.cpu(), out_sync.cpu()) and torch.equal(lse.cpu(), lse_sync.cpu())
    assert out.dtype == torch.bfloat16 and out.stride() == out_sync.stride()


@pytest.mark.parametrize(
    "shape",
    [(1, 8, 1, 33, 64), (2, 6, 20, 20, 16), (1, 8, 32, 32, 64)],
    ids=lambda s: "x".join(map(str, s)),
)
@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("causal", [False, True])
def test_grouped_query_attention_takes_embers_kernel_and_is_launched(shape, kv_heads, causal):
    """Fewer key/value heads than query heads (Llama's, Mistral's, Qwen's
    enable_gqa=True): query head h reads key/value head h // group, as CPU's
    kernel does, and the call is launched on the stream instead of running
    CPU's kernel at the call (which drained the queue before every decode
    step's attention and left OpenMP threads spinning beside the worker)."""
    if not VECTOR_KERNELS:
        pytest.skip("ember's attention kernel needs AVX-512F or AVX2")
    b, h, lq, lk, d = shape
    q, _, _ = _qkv(b, h, lq, lk, d, seed=lq)
    _, k, v = _qkv(b, kv_heads, lq, lk, d, seed=lk + 1)
    out_cpu, lse_cpu = FLASH(q, k, v, 0.0, causal)
    group = h // kv_heads
    ref = _reference(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), None, causal)
    qe, ke, ve = (t.to(DEVICE) for t in (q, k, v))
    torch.ember.synchronize()
    torch_ember.reset_launch_stats()
    with be.flags(async_execution=True):
        sleep_on_stream()
        begin = time.monotonic()
        out = F.scaled_dot_product_attention(qe, ke, ve, is_causal=causal, enable_gqa=True)
        _, lse = FLASH(qe, ke, ve, 0.0, causal)
        assert returned_before_the_sleep_ended(begin)  # queued behind the sleep
        torch.ember.synchronize()
    assert launched_count("aten::_scaled_dot_product_flash_attention_for_cpu") == 2
    assert out.stride() == out_cpu.stride() and lse.stride() == lse_cpu.stride()
    err = (out.cpu().double() - ref).abs().max().item()
    cpu_err = (out_cpu.double() - ref).abs().max().item()
    assert err <= 4 * cpu_err + 1e-6, (err, cpu_err)
    torch.testing.assert_close(lse.cpu(), lse_cpu, rtol=1e-5, atol=1e-5)


def test_grouped_query_attention_with_uneven_groups_raises_like_cpu():
    q, k, v = _qkv(1, 8, 4, 6, 16)
    k3, v3 = k[:, :3], v[:, :3]
    with pytest.raises(RuntimeError) as on_cpu:
        F.scaled_dot_product_attention(q, k3, v3, enable_gqa=True)
    with pytest.raises(RuntimeError) as on_ember:
        F.scaled_dot_product_attention(q.to(DEVICE), k3.to(DEVICE), v3.to(DEVICE), enable_gqa=True)
    assert str(on_ember.value) == str(on_cpu.value)


@pytest.mark.parametrize("mask_kind", [None, "float", "bool"])
@pytest.mark.parametrize("lq", [1, 7])
def test_multi_query_attention_as_a_broadcast_takes_embers_kernel(mask_kind, lq):
    """One key/value head broadcast against the query's heads without
    enable_gqa (Falcon's multi-query attention): CPU takes sdpa's math path
    (a dozen small ops, each of which drained the queue in a decode step);
    in inference ember runs its own kernel, launched, within CPU's
    tolerance of the math path."""
    if not VECTOR_KERNELS:
        pytest.skip("ember's attention kernel needs AVX-512F or AVX2")
    q, _, _ = _qkv(1, 8, lq, 1, 64, seed=3)
    _, k, v = _qkv(1, 1, lq, 12, 64, seed=4)
    mask = None
    if mask_kind == "float":
        mask = torch.randn(1, 1, lq, 12)
        mask[..., 0, :3] = float("-inf")
    elif mask_kind == "bool":
        mask = torch.rand(1, 1, lq, 12) > 0.3
        mask[..., 0, :] = False  # a row masked whole: zeros, as CPU's math path
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    args = [t.to(DEVICE) for t in (q, k, v)]
    emask = None if mask is None else mask.to(DEVICE)
    torch.ember.synchronize()
    torch_ember.reset_launch_stats()
    with torch.inference_mode(), be.flags(async_execution=True):
        sleep_on_stream()
        begin = time.monotonic()
        out = F.scaled_dot_product_attention(*args, attn_mask=emask)
        assert returned_before_the_sleep_ended(begin)
        torch.ember.synchronize()
    assert launched_count("aten::_scaled_dot_product_flash_attention_for_cpu") == 1
    assert not any(v["waited"] for v in torch_ember.launch_stats().values())
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-5, atol=1e-5)


def test_multi_query_attention_as_a_broadcast_keeps_cpus_path_for_training_and_parity():
    """With gradients to compute, or under cpu_parity, the broadcast heads
    take CPU's math path, as on CPU (CPU's flash backward takes no broadcast
    heads; parity is CPU's choice)."""
    q, _, _ = _qkv(1, 4, 3, 1, 16, seed=5)
    _, k, v = _qkv(1, 1, 3, 6, 16, seed=6)
    expected = F.scaled_dot_product_attention(q, k, v)
    qe = q.to(DEVICE).requires_grad_()
    ke, ve = k.to(DEVICE), v.to(DEVICE)
    torch_ember.reset_launch_stats()
    with be.flags(async_execution=True):
        out = F.scaled_dot_product_attention(qe, ke, ve)
        out.sum().backward()
        torch.ember.synchronize()
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" not in torch_ember.launch_stats()
    torch.testing.assert_close(out.detach().cpu(), expected, rtol=1e-5, atol=1e-5)
    assert qe.grad is not None and qe.grad.shape == q.shape
    with torch.inference_mode(), be.flags(cpu_parity=True):
        parity = F.scaled_dot_product_attention(q.to(DEVICE), ke, ve)
    assert torch.equal(parity.cpu(), expected)
