"""Memory of ember devices: the caching allocator's statistics (torch.cuda's
names and keys), empty_cache, memory limits and OutOfMemoryError, per-device
pools, and the guarantee that CPU kernels allocate from the ember pool."""

import gc

import pytest
import torch
import torch.nn.functional as F

import torch_ember

MiB = 1 << 20

pytestmark = pytest.mark.usefixtures("clean_memory")

CUDA_STAT_KEYS = [
    "allocated_bytes.all.current",
    "allocated_bytes.all.peak",
    "allocated_bytes.all.allocated",
    "allocated_bytes.all.freed",
    "reserved_bytes.all.current",
    "reserved_bytes.all.peak",
    "allocation.all.current",
    "segment.all.current",
    "active.all.current",
    "num_ooms",
    "num_alloc_retries",
    "requested_bytes.all.current",
    "active_bytes.all.current",
    "inactive_split_bytes.all.current",
]


def test_memory_allocated_grows_and_returns_after_del():
    before = torch.ember.memory_allocated()
    x = torch.empty(MiB, dtype=torch.uint8, device="ember")
    assert torch.ember.memory_allocated() - before >= x.nbytes
    assert torch.ember.memory_allocated(0) == torch.ember.memory_allocated()
    assert torch.ember.memory_allocated("ember:0") == torch.ember.memory_allocated()
    del x
    assert torch.ember.memory_allocated() == before


def test_max_memory_allocated_and_reset_peak():
    before = torch.ember.memory_allocated()
    x = torch.empty(4 * MiB, dtype=torch.uint8, device="ember")
    del x
    assert torch.ember.memory_allocated() == before
    assert torch.ember.max_memory_allocated() >= before + 4 * MiB
    torch.ember.reset_peak_memory_stats()
    assert torch.ember.max_memory_allocated() == torch.ember.memory_allocated()
    assert torch.ember.max_memory_reserved() == torch.ember.memory_reserved()


def test_memory_reserved_covers_allocated():
    tensors = [torch.empty(n * 1000 + 13, device="ember") for n in range(1, 50)]
    assert torch.ember.memory_reserved() >= torch.ember.memory_allocated()
    assert torch.ember.max_memory_reserved() >= torch.ember.memory_reserved()
    assert torch.ember.memory_allocated() >= sum(t.nbytes for t in tensors)


def test_memory_stats_have_cuda_key_names():
    x = torch.empty(1000, dtype=torch.uint8, device="ember")
    stats = torch.ember.memory_stats()
    missing = [key for key in CUDA_STAT_KEYS if key not in stats]
    assert not missing
    for key in CUDA_STAT_KEYS:
        assert isinstance(stats[key], int), key
    assert stats["allocated_bytes.all.current"] == torch.ember.memory_allocated()
    assert stats["reserved_bytes.all.current"] == torch.ember.memory_reserved()
    assert stats["allocation.all.current"] >= 1
    assert stats["segment.all.current"] >= 1
    assert stats["reserved_bytes.all.peak"] >= stats["reserved_bytes.all.current"]
    nested = torch.ember.memory_stats_as_nested_dict()
    assert nested["allocated_bytes"]["all"]["current"] == stats["allocated_bytes.all.current"]
    del x


def test_memory_stats_count_one_allocation():
    before = torch.ember.memory_stats()
    x = torch.empty(1000, dtype=torch.uint8, device="ember")
    after = torch.ember.memory_stats()
    assert after["allocation.all.current"] == before["allocation.all.current"] + 1
    assert after["active.all.current"] == before["active.all.current"] + 1
    assert after["requested_bytes.all.current"] == before["requested_bytes.all.current"] + 1000
    grown = after["allocated_bytes.all.current"] - before["allocated_bytes.all.current"]
    assert grown >= 1000
    assert after["active_bytes.all.current"] - before["active_bytes.all.current"] == grown
    del x
    freed = torch.ember.memory_stats()
    assert freed["allocation.all.current"] == before["allocation.all.current"]
    assert freed["requested_bytes.all.current"] == before["requested_bytes.all.current"]
    assert freed["allocated_bytes.all.freed"] >= before["allocated_bytes.all.freed"] + 1000


def test_reset_accumulated_memory_stats():
    x = torch.empty(MiB, dtype=torch.uint8, device="ember")
    del x
    assert torch.ember.memory_stats()["allocated_bytes.all.allocated"] >= MiB
    torch.ember.reset_accumulated_memory_stats()
    stats = torch.ember.memory_stats()
    assert stats["allocated_bytes.all.allocated"] == 0
    assert stats["allocated_bytes.all.freed"] == 0


