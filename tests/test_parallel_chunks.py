"""ember's own kernels split their work into chunks that whichever thread is
free takes (runtime/chunk_team.h, ops/kernels/ParallelChunks.h; the skinny
GEMM splits its packed weight): a late thread is never waited for, and
every output is still computed by one thread in one order. So 1, 2 or 4
threads, launched or at the call, give the same bits, call after call."""

import pytest
import torch
import torch.nn.functional as F
from isa import VECTOR_KERNELS

DEVICE = "ember"


def _cases():
    """Shapes large enough for many chunks."""
    g = torch.Generator().manual_seed(7)

    def on_device(*shape):
        return torch.randn(*shape, generator=g).to(DEVICE)

    x = on_device(64, 3072)
    img = on_device(2, 32, 56, 56)
    img_cl = img.contiguous(memory_format=torch.channels_last)
    q, k, v = (on_device(1, 12, 128, 64) for _ in range(3))
    q1 = on_device(1, 12, 1, 64)
    lin = torch.nn.Linear(768, 3072).to(DEVICE)  # 9 MiB packed: dozens of chunks
    rows = {m: on_device(m, 768) for m in (1, 3, 16)}
    mean, var = on_device(32), torch.rand(32).to(DEVICE) + 0.5
    weight, bias = on_device(32), on_device(32)
    cases = {
        "tanh": lambda: torch.tanh(x),
        "sdpa_prefill": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "sdpa_decode": lambda: F.scaled_dot_product_attention(q1, k, v),
        "max_pool": lambda: F.max_pool2d(img, 3, 2, 1),
        "batch_norm": lambda: F.batch_norm(img, mean, var, weight, bias),
        "batch_norm_channels_last": lambda: F.batch_norm(img_cl, mean, var, weight, bias),
    }
    for m, row in rows.items():
        cases[f"skinny_linear_m{m}"] = lambda row=row: lin(row)
    return cases


@pytest.mark.parametrize("name", list(_cases()))
def test_own_kernels_give_the_same_bits_at_any_thread_count(name):
    if name.startswith("sdpa") and not VECTOR_KERNELS:
        pytest.skip(
            "ember's attention kernel needs AVX-512F or AVX2 (CPU's splits by thread count)"
        )
    fn = _cases()[name]  # built outside inference mode: packable weights
    with torch.inference_mode():
        fn()  # packs the linear's weight
        threads = torch.get_num_threads()
        results = []
        try:
            for n in (1, 2, 4):
                torch.set_num_threads(n)
                for launched in (False, True):
                    with torch.backends.ember.flags(async_execution=launched):
                        results += [fn().cpu() for _ in range(2)]
        finally:
            torch.set_num_threads(threads)
    for r in results[1:]:
        assert torch.equal(r, results[0])
