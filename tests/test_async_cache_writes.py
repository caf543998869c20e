"""In-place writes of a decode step's caches are launched, not waited for.

A static KV cache (transformers' ``StaticCache``) is written with
``index_copy_`` twice per layer and token, its masks start from
``torch.full`` (``fill_``) and ``torch.zeros`` (``zero_``), and attention
masks are applied with ``torch.where``. Run synchronously, each of them waited for the
work queued before it, so a decode step drained the stream's queue a few
dozen times. These tests show they are launched in stream order, equal to
their synchronous runs, with argument errors raised at the call.
"""

import time
import warnings

import pytest
import torch
from async_helpers import returned_before_the_sleep_ended, sleep_on_stream

import torch_ember

# Launch counts must not depend on whether a worker fell asleep (conftest).
pytestmark = pytest.mark.usefixtures("queued_launches", "async_on")


def _stats(op):
    return torch_ember.launch_stats().get(op, {"launched": 0, "waited": 0})


def test_index_copy_is_launched_in_stream_order():
    cache = torch.zeros(1, 4, 10, 8, device="ember")
    step = torch.randn(1, 4, 1, 8, device="ember")
    position = torch.tensor([3], device="ember")
    sleep_on_stream()
    begin = time.monotonic()
    written = step * 2  # queued behind the sleep: index_copy_ must see it
    cache.index_copy_(2, position, written)
    position.add_(1)  # the next token's position, also in stream order
    cache.index_copy_(2, position, written + 1)
    assert returned_before_the_sleep_ended(begin)  # nothing waited for the queue
    assert _stats("aten::index_copy_") == {"launched": 2, "waited": 0}
    expected = torch.zeros(1, 4, 10, 8)
    expected[:, :, 3] = step.cpu()[:, :, 0] * 2
    expected[:, :, 4] = step.cpu()[:, :, 0] * 2 + 1
    assert torch.equal(cache.cpu(), expected)


def test_fill_is_launched_and_equals_synchronous_execution():
    x = torch.randn(5, 7, device="ember")
    sleep_on_stream()
    begin = time.monotonic()
    full = torch.full((3, 4), -3.5, device="ember")
    view = x[1:4, ::2]
    view.fill_(2.0)
    ints = torch.full((6,), 7, dtype=torch.int64, device="ember")
    assert returned_before_the_sleep_ended(begin)
    assert _stats("aten::fill_.Scalar")["launched"] == 3
    with torch.backends.ember.flags(async_execution=False):
        sync_x = x.clone()
    expected = x.cpu()  # synchronises: the fills have run
    assert torch.equal(full.cpu(), torch.full((3, 4), -3.5))
    assert torch.equal(ints.cpu(), torch.full((6,), 7))
    assert (expected[1:4, ::2] == 2.0).all()
    assert torch.equal(sync_x.cpu(), expected)


def test_cache_write_argument_errors_are_raised_at_the_call():
    cache = torch.zeros(2, 6, device="ember")
    sleep_on_stream(0.05)
    with pytest.raises(IndexError, match="index_copy_"):  # as CPU raises
        cache.index_copy_(1, torch.tensor([0, 1], device="ember"), torch.ones(2, 3, device="ember"))
    with pytest.raises(IndexError):
        cache.index_copy_(5, torch.tensor([0], device="ember"), torch.ones(2, 1, device="ember"))
    with pytest.raises(RuntimeError, match="cannot be converted|overflow"):
        torch.zeros(2, dtype=torch.uint8, device="ember").fill_(300)
    # nothing left queued or broken by the refused calls
    cache.index_copy_(1, torch.tensor([5], device="ember"), torch.ones(2, 1, device="ember"))
    assert cache.cpu()[:, 5].tolist() == [1.0, 1.0] and cache.cpu().sum().item() == 2.0


def test_zero_is_launched():
    x = torch.randn(4, 5, device="ember")
    sleep_on_stream()
    begin = time.monotonic()
    z = torch.zeros(3, 3, device="ember")
    x[:, 1].zero_()
    assert returned_before_the_sleep_ended(begin)
    assert _stats("aten::zero_")["launched"] == 2
    assert torch.equal(z.cpu(), torch.zeros(3, 3))
    assert (x.cpu()[:, 1] == 0).all() and (x.cpu()[:, 0] != 0).all()


def test_an_index_out_of_range_is_an_asynchronous_error_naming_the_op():
    cache = torch.zeros(2, 6, device="ember")
    bad = torch.tensor([9], device="ember")  # checked by the kernel, later
    cache.index_copy_(1, bad, torch.ones(2, 1, device="ember"))
    with pytest.raises(RuntimeError, match="aten::index_copy_"):
        torch.ember.synchronize()


def test_deterministic_index_copy_runs_serially_at_the_call():
    cache = torch.zeros(8, device="ember")
    index = torch.tensor([1, 1, 1, 2], device="ember")  # repeated: order matters
    source = torch.tensor([1.0, 2.0, 3.0, 4.0], device="ember")
    torch_ember.reset_launch_stats()
    with torch.backends.ember.flags(deterministic=True):
        cache.index_copy_(0, index, source)
    assert _stats("aten::index_copy_")["launched"] == 0
    assert cache.cpu().tolist() == [0.0, 3.0, 4.0, 0, 0, 0, 0, 0]


def test_where_is_launched_in_stream_order_and_equals_synchronous_execution():
    x = torch.randn(4, 1, 6, device="ember")
    scores = torch.randn(4, 5, 6, device="ember")
    mask = x > 0  # (a comparison runs at its call)
    sleep_on_stream()
    begin = time.monotonic()
    scores = scores * 2  # queued behind the sleep: where must see it
    masked = torch.where(mask, scores, torch.tensor(float("-inf")))  # broadcast, host scalar
    promoted = torch.where(mask.transpose(1, 2), scores.transpose(1, 2), 2)  # strided
    assert returned_before_the_sleep_ended(begin)  # nothing waited for the queue
    assert _stats("aten::where.self")["launched"] == 2
    with torch.backends.ember.flags(async_execution=False):
        sync_masked = torch.where(mask, scores, torch.tensor(float("-inf")))
        sync_promoted = torch.where(mask.transpose(1, 2), scores.transpose(1, 2), 2)
    for launched, synchronous in ((masked, sync_masked), (promoted, sync_promoted)):
        assert launched.stride() == synchronous.stride() and launched.dtype == synchronous.dtype
        assert torch.equal(launched.cpu(), synchronous.cpu())
    cpu = torch.where(mask.cpu(), scores.cpu(), torch.tensor(float("-inf")))
    assert torch.equal(masked.cpu(), cpu)


def test_where_argument_errors_are_cpus_and_a_byte_condition_stays_synchronous():
    x = torch.randn(3, 4)
    for condition in (x, torch.ones(3, 5, dtype=torch.bool)):  # not bool; not broadcastable
        with pytest.raises(RuntimeError) as cpu_error:
            torch.where(condition, x, x)
        with pytest.raises(RuntimeError) as ember_error:
            torch.where(condition.to("ember"), x.to("ember"), x.to("ember"))
        assert str(ember_error.value) == str(cpu_error.value)
    byte = (x > 0).to(torch.uint8)  # deprecated (CPU warns once): CPU's own path
    torch_ember.reset_launch_stats()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = torch.where(byte.to("ember"), x.to("ember"), -x.to("ember"))
        assert _stats("aten::where.self")["launched"] == 0
        assert torch.equal(out.cpu(), torch.where(byte, x, -x))