def test_accelerator_memory_api_agrees():
    x = torch.empty(3 * MiB, dtype=torch.uint8, device="ember")
    assert torch.accelerator.memory_allocated() == torch.ember.memory_allocated()
    assert torch.accelerator.memory_allocated(0) == torch.ember.memory_allocated(0)
    assert torch.accelerator.memory_reserved() == torch.ember.memory_reserved()
    assert torch.accelerator.max_memory_allocated() == torch.ember.max_memory_allocated()
    assert torch.accelerator.max_memory_reserved() == torch.ember.max_memory_reserved()
    accelerator_stats = torch.accelerator.memory_stats()
    ember_stats = torch.ember.memory_stats()
    for key in ("allocated_bytes.all.current", "reserved_bytes.all.current", "num_ooms"):
        assert accelerator_stats[key] == ember_stats[key], key
    del x


def test_empty_cache_releases_unused_segments():
    baseline_allocated = torch.ember.memory_allocated()
    baseline_reserved = torch.ember.memory_reserved()
    tensors = [torch.empty(n * 4096 + 17, device="ember") for n in range(200)]
    tensors += [torch.empty(8 * MiB, dtype=torch.uint8, device="ember") for _ in range(4)]
    assert torch.ember.memory_reserved() > baseline_reserved
    del tensors
    gc.collect()
    assert torch.ember.memory_allocated() == baseline_allocated
    assert torch.ember.memory_reserved() > baseline_reserved  # still cached
    torch.ember.empty_cache()
    assert torch.ember.memory_allocated() == baseline_allocated
    assert torch.ember.memory_reserved() == baseline_reserved


def test_empty_cache_drops_reserved_to_allocated(run_python):
    """In a fresh process (no other live tensors) reserved ends equal to allocated."""
    code = (
        "import torch\n"
        "keep = torch.empty(64 * 1024 * 1024, dtype=torch.uint8, device='ember')\n"
        "ts = [torch.empty(n * 4096 + 17, device='ember') for n in range(300)]\n"
        "ts += [torch.empty(1 << 22, dtype=torch.uint8, device='ember') for _ in range(8)]\n"
        "grown = torch.ember.memory_reserved() > torch.ember.memory_allocated()\n"
        "del ts\n"
        "torch.ember.empty_cache()\n"
        "print(grown, torch.ember.memory_reserved() == torch.ember.memory_allocated(),\n"
        "      torch.ember.memory_allocated() >= keep.nbytes)\n"
        "del keep\n"
        "torch.ember.empty_cache()\n"
        "print(torch.ember.memory_reserved(), torch.ember.memory_allocated(),\n"
        "      torch.ember.memory_stats()['segment.all.current'])\n"
    )
    result = run_python(code, env={"EMBER_DEVICES": None})
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["True True True", "0 0 0"]


def test_mem_get_info():
    free, total = torch.ember.mem_get_info()
    assert 0 <= free <= total
    assert total == torch.ember.get_device_properties(0).total_memory
    x = torch.empty(8 * MiB, dtype=torch.uint8, device="ember")
    free_after, total_after = torch.ember.mem_get_info()
    assert total_after == total
    assert free_after <= free - 8 * MiB
    del x


def _limit_device_to(limit_bytes: int, device: int = 0) -> None:
    total = torch.ember.get_device_properties(device).total_memory
    torch.ember.set_per_process_memory_fraction(limit_bytes / total, device)


def test_memory_fraction_limits_allocations():
    small = torch.ones(1000, device="ember")
    allocated = torch.ember.memory_allocated()
    ooms = torch.ember.memory_stats()["num_ooms"]
    try:
        _limit_device_to(256 * MiB)
        free, total = torch.ember.mem_get_info()
        assert abs(total - 256 * MiB) < MiB
        assert free <= total
        with pytest.raises(torch.OutOfMemoryError) as info:
            torch.empty(512 * MiB, dtype=torch.uint8, device="ember")
        message = str(info.value)
        assert "512.00 MiB" in message  # the request
        assert "allocated" in message
        assert "reserved" in message
        assert "256.00 MiB" in message  # the limit
        assert "ember:0" in message
        assert isinstance(info.value, RuntimeError)  # as torch.cuda.OutOfMemoryError
        # The failed request changed nothing but the OOM counter.
        assert torch.ember.memory_allocated() == allocated
        assert torch.ember.memory_stats()["num_ooms"] == ooms + 1
        # The process continues: allocations within the limit still work.
        y = torch.empty(16 * MiB, dtype=torch.uint8, device="ember")
        assert torch.equal((small + 1).cpu(), torch.full((1000,), 2.0))
        del y
    finally:
        torch.ember.set_per_process_memory_fraction(1.0)
    assert torch.ember.mem_get_info()[1] == torch.ember.get_device_properties(0).total_memory
    big = torch.empty(512 * MiB, dtype=torch.uint8, device="ember")
    assert big.nbytes == 512 * MiB
    del big


