"""The stream worker and OpenMP (ops/DeviceScope.h, run_split_free): ATen
kernels whose bits do not depend on their thread split (mul, div, relu,
argmax, copies, cat, index_select, layer norm, softmax along the last
dimension below 64 Ki results, and the erf GELU below 6144) run on the worker with a
one-thread team, so the worker never gets a libgomp pool of its own beside
the host thread's (two pools on the process's cores make libgomp throttle
both); a pool the worker did open (a reduction, a GEMM) ends once the worker
has idled. Also: bf16 decode's ops are launched, bitwise equal to running
them at the call."""

import os

import pytest
import torch
import torch.nn.functional as F
from async_helpers import SLEEP

import torch_ember
from torch_ember import _C

POOL_PROBE = """
import os, time, torch, torch_ember
from torch_ember import _C
torch.set_num_threads(2)

def threads():
    return len(os.listdir("/proc/self/task"))

def queued(fn):
    # a sleep ahead of it, so the op is queued (not run at the call)
    stream = torch.ember.current_stream()
    _C._engine_enqueue_sleep(stream.device_index, stream.stream_id, 0.05)
    out = fn()
    torch.ember.synchronize()
    return out

def threads_after_queued(fn):
    # threads() once fn's work has run, read while the worker is still busy
    # (a sleep queued behind it): an idle worker gives its team back after
    # 2 ms, which a host descheduled between synchronize and threads() on a
    # loaded machine would otherwise miss
    stream = torch.ember.current_stream()
    _C._engine_enqueue_sleep(stream.device_index, stream.stream_id, 0.05)
    fn()
    done = torch.ember.Event()
    done.record()
    _C._engine_enqueue_sleep(stream.device_index, stream.stream_id, 0.5)
    done.synchronize()
    count = threads()
    torch.ember.synchronize()
    return count

x = torch.randn(400, 500, dtype=torch.bfloat16, device="ember")
queued(lambda: x * 1)  # the worker exists, with whatever it starts
base = threads()
queued(lambda: x * 2.5)  # CPU's kernels, over 200 Ki values: regions
queued(lambda: x / 3)
queued(lambda: torch.relu(x))
queued(lambda: x.argmax())
queued(lambda: torch.cat([x, x]))
queued(lambda: x.float().contiguous())
queued(lambda: torch.nn.functional.layer_norm(x, (500,)))
queued(lambda: x.index_select(0, torch.arange(300, device="ember")))
rows = torch.randn(200, 300, device="ember")  # below 64 Ki results
queued(lambda: rows.softmax(-1))
queued(lambda: rows.log_softmax(1))
small = torch.randn(48, 64, device="ember")  # oneDNN's erf GELU, small
queued(lambda: torch.nn.functional.gelu(small))
split_free = threads()
# a reduction keeps the worker's thread count
reduction = threads_after_queued(lambda: x.float().sum(0))
# idle: the worker gives its team back (runtime's idle hook, 2 ms after work)
deadline = time.monotonic() + 10
while threads() > split_free and time.monotonic() < deadline:
    time.sleep(0.005)
after_idle = threads()
again = threads_after_queued(lambda: x.float().sum(0))  # a fresh team
print(base, split_free, reduction, after_idle, again)
"""


def test_split_free_kernels_open_no_openmp_pool_on_the_worker(run_python):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("a one-thread device has no team either way")
    result = run_python(POOL_PROBE, env={"EMBER_DEVICES": "1", "EMBER_ASYNC": "1"})
    assert result.returncode == 0, result.stderr
    base, split_free, reduction, after_idle, again = map(int, result.stdout.split())
    assert split_free == base, "a split-free kernel started OpenMP helpers on the worker"
    # The probe sees pools: a reduction over 200 Ki values on the worker
    # runs a two-thread region, whose helper is a new thread ...
    assert reduction > split_free
    # ... which ends when the worker idles, and comes back with the next region.
    assert after_idle == split_free, "the idle worker kept its OpenMP team"
    assert again == reduction


BF16_OPS = [
    (
        "layer_norm",
        lambda x, w: F.layer_norm(x, (x.shape[-1],), w[0], w[1]),
        "aten::native_layer_norm",
    ),
    ("tanh", lambda x, w: torch.tanh(x), "aten::tanh"),
    ("gelu_tanh", lambda x, w: F.gelu(x, approximate="tanh"), "aten::gelu"),
    ("mul", lambda x, w: x * w[0], "aten::mul.Tensor"),
    ("cat", lambda x, w: torch.cat([x, w[:1]], 0), "aten::cat"),
]


