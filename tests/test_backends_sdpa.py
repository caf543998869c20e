"""Attention selection on ember: ``torch.backends.ember`` flash/math switches
and ``torch.nn.attention.sdpa_kernel`` decide which kernel
``scaled_dot_product_attention`` runs (ember makes CPU's choice, see
csrc/ops/kernels/Attention.cpp); under cpu_parity both paths equal CPU bitwise,
forward and backward (by default the flash path is ember's own kernel, within
tolerance: tests/test_attention.py), with causal, boolean and additive masks; dropout is seeded and
drops about p; the flash path keeps memory O(L*d)."""

import gc

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

import torch_ember.backends as ember_backends

FLASH_OP = "aten._scaled_dot_product_flash_attention_for_cpu"
# Both "no kernel" messages CPU raises: all backends off / the allowed ones refuse the inputs.
NO_KERNEL = "No viable backend|No available kernel"


class _RecordOps(TorchDispatchMode):
    """Records the aten overload packets that run, with their tensors' device types."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, set[str]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        devices = {
            a.device.type
            for a in (*args, *kwargs.values())
            if isinstance(a, torch.Tensor) and a.numel() > 1
        }
        self.ops.append((str(func.overloadpacket), devices))
        return func(*args, **kwargs)

    def names(self) -> list[str]:
        return [name for name, _ in self.ops]


@pytest.fixture(autouse=True)
def _restore_sdp_switches():
    flash, math = ember_backends.flash_sdp_enabled(), ember_backends.math_sdp_enabled()
    yield
    ember_backends.enable_flash_sdp(flash)
    ember_backends.enable_math_sdp(math)


def _qkv(device: str, shape=(2, 4, 96, 32), seed: int = 0) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator).to(device) for _ in range(3)]


def _ops_of_attention(device: str = "ember", **kwargs) -> list[str]:
    q, k, v = _qkv(device)
    with _RecordOps() as record:
        F.scaled_dot_product_attention(q, k, v, **kwargs)
    assert all(devices <= {device} for _, devices in record.ops), record.ops
    return record.names()


def _ran_flash(ops: list[str]) -> bool:
    return FLASH_OP in ops


def _ran_math(ops: list[str]) -> bool:
    return FLASH_OP not in ops and "aten.bmm" in ops


# -- which kernel runs -------------------------------------------------------------


def test_default_runs_cpu_flash_attention_on_ember():
    assert ember_backends.flash_sdp_enabled() and ember_backends.math_sdp_enabled()
    ops = _ops_of_attention()
    assert _ran_flash(ops) and "aten.bmm" not in ops


@pytest.mark.parametrize("is_causal", [False, True])
def test_sdpa_kernel_selects_the_path(is_causal):
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        assert _ran_flash(_ops_of_attention(is_causal=is_causal))
    with sdpa_kernel([SDPBackend.MATH]):
        assert not ember_backends.flash_sdp_enabled()  # one set of switches
        assert _ran_math(_ops_of_attention(is_causal=is_causal))
    assert ember_backends.flash_sdp_enabled()


def test_ember_switches_select_the_path():
    ember_backends.enable_flash_sdp(False)
    assert not torch.backends.cuda.flash_sdp_enabled()  # the same process-wide switch
    assert _ran_math(_ops_of_attention())
    ember_backends.enable_flash_sdp(True)
    ember_backends.enable_math_sdp(False)
    assert _ran_flash(_ops_of_attention())
    with ember_backends.flags(flash_sdp=False, math_sdp=True):
        assert _ran_math(_ops_of_attention(is_causal=True))
    assert ember_backends.flash_sdp_enabled() and not ember_backends.math_sdp_enabled()


@pytest.mark.parametrize("backends", [[SDPBackend.FLASH_ATTENTION], [SDPBackend.MATH], None])
def test_ember_makes_cpus_choice(backends):
    context = sdpa_kernel(backends) if backends else ember_backends.flags()
    with context:
        assert _ops_of_attention("ember", is_causal=True) == _ops_of_attention(
            "cpu", is_causal=True
        )


def test_profiler_shows_the_selected_kernel():
    q, k, v = _qkv("ember")
    names = {}
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.MATH):
        with sdpa_kernel([backend]), torch.profiler.profile() as profile:
            F.scaled_dot_product_attention(q, k, v)
        names[backend] = {event.key for event in profile.key_averages()}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in names[SDPBackend.FLASH_ATTENTION]
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" not in names[SDPBackend.MATH]
    assert "aten::bmm" in names[SDPBackend.MATH]


def test_both_paths_disabled_raise_like_cpu():
    errors = {}
    for device in ("cpu", "ember"):
        q, k, v = _qkv(device)
        with (
            ember_backends.flags(flash_sdp=False, math_sdp=False),
            pytest.raises(RuntimeError, match=NO_KERNEL) as error,
        ):
            F.scaled_dot_product_attention(q, k, v)
        errors[device] = str(error.value)
    assert errors["ember"] == errors["cpu"]


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_flash_only_refuses_dropout_like_cpu():
    for device in ("cpu", "ember"):
        q, k, v = _qkv(device)
        with (
            sdpa_kernel([SDPBackend.FLASH_ATTENTION]),
            pytest.raises(RuntimeError, match=NO_KERNEL),
        ):
            F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)


# -- results equal CPU -------------------------------------------------------------


def _masks(length: int) -> dict[str, dict]:
    generator = torch.Generator().manual_seed(7)
    keep = torch.rand(length, length, generator=generator) > 0.3
    keep[:, 0] = True  # no fully masked row
    additive = torch.randn(2, 1, length, length, generator=generator)
    return {
        "none": {},
        "causal": {"is_causal": True},
        "bool_mask": {"attn_mask": keep},
        "float_mask": {"attn_mask": additive},
        "scale": {"scale": 0.3},
    }


def _forward_backward(device: str, backend: SDPBackend, kwargs: dict) -> list[torch.Tensor]:
    q, k, v = (t.requires_grad_() for t in _qkv(device))
    grad = torch.randn(q.shape, generator=torch.Generator().manual_seed(3)).to(device)
    kwargs = {
        name: value.to(device) if isinstance(value, torch.Tensor) else value
        for name, value in kwargs.items()
    }
    with sdpa_kernel([backend]):
        out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    out.backward(grad)
    return [t.detach().cpu() for t in (out, q.grad, k.grad, v.grad)]


def _ember_and_cpu(backend, mask):
    """(name, ember, cpu) for the output and the three input gradients."""
    kwargs = _masks(96)[mask]
    ember = _forward_backward("ember", backend, kwargs)
    cpu = _forward_backward("cpu", backend, kwargs)
    return zip(("out", "dq", "dk", "dv"), ember, cpu, strict=True)


BACKENDS = pytest.mark.parametrize(
    "backend", [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH], ids=["flash", "math"]
)


@pytest.mark.cpu_parity
@pytest.mark.parametrize("mask", list(_masks(96)))
@BACKENDS
def test_forward_and_backward_equal_cpu_bitwise(backend, mask):
    for name, e, c in _ember_and_cpu(backend, mask):
        assert torch.equal(e, c), (name, (e - c).abs().max().item())


@pytest.mark.parametrize("mask", list(_masks(96)))
@BACKENDS
def test_forward_and_backward_close_to_cpu_by_default(backend, mask):
    for _, e, c in _ember_and_cpu(backend, mask):
        torch.testing.assert_close(e, c, rtol=1e-4, atol=1e-5)


def test_flash_and_math_agree_to_rounding():
    flash = _forward_backward("ember", SDPBackend.FLASH_ATTENTION, {"is_causal": True})
    math = _forward_backward("ember", SDPBackend.MATH, {"is_causal": True})
    for f, m in zip(flash, math, strict=True):
        torch.testing.assert_close(f, m, rtol=1e-4, atol=1e-5)


# -- dropout (training) ------------------------------------------------------------


def _dropout_attention(p: float, seed: int, length: int = 256) -> tuple[torch.Tensor, ...]:
    # q = k = 0: every attention weight is 1/L; v = identity exposes each weight,
    # so every output element is 0 (dropped) or 1 / (L * (1 - p)) (kept, rescaled).
    q = torch.zeros(1, 2, length, length, device="ember", requires_grad=True)
    k = torch.zeros(1, 2, length, length, device="ember")
    v = torch.eye(length).expand(1, 2, length, length).to("ember").requires_grad_()
    torch.ember.manual_seed(seed)
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
    out.sum().backward()
    return out.detach().cpu(), v.grad.cpu()


def test_dropout_drops_about_p_and_rescales():
    p, length = 0.3, 256
    out, v_grad = _dropout_attention(p, seed=0, length=length)
    kept = out != 0
    assert abs(1 - kept.float().mean().item() - p) < 0.01  # 131072 draws: sd ~0.0013
    expected = torch.full_like(out, 1 / (length * (1 - p)))
    torch.testing.assert_close(out[kept], expected[kept])
    assert torch.isfinite(v_grad).all() and v_grad.abs().sum() > 0


def test_dropout_is_reproducible_under_a_seed():
    first, second, other = (_dropout_attention(0.5, seed) for seed in (11, 11, 12))
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(first[0], other[0])


def test_dropout_runs_the_math_path_when_allowed():
    assert _ran_math(_ops_of_attention(dropout_p=0.2))


# -- memory ------------------------------------------------------------------------


def _peak_bytes(backend: SDPBackend, length: int) -> int:
    q, k, v = (torch.randn(1, 8, length, 64, device="ember") for _ in range(3))
    gc.collect()
    torch.ember.empty_cache()
    torch.ember.reset_peak_memory_stats()
    base = torch.ember.memory_allocated()
    with sdpa_kernel([backend]), torch.no_grad():
        out = F.scaled_dot_product_attention(q, k, v)
    peak = torch.ember.max_memory_allocated() - base
    del out
    return peak


def test_flash_memory_is_far_below_math(clean_memory):
    length = 1024
    # Flash attention's scratch is per thread (a block of scores each): pin the
    # thread count so the bound holds on a many-core machine too.
    threads = torch.get_num_threads()
    torch.set_num_threads(min(threads, 2))
    try:
        flash = _peak_bytes(SDPBackend.FLASH_ATTENTION, length)
        math = _peak_bytes(SDPBackend.MATH, length)
    finally:
        torch.set_num_threads(threads)
    scores = 8 * length * length * 4  # one fp32 L x L matrix per head
    assert math >= scores  # math materialises the scores
    assert flash < scores / 4  # flash never does
    assert flash < math / 4