def test_memory_fraction_limits_op_outputs():
    """Outputs of CPU kernels come from the ember pool, so the limit applies to them."""
    column = torch.ones(16384, 1, device="ember")
    allocated = torch.ember.memory_allocated()
    ooms = torch.ember.memory_stats()["num_ooms"]
    try:
        _limit_device_to(256 * MiB)
        with pytest.raises(torch.OutOfMemoryError):
            torch.mm(column, column.t())  # 1 GiB result
        with pytest.raises(torch.OutOfMemoryError):
            column.expand(16384, 16384).contiguous()
        assert torch.ember.memory_allocated() == allocated
        assert torch.ember.memory_stats()["num_ooms"] == ooms + 2
        product = torch.mm(column[:10], column[:10].t())
        assert torch.equal(product.cpu(), torch.ones(10, 10))
    finally:
        torch.ember.set_per_process_memory_fraction(1.0)


@pytest.mark.parametrize("fraction", [1.5, -0.1, 0.0])
def test_invalid_memory_fraction_raises_value_error(fraction):
    limit = torch.ember.mem_get_info()[1]
    with pytest.raises(ValueError):
        torch.ember.set_per_process_memory_fraction(fraction)
    assert torch.ember.mem_get_info()[1] == limit


def test_memory_fraction_rejects_non_numbers():
    with pytest.raises(TypeError):
        torch.ember.set_per_process_memory_fraction("0.5")


@pytest.mark.requires_two_devices
def test_per_device_pools():
    stats0 = torch.ember.memory_stats(0)
    before1 = torch.ember.memory_allocated(1)
    x = torch.empty(8 * MiB, dtype=torch.uint8, device="ember:1")
    assert torch.ember.memory_allocated("ember:1") - before1 >= 8 * MiB
    assert torch.accelerator.memory_allocated(1) == torch.ember.memory_allocated(1)
    after0 = torch.ember.memory_stats(0)
    for key in (
        "allocated_bytes.all.current",
        "reserved_bytes.all.current",
        "allocation.all.current",
        "segment.all.current",
    ):
        assert after0[key] == stats0[key], key
    # An op on ember:1 allocates its output on ember:1.
    ones = torch.ones(64, 64, device="ember:1")
    y = torch.mm(ones, ones)
    assert y.device == torch.device("ember", 1)
    allocated0 = torch.ember.memory_stats(0)["allocated_bytes.all.current"]
    assert allocated0 == stats0["allocated_bytes.all.current"]
    del x, y, ones
    assert torch.ember.memory_allocated(1) == before1


@pytest.mark.requires_two_devices
def test_memory_limit_is_per_device():
    try:
        _limit_device_to(256 * MiB, device=1)
        with pytest.raises(torch.OutOfMemoryError) as info:
            torch.empty(512 * MiB, dtype=torch.uint8, device="ember:1")
        assert "ember:1" in str(info.value)
        x = torch.empty(512 * MiB, dtype=torch.uint8, device="ember:0")
        del x
    finally:
        torch.ember.set_per_process_memory_fraction(1.0, 1)


def test_op_outputs_are_counted():
    x = torch.randn(256, 256, device="ember")
    before = torch.ember.memory_allocated()
    y = torch.mm(x, x)
    assert torch.ember.memory_allocated() - before >= y.nbytes
    z = torch.nonzero(x > 0)
    assert torch.ember.memory_allocated() - before >= y.nbytes + z.nbytes
    del y, z
    assert torch.ember.memory_allocated() == before