@pytest.mark.parametrize("name, fn, op", BF16_OPS, ids=[c[0] for c in BF16_OPS])
def test_bf16_decode_ops_are_launched_and_equal_the_call(name, fn, op, queued_launches):
    torch.manual_seed(0)
    x = torch.randn(1, 3072, dtype=torch.bfloat16, device="ember")
    w = torch.randn(2, 3072, dtype=torch.bfloat16, device="ember")
    with torch.backends.ember.flags(async_execution=False):
        expected = fn(x, w).cpu()
    torch_ember.reset_launch_stats()
    with torch.backends.ember.flags(async_execution=True):
        stream = torch.ember.current_stream()
        _C._engine_enqueue_sleep(stream.device_index, stream.stream_id, SLEEP)
        out = fn(x, w)
        torch.ember.synchronize()
    stats = torch_ember.launch_stats().get(op, {})
    assert stats.get("launched", 0) == 1 and stats.get("waited", 0) == 0, stats
    assert out.dtype == torch.bfloat16 and out.stride() == expected.stride()
    assert torch.equal(out.cpu(), expected)


def test_layer_norm_with_mixed_dtypes_stays_synchronous_and_correct():
    """bf16 input with fp32 parameters: CPU's statistics are fp32 then, so
    the launched form (statistics in the input's dtype) does not take it."""
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    w, b = torch.randn(64), torch.randn(64)
    expected = torch.native_layer_norm(x, (64,), w, b, 1e-5)
    with torch.backends.ember.flags(async_execution=True):
        got = torch.native_layer_norm(x.to("ember"), (64,), w.to("ember"), b.to("ember"), 1e-5)
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == e.dtype and torch.equal(g.cpu(), e)


ROWWISE = [(torch.softmax, "aten::_softmax"), (torch.log_softmax, "aten::_log_softmax")]


def _by_thread_counts(fn):
    """fn() on CPU with 1, 2, 3 and 7 threads."""
    threads = torch.get_num_threads()
    try:
        results = []
        for count in (1, 2, 3, 7):
            torch.set_num_threads(count)
            results.append(fn())
    finally:
        torch.set_num_threads(threads)
    return results


def _queued_once(fn, op):
    """fn() on ember behind a queued sleep: launched on the worker, once."""
    torch_ember.reset_launch_stats()
    with torch.backends.ember.flags(async_execution=True):
        stream = torch.ember.current_stream()
        _C._engine_enqueue_sleep(stream.device_index, stream.stream_id, SLEEP)
        got = fn()
        torch.ember.synchronize()
    assert torch_ember.launch_stats().get(op, {}).get("launched", 0) == 1
    return got


