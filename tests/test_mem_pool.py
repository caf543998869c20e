"""torch.ember.MemPool and torch.ember.use_mem_pool (issue 13), with
torch.cuda's semantics: allocations of the current thread inside the context
come from the pool's own segments, freed blocks go back to the pool, and a
pool's memory is returned by empty_cache only once the pool is gone and its
blocks are free."""

import gc
import threading

import pytest
import torch

import torch_ember  # noqa: F401

MiB = 1 << 20

pytestmark = pytest.mark.usefixtures("clean_memory")


def _pool_segments(pool_id):
    return [s for s in torch.ember.memory_snapshot() if tuple(s["segment_pool_id"]) == pool_id]


def _segment_of(tensor):
    address = tensor.data_ptr()
    return next(
        s
        for s in torch.ember.memory_snapshot()
        if s["address"] <= address < s["address"] + s["total_size"]
    )


def test_importable_where_cuda_has_it():
    from torch_ember.ember import memory

    assert torch.ember.MemPool is memory.MemPool is torch.ember.memory.MemPool
    assert torch.ember.use_mem_pool is torch.ember.memory.use_mem_pool
    assert "MemPool" in torch.ember.__all__ and "use_mem_pool" in torch.ember.__all__


def test_ids_and_use_count():
    first, second = torch.ember.MemPool(), torch.ember.MemPool()
    assert first.id[0] == 0 and second.id[0] == 0
    assert 0 < first.id[1] < second.id[1]
    assert first.allocator is None
    assert first.use_count() == 1
    with torch.ember.use_mem_pool(first):
        assert first.use_count() == 2
    assert first.use_count() == 1


def test_allocations_inside_come_from_the_pool_and_outside_do_not():
    before = torch.empty(1024, device="ember")  # a default-pool segment with room
    pool = torch.ember.MemPool()
    with torch.ember.use_mem_pool(pool):
        inside = torch.randn(256, device="ember")
        product = inside @ inside  # an op's output too
        big = torch.empty(3 * MiB, dtype=torch.uint8, device="ember")
    after = torch.empty(1024, device="ember")
    for tensor in (inside, product, big):
        assert tuple(_segment_of(tensor)["segment_pool_id"]) == pool.id
    for tensor in (before, after):
        assert tuple(_segment_of(tensor)["segment_pool_id"]) == (0, 0)
    # snapshot(): exactly the pool's segments, in memory_snapshot's format.
    snapshot = pool.snapshot()
    assert snapshot and all(tuple(s["segment_pool_id"]) == pool.id for s in snapshot)
    assert {s["address"] for s in snapshot} == {s["address"] for s in _pool_segments(pool.id)}
    assert {"device", "total_size", "segment_type", "blocks"} <= set(snapshot[0])
    allocated = [b["address"] for s in snapshot for b in s["blocks"]]
    assert inside.data_ptr() in allocated and big.data_ptr() in allocated
    assert torch.ember.memory_snapshot((0, 0)) == [
        s for s in torch.ember.memory_snapshot() if tuple(s["segment_pool_id"]) == (0, 0)
    ]


def test_freed_blocks_go_back_to_the_pool():
    pool = torch.ember.MemPool()
    with torch.ember.use_mem_pool(pool):
        x = torch.empty(64 * 1024, dtype=torch.uint8, device="ember")
    address = x.data_ptr()
    del x  # freed outside the context: still the pool's
    outside = torch.empty(64 * 1024, dtype=torch.uint8, device="ember")
    assert outside.data_ptr() != address
    with torch.ember.use_mem_pool(pool):
        again = torch.empty(64 * 1024, dtype=torch.uint8, device="ember")
    assert again.data_ptr() == address


def test_empty_cache_returns_pool_memory_only_once_the_pool_is_gone():
    pool = torch.ember.MemPool()
    pool_id = pool.id
    with torch.ember.use_mem_pool(pool):
        x = torch.empty(8 * MiB, dtype=torch.uint8, device="ember")
    del x
    torch.ember.empty_cache()
    assert _pool_segments(pool_id), "a live pool keeps its cache"
    reserved = torch.ember.memory_reserved()
    del pool
    gc.collect()
    assert not _pool_segments(pool_id)
    assert torch.ember.memory_reserved() <= reserved - 8 * MiB


def test_a_gone_pools_blocks_return_once_freed():
    pool = torch.ember.MemPool()
    pool_id = pool.id
    with torch.ember.use_mem_pool(pool):
        x = torch.empty(2 * MiB, dtype=torch.uint8, device="ember")
    del pool
    gc.collect()
    torch.ember.empty_cache()
    assert _pool_segments(pool_id), "the block is still in use"
    x.fill_(1)  # still valid memory
    del x
    torch.ember.empty_cache()
    assert not _pool_segments(pool_id)


def test_only_the_current_thread_routes():
    pool = torch.ember.MemPool()
    result = {}

    def other():
        result["t"] = torch.empty(4096, device="ember")

    with torch.ember.use_mem_pool(pool):
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        mine = torch.empty(4096, device="ember")
    assert tuple(_segment_of(result["t"])["segment_pool_id"]) == (0, 0)
    assert tuple(_segment_of(mine)["segment_pool_id"]) == pool.id


def test_nested_contexts_the_outer_pool_serves_as_on_cuda():
    outer, inner = torch.ember.MemPool(), torch.ember.MemPool()
    with torch.ember.use_mem_pool(outer):
        with torch.ember.use_mem_pool(inner):
            a = torch.empty(4096, device="ember")
        b = torch.empty(4096, device="ember")
    # CUDA's allocator takes the first route begun on the device.
    assert tuple(_segment_of(a)["segment_pool_id"]) == outer.id
    assert tuple(_segment_of(b)["segment_pool_id"]) == outer.id


@pytest.mark.requires_two_devices
def test_device_argument_routes_that_device_only():
    pool = torch.ember.MemPool()
    with torch.ember.use_mem_pool(pool, device="ember:1"):
        on_one = torch.empty(4096, device="ember:1")
        on_zero = torch.empty(4096, device="ember:0")
    assert tuple(_segment_of(on_one)["segment_pool_id"]) == pool.id
    assert _segment_of(on_one)["device"] == 1
    assert tuple(_segment_of(on_zero)["segment_pool_id"]) == (0, 0)


def test_unsupported_arguments_raise_clearly():
    with pytest.raises(NotImplementedError, match="custom allocators"):
        torch.ember.MemPool(allocator=object())
    with pytest.raises(NotImplementedError, match="use_on_oom"):
        torch.ember.MemPool(use_on_oom=True)
    with pytest.raises(NotImplementedError, match="no_split"):
        torch.ember.MemPool(no_split=True)
    with pytest.raises(TypeError, match="MemPool"), torch.ember.use_mem_pool((0, 1)):
        pass
    with pytest.raises(ValueError, match="not a memory pool id"):
        torch.ember.memory._C._mempool_use_count(0, (3, 0))


def test_stats_include_pool_memory():
    pool = torch.ember.MemPool()
    before = torch.ember.memory_allocated()
    with torch.ember.use_mem_pool(pool):
        x = torch.empty(MiB, dtype=torch.uint8, device="ember")
    assert torch.ember.memory_allocated() - before == MiB
    del x
    assert torch.ember.memory_allocated() == before