def _common_ops(device: str) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(16, 16, generator=generator).to(device)
    w = torch.randn(16, 16, generator=generator).to(device)
    index = torch.tensor([0, 3, 5])
    values, order = torch.sort(x, dim=-1)
    return [
        x + w,
        torch.add(x, w, alpha=2),
        x @ w,
        torch.matmul(x, w[:, :3]),
        F.softmax(x, dim=-1),
        values,
        order,
        torch.nonzero(x > 0),
        x[index],  # CPU index tensor
        x[index.to(device)],
        x[x > 0],
        x[:, order[:, 0]],
        torch.cat([x, w]),
        torch.cat([x, w], dim=1),
        torch.stack([x, w]),
        x.sum(dim=0),
        torch.where(x > 0, x, w),
    ]


def test_common_ops_run_zero_copy():
    torch_ember.reset_fallback_stats()
    results = _common_ops("ember")
    assert torch_ember.fallback_stats() == {}
    for result, expected in zip(results, _common_ops("cpu"), strict=True):
        assert result.device.type == "ember"
        torch.testing.assert_close(result.cpu(), expected)  # ember's GEMMs: within rounding


def test_common_ops_pass_in_strict_mode():
    was_strict = torch_ember.is_strict()
    torch_ember.set_strict(True)
    try:
        assert torch_ember.is_strict()
        results = _common_ops("ember")
        assert len(results) == len(_common_ops("cpu"))
    finally:
        torch_ember.set_strict(was_strict)
    assert torch_ember.fallback_stats() == {}


def test_conv2d_runs_zero_copy():
    generator = torch.Generator().manual_seed(0)
    image = torch.randn(2, 3, 8, 8, generator=generator)
    weight = torch.randn(4, 3, 3, 3, generator=generator)
    bias = torch.randn(4, generator=generator)
    torch_ember.reset_fallback_stats()
    out = F.conv2d(image.to("ember"), weight.to("ember"), bias.to("ember"), padding=1)
    assert torch_ember.fallback_stats() == {}
    assert out.device.type == "ember"
    # 8 x 8 outputs run as ember's channel GEMM: within fp32 rounding of CPU.
    torch.testing.assert_close(out.cpu(), F.conv2d(image, weight, bias, padding=1))


# ---------------------------------------------------------------------------
# EMBER_DEBUG_HEAP: canaries after CPU-kernel allocations report an overrun

HEAP_OVERRUN = """
import ctypes, sys, torch
torch.backends.ember.cpu_parity = True  # sin: ATen's CPU kernel allocates the output
x = torch.randn(1000, device="ember")
for past_end, length in [(0, 64), (200, 1), (None, 0)]:
    y = torch.sin(x)
    end = y.untyped_storage().data_ptr() + y.untyped_storage().nbytes()
    if past_end is not None:
        ctypes.memset(end + past_end, 0x11, length)  # the bug a kernel would have
    print(f"case {past_end}", file=sys.stderr, flush=True)
    del y  # the check runs when the block is freed
print("done", file=sys.stderr, flush=True)
"""


def test_debug_heap_reports_an_overrun_with_the_op(run_python):
    result = run_python(HEAP_OVERRUN, env={"EMBER_DEBUG_HEAP": "1"})
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith(("case", "[ember]"))]
    assert lines == [
        "case 0",
        "[ember] heap check: 4000-byte block from aten::sin written up to 64 bytes past its end",
        "case 200",
        "[ember] heap check: 4000-byte block from aten::sin written up to 201 bytes past its end",
        "case None",  # an untouched block: nothing reported
    ]


def _asan_loaded() -> bool:
    with open("/proc/self/maps") as maps:
        return "libasan" in maps.read()


@pytest.mark.skipif(not _asan_loaded(), reason="only under make sanitize (ASan)")
def test_asan_reports_a_write_past_an_ember_tensor(run_python):
    """make sanitize: the allocator poisons the slack behind every block, so
    the issue's 64-byte overrun is reported (it went unseen before)."""
    code = (
        "import ctypes, torch\n"
        "x = torch.empty(1000, device='ember')\n"
        "end = x.data_ptr() + 4000\n"
        "ctypes.memset(end - 64, 0, 64)\n"  # the tensor's own last bytes: fine
        "print('inside ok', flush=True)\n"
        "ctypes.memset(end, 0, 64)\n"
        "print('not reported', flush=True)\n"
    )
    result = run_python(code)
    assert result.stdout.split("\n")[0] == "inside ok"
    assert "not reported" not in result.stdout
    assert result.returncode != 0
    assert "AddressSanitizer: use-after-poison" in result.stderr
    assert "WRITE of size 64" in result.stderr