@pytest.mark.parametrize("fn, op", ROWWISE, ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(37, 129), (12, 100)], ids=["on_the_worker", "any_thread"])
def test_small_softmax_along_rows_runs_on_one_worker_thread_with_cpus_bits(
    fn, op, dtype, shape, queued_launches
):
    """CPU's softmax kernels along the last dimension give each row wholly to
    one thread, so their bits do not depend on the thread count (checked
    here, since RowwiseOutForm in ops/LaunchedOps.h relies on it) and the
    worker runs a small one on one thread (up to 4096 values any thread
    does): CPU's result, launched and at the call."""
    torch.manual_seed(0)
    x = (torch.randn(*shape) * 4).to(dtype)
    by_threads = _by_thread_counts(lambda: fn(x, -1))
    assert all(torch.equal(by_threads[0], other) for other in by_threads[1:])
    x_ember = x.to("ember")
    got = _queued_once(lambda: fn(x_ember, 1), op)  # dim 1 is the last one
    assert torch.equal(got.cpu(), fn(x, -1))
    torch_ember._C._engine_keep_workers_awake(False)
    with torch.backends.ember.flags(async_execution=True):
        torch.ember.synchronize()
        at_call = fn(x_ember, -1)  # an idle stream: runs at the call
        assert torch.equal(at_call.cpu(), fn(x, -1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_small_gelu_runs_on_one_worker_thread_with_cpus_bits(dtype, queued_launches):
    """CPU's erf GELU below 6144 values: ATen's own loop (bf16 here) does not
    split it, oneDNN's eltwise (fp32) splits it without changing a bit
    (checked here, since SmallSplitFreeOutForm in ops/LaunchedOps.h relies
    on it); the worker runs it on one thread: CPU's result, launched."""
    torch.manual_seed(0)
    x = (torch.randn(47, 129) * 4).to(dtype)
    by_threads = _by_thread_counts(lambda: F.gelu(x))
    assert all(torch.equal(by_threads[0], other) for other in by_threads[1:])
    x_ember = x.to("ember")
    got = _queued_once(lambda: F.gelu(x_ember), "aten::gelu")
    assert torch.equal(got.cpu(), by_threads[1])


@pytest.mark.parametrize("queued", [True, False], ids=["on_the_worker", "at_the_call"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_cache_cat_copies_rows_on_the_devices_threads_exactly(queued, dtype):
    """A decode step's KV-cache cat (contiguous inputs, rows of ~38 KB) is
    copied row block by row block, split between the device's threads
    (cat_rows, JoinAndSelect.cpp): CPU's result, byte for byte."""
    torch.manual_seed(0)
    cache = torch.randn(1, 12, 150, 64).to(dtype)
    step = torch.randn(1, 12, 1, 64).to(dtype)
    other = torch.randn(1, 12, 3, 64).to(dtype)
    expected = torch.cat([cache, step, other], -2)
    with torch.backends.ember.flags(async_execution=True):
        inputs = [t.to("ember") for t in (cache, step, other)]
        if queued:  # a sleep ahead of it: queued, not run at the call
            stream = torch.ember.current_stream()
            _C._engine_enqueue_sleep(stream.device_index, stream.stream_id, SLEEP)
        got = torch.cat(inputs, -2)
        assert torch.equal(got.cpu(), expected)


HOST_POOL_PROBE = """
import os, time, torch, torch_ember
import torch.nn.functional as F
from torch_ember import _C
torch.set_num_threads(1)  # the set-up opens no OpenMP region
torch.backends.ember.async_execution = True

def openmp_threads():
    # threads with the process's name: libgomp's among them, not the
    # runtime's own (named ember-worker, ember-chunks)
    own = open("/proc/self/comm").read()
    return sum(open(f"/proc/self/task/{t}/comm").read() == own
               for t in os.listdir("/proc/self/task"))

# decode-sized operands: 12 query heads over 4 key/value heads of 100
# positions, and a 256 -> 512 linear (a 512 KiB pack: it runs at the call)
q, k, v = (torch.randn(1, h, n, 64).to("ember") for h, n in ((12, 1), (4, 100), (4, 100)))
lin = torch.nn.Linear(256, 512).to("ember")
x = torch.randn(1, 256).to("ember")
with torch.inference_mode():
    for _ in range(2):  # the weight is packed on its second use
        lin(x)
    stream = torch.ember.current_stream()
    _C._engine_enqueue_sleep(stream.device_index, stream.stream_id, 0.01)
    torch.ember.synchronize()
    deadline = time.monotonic() + 10
    while not _C._engine_worker_asleep(stream.device_index, stream.stream_id):
        assert time.monotonic() < deadline
        time.sleep(0.001)
    time.sleep(0.005)  # past the engine's burst gap
    torch.set_num_threads(2)
    before = openmp_threads()
    torch_ember.reset_launch_stats()
    attention = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    linear = lin(x)
    launched = sum(n["launched"] for n in torch_ember.launch_stats().values())
    after = openmp_threads()
    torch.backends.ember.async_execution = False
    same = torch.equal(attention.cpu(), F.scaled_dot_product_attention(q, k, v, enable_gqa=True).cpu())
    same &= torch.equal(linear.cpu(), lin(x).cpu())
names = ",".join(sorted(open(f"/proc/self/task/{t}/comm").read().strip()
                        for t in os.listdir("/proc/self/task")))
print(before, launched, after, same, names)
"""


def test_small_work_at_the_call_beside_a_sleeping_worker_opens_no_openmp_pool(run_python):
    """Small work runs at the call while its stream's worker sleeps; the
    next launch may wake the worker, and libgomp's threads, spinning after a
    region the host opened, would take its core (Llama decode 21 -> 18 ms a
    token once ember's kernels split such work on the host's chunk team)."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("a one-thread device splits nothing")
    # A host stalled between the two ops rouses the worker by design, which
    # then queues the second: such a probe proves nothing and runs again.
    for _ in range(4):
        result = run_python(HOST_POOL_PROBE, env={"EMBER_DEVICES": "1"})
        assert result.returncode == 0, result.stderr
        before, launched, after, same, names = result.stdout.split()
        if launched == "0":
            break
    assert launched == "0", "the work was queued, not run at the call"
    assert after == before, f"a region on the host thread started a thread ({names})"
    assert same == "True"
