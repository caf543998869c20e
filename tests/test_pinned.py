"""Pinned host memory and non_blocking copies: pin_memory() / pin_memory=True
give page-locked CPU tensors; a non_blocking copy from one into ember is
queued on the stream; DataLoader(pin_memory=True) works; record_stream keeps
a freed block from being reused while another stream may still use it."""

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from torch_ember import _C


def test_pin_memory_returns_a_pinned_cpu_copy():
    x = torch.arange(1000, dtype=torch.float32)
    assert not x.is_pinned()
    p = x.pin_memory()
    assert p.device.type == "cpu"
    assert p.is_pinned()
    assert torch.equal(p, x)
    assert p.data_ptr() != x.data_ptr()
    assert p.pin_memory().data_ptr() == p.data_ptr()  # already pinned


def test_pin_memory_factory_argument():
    t = torch.empty(64, 3, pin_memory=True)
    assert t.is_pinned()
    z = torch.zeros(10, pin_memory=True)
    assert z.is_pinned() and z.sum().item() == 0
    # A view into pinned memory is pinned too.
    assert t[5:].is_pinned()


def test_non_blocking_upload_from_pinned_memory_is_queued_on_the_stream():
    stream = torch.ember.Stream()
    src = torch.randn(4096).pin_memory()
    with torch.ember.stream(stream):
        _C._engine_enqueue_sleep(0, stream.stream_id, 0.2)
        dst = src.to("ember", non_blocking=True)
        # Queued behind the sleep: the call returned before the copy ran.
        assert not stream.query()
    assert torch.equal(dst.cpu(), src)  # a host read synchronises
    assert stream.query()


def test_non_blocking_upload_then_op_on_the_same_stream_sees_the_data():
    src = torch.arange(10.0).pin_memory()
    stream = torch.ember.Stream()
    with torch.ember.stream(stream):
        _C._engine_enqueue_sleep(0, stream.stream_id, 0.05)
        dst = torch.empty(10, device="ember")
        dst.copy_(src, non_blocking=True)
        doubled = dst * 2  # stream order: runs after the copy
    assert doubled.cpu().tolist() == [2.0 * i for i in range(10)]


def test_non_blocking_from_unpinned_memory_completes_on_return():
    stream = torch.ember.Stream()
    src = torch.randn(100)
    with torch.ember.stream(stream):
        dst = src.to("ember", non_blocking=True)
        assert stream.query()
    assert torch.equal(dst.cpu(), src)


def test_non_blocking_strided_or_converting_copies_are_correct():
    src = torch.randn(8, 6).pin_memory()
    assert torch.equal(src.t().to("ember", non_blocking=True).cpu(), src.t())
    assert torch.equal(src.to("ember", torch.float64, non_blocking=True).cpu(), src.double())


def test_upload_keeps_its_source_alive_until_it_ran():
    stream = torch.ember.Stream()
    with torch.ember.stream(stream):
        _C._engine_enqueue_sleep(0, stream.stream_id, 0.1)
        src = torch.full((1 << 16,), 3.0).pin_memory()
        dst = src.to("ember", non_blocking=True)
        del src  # the queued copy still holds it
        torch.full((1 << 16,), 9.0).pin_memory()  # may reuse freed pinned memory
    assert torch.all(dst.cpu() == 3.0)


def test_dataloader_pin_memory():
    data = TensorDataset(torch.arange(40.0).reshape(20, 2), torch.arange(20))
    loader = DataLoader(data, batch_size=4, pin_memory=True)
    seen = 0
    for features, labels in loader:
        assert features.is_pinned() and labels.is_pinned()
        on_device = features.to("ember", non_blocking=True)
        assert torch.equal(on_device.cpu(), features)
        seen += len(labels)
    assert seen == 20


def test_record_stream_delays_reuse_until_the_stream_passed_the_free():
    # Packed weights left by earlier tests go too, so that the empty_cache()
    # below frees only this test's block.
    torch.ember.empty_cache()
    side = torch.ember.Stream()
    x = torch.empty(1 << 18, device="ember")
    address = x.data_ptr()
    allocated = torch.ember.memory_allocated()
    _C._engine_enqueue_sleep(0, side.stream_id, 0.3)
    x.record_stream(side)
    del x
    # The side stream has not passed the free: the block stays allocated
    # and is not handed out again.
    assert torch.ember.memory_allocated() == allocated
    y = torch.empty(1 << 18, device="ember")
    assert y.data_ptr() != address
    with_y = torch.ember.memory_allocated()
    side.synchronize()
    torch.ember.empty_cache()  # reclaims blocks whose streams have passed
    assert torch.ember.memory_allocated() == with_y - 4 * (1 << 18)
    del y


def test_record_stream_on_an_idle_stream_frees_at_once():
    side = torch.ember.Stream()
    x = torch.empty(1 << 18, device="ember")
    allocated = torch.ember.memory_allocated()
    x.record_stream(side)
    del x
    assert torch.ember.memory_allocated() == allocated - 4 * (1 << 18)


def test_record_stream_rejects_a_cpu_stream():
    x = torch.empty(4, device="ember")
    with pytest.raises(RuntimeError, match="ember stream"):
        x.record_stream(torch.Stream(device="cpu"))
