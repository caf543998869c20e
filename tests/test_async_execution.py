"""Asynchronous op execution (issue 11, item 1): ops whose result layout is
known before they run are launched on their stream and return at once; the
stream's worker runs them. Nothing observable differs from synchronous
execution except time: results, errors raised at the call (argument
checks), host reads that wait, memory that stays valid.

A sleep queued on the stream first (``_engine_enqueue_sleep``) makes
"returned before it ran" observable without depending on kernel speed."""

import random
import threading
import time

import pytest
import torch
import torch.nn.functional as F
from async_helpers import launched_count, returned_before_the_sleep_ended, sleep_on_stream

import torch_ember

# Launch counts must not depend on whether a worker fell asleep (conftest).
pytestmark = pytest.mark.usefixtures("queued_launches", "async_on")


def _both_modes(fn):
    """fn() under async execution and under synchronous execution."""
    results = []
    for mode in (True, False):
        torch.backends.ember.async_execution = mode
        out = fn()
        results.append(tuple(t.cpu() for t in out) if isinstance(out, tuple) else out.cpu())
    torch.backends.ember.async_execution = True
    return results


# --------------------------------------------------------------------- launching


def test_an_op_returns_before_its_work_has_run():
    x = torch.arange(8.0, device="ember")
    sleep_on_stream()
    begin = time.monotonic()
    y = x * 2 + 1
    assert returned_before_the_sleep_ended(begin)
    assert not torch.ember.current_stream().query()  # still queued
    assert torch.equal(y.cpu(), torch.arange(8.0) * 2 + 1)
    assert launched_count("aten::mul.Tensor") == 1 and launched_count("aten::add.Tensor") == 1


def test_results_have_the_layout_of_synchronous_execution():
    x = torch.randn(4, 6, device="ember").t()  # non-contiguous
    y = torch.randn(6, 1, device="ember")
    sleep_on_stream(0.05)
    z = x + y  # broadcast, TensorIterator's layout
    expected = x.cpu() + y.cpu()
    assert z.shape == expected.shape and z.stride() == expected.stride()
    assert z.dtype == expected.dtype
    assert torch.equal(z.cpu(), expected)


@pytest.mark.parametrize(
    "name, fn",
    [
        ("add", lambda x, y: x + y),
        ("add_alpha", lambda x, y: torch.add(x, y, alpha=3)),
        ("sub", lambda x, y: x - y),
        ("mul_scalar", lambda x, y: x * 2.5),
        ("div", lambda x, y: x / (y.abs() + 1)),
        ("int_promotion", lambda x, y: x + torch.arange(x.shape[-1], device=x.device)),
        ("host_scalar_tensor", lambda x, y: x * torch.tensor(3.0)),
        ("relu", lambda x, y: torch.relu(x)),
        ("gelu", lambda x, y: F.gelu(x)),
        ("gelu_tanh", lambda x, y: F.gelu(x, approximate="tanh")),
        ("tanh", lambda x, y: torch.tanh(x)),
        ("pow", lambda x, y: x.pow(3.0)),
        ("where", lambda x, y: torch.where(x > y, x, y)),
        ("where_promotes", lambda x, y: torch.where((x > 0).t(), x.t(), y.double())),
        ("softmax", lambda x, y: torch.softmax(x, -1)),
        ("log_softmax", lambda x, y: torch.log_softmax(x, 0)),
        ("layer_norm", lambda x, y: F.layer_norm(x, (x.shape[-1],))),
        (
            "layer_norm_affine",
            lambda x, y: F.layer_norm(x, (x.shape[-1],), y[0], y[1]),
        ),
        ("native_layer_norm", lambda x, y: torch.native_layer_norm(x, (8,), None, None, 1e-5)),
        (
            "native_layer_norm_2d",  # rows of 32 over two normalized dims, weight only
            lambda x, y: torch.native_layer_norm(x.view(2, 4, 8), (4, 8), y[:4], None, 1e-3),
        ),
        ("cat", lambda x, y: torch.cat([x, y, x], 0)),
        ("cat_kv_rows", lambda x, y: torch.cat([x.view(1, 2, 4, 8), y[:2].view(1, 2, 1, 8)], -2)),
        ("cat_legacy_empty", lambda x, y: torch.cat([x, x.new_empty(0), y], 1)),
        ("cat_promotes", lambda x, y: torch.cat([x, y.double()], 1)),
        ("cat_strided", lambda x, y: torch.cat([x.t(), y], 1)),
        ("index_select", lambda x, y: x.index_select(1, torch.tensor([3, 0, 3], device=x.device))),
        ("embedding", lambda x, y: F.embedding(torch.tensor([[1, 2], [0, 1]], device=x.device), x)),
        ("argmax", lambda x, y: x.argmax(-1)),
        ("argmax_keepdim", lambda x, y: x.argmax(0, keepdim=True)),
        ("linear_skinny", lambda x, y: F.linear(x[:2], y, y[0])),
        ("copy_within_device", lambda x, y: x.t().contiguous()),
        (
            "sdpa",
            lambda x, y: F.scaled_dot_product_attention(
                x[None, None], y[None, None], y[None, None]
            ),
        ),
    ],
)
def test_launched_ops_equal_synchronous_execution(name, fn):
    torch.manual_seed(0)
    x = torch.randn(8, 8).to("ember")
    y = torch.randn(8, 8).to("ember")
    fn(x, y)  # packs weights on first sight for the GEMM routes
    fn(x, y)
    launched, synchronous = _both_modes(lambda: fn(x, y))
    if isinstance(launched, tuple):
        for a, b in zip(launched, synchronous, strict=True):
            assert a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype
            assert torch.equal(a, b)
    else:
        assert launched.shape == synchronous.shape
        assert launched.stride() == synchronous.stride()
        assert launched.dtype == synchronous.dtype
        assert torch.equal(launched, synchronous), name


def test_in_place_ops_keep_stream_order():
    x = torch.zeros(5, device="ember")
    sleep_on_stream(0.05)
    x.add_(1)
    y = x * 2  # sees the add
    x.mul_(10)  # runs after y was computed
    assert torch.equal(y.cpu(), torch.full((5,), 2.0))
    assert torch.equal(x.cpu(), torch.full((5,), 10.0))
    assert launched_count("aten::add_.Tensor") == 1 and launched_count("aten::mul_.Tensor") == 1


# ---------------------------------------------------------- host reads wait


@pytest.mark.parametrize(
    "read, expected",
    [
        (lambda t: t.sum().item(), 12.0),
        (lambda t: t.cpu().tolist(), [3.0, 4.0, 5.0]),
        (lambda t: t.tolist(), [3.0, 4.0, 5.0]),
        (lambda t: bool((t > 4).any()), True),
        (lambda t: "5." in str(t), True),
        (lambda t: t.nonzero().shape[0], 3),
        (lambda t: t[t > 3.5].tolist(), [4.0, 5.0]),
        (lambda t: t.numpy(force=True).tolist(), [3.0, 4.0, 5.0]),
    ],
)
def test_host_reads_see_every_launched_op(read, expected):
    x = torch.arange(3.0, device="ember")
    sleep_on_stream(0.1)
    y = x + 3  # queued behind the sleep
    assert read(y) == expected


def test_a_synchronous_op_after_launched_work_waits_and_is_counted():
    x = torch.arange(4.0, device="ember")
    sleep_on_stream()
    y = x + 1
    z = torch.cumprod(y, 0)  # runs synchronously: waits for the add
    assert torch.equal(z.cpu(), torch.cumprod(torch.arange(4.0) + 1, 0))
    assert torch_ember.launch_stats()["aten::cumprod"]["waited"] == 1


# ------------------------------------------------------------------- errors


def test_argument_errors_are_raised_at_the_call():
    a = torch.ones(2, device="ember")
    b = torch.ones(3, device="ember")
    with pytest.raises(RuntimeError, match="must match the size"):
        a + b
    with pytest.raises(RuntimeError, match="can't be cast"):
        torch.ones(2, dtype=torch.long, device="ember").add_(torch.ones(2, device="ember") * 0.5)
    with pytest.raises(RuntimeError, match="normalized_shape"):
        F.layer_norm(torch.ones(2, 3, device="ember"), (4,))
    with pytest.raises(RuntimeError, match="Boolean inputs not supported for relu"):
        torch.relu(torch.ones(2, dtype=torch.bool, device="ember"))
    # Nothing was left queued or broken by the refused calls.
    assert torch.equal((a + 1).cpu(), torch.full((2,), 2.0))


def test_a_kernel_error_surfaces_at_the_next_synchronisation_point_naming_the_op():
    x = torch.randn(4, 3, device="ember")
    bad = torch.tensor([0, 7], device="ember")  # index out of range
    y = x.index_select(0, bad)  # launched: checked by the kernel, later
    with pytest.raises(RuntimeError, match="aten::index_select"):
        y.cpu()
    # Reported once; the stream works again.
    assert torch.equal((x + 0).cpu(), x.cpu())


def test_launch_blocking_runs_ops_synchronously(run_python):
    code = (
        "import torch, torch_ember\n"
        "assert not torch.backends.ember.async_execution\n"
        "x = torch.randn(4, 3, device='ember')\n"
        "try:\n"
        "    x.index_select(0, torch.tensor([9], device='ember'))\n"
        "except (RuntimeError, IndexError) as e:\n"
        "    print('raised at the call')\n"
    )
    result = run_python(code, env={"EMBER_LAUNCH_BLOCKING": "1"})
    assert result.returncode == 0, result.stderr
    assert "raised at the call" in result.stdout


def test_switching_async_off_runs_ops_at_the_call():
    torch.backends.ember.async_execution = False
    x = torch.arange(3.0, device="ember")
    y = x + 1
    assert torch.ember.current_stream().query()
    assert torch.equal(y.cpu(), torch.arange(3.0) + 1)
    assert launched_count("aten::add.Tensor") == 0


# ------------------------------------------------------------------- memory


def test_inputs_released_by_the_caller_stay_valid_until_their_work_ran():
    base = torch.ember.memory_allocated()
    x = torch.full((1 << 20,), 2.0, device="ember")
    sleep_on_stream(0.1)
    y = x * 3
    del x  # the queued multiplication still reads it
    assert torch.equal(y[:4].cpu(), torch.full((4,), 6.0))
    del y
    torch.ember.synchronize()
    assert torch.ember.memory_allocated() == base


def test_growing_a_tensor_waits_for_the_work_writing_it():
    # resize_ copies the old bytes on the host and frees them: launched work
    # still writing them must have finished.
    x = torch.arange(4.0, device="ember")
    sleep_on_stream(0.1)
    y = x + 1
    y.resize_(1 << 16)
    assert torch.equal(y[:4].cpu(), torch.arange(4.0) + 1)


def test_the_launch_queue_is_bounded():
    # Thousands of launches without a synchronisation: the host waits for
    # the worker instead of holding every queued result (as a full GPU
    # launch queue blocks).
    x = torch.ones(1 << 18, device="ember")  # 1 MiB
    torch.ember.synchronize()
    torch.ember.reset_peak_memory_stats()
    for _ in range(3000):
        x * 2
    torch.ember.synchronize()
    peak = torch.ember.max_memory_allocated()
    assert peak < 400 * (1 << 20), peak  # 3000 MiB if nothing bounded it


def test_flag_changes_wait_for_launched_work():
    x = torch.arange(4.0, device="ember")
    sleep_on_stream(0.1)
    y = x + 1
    with torch.backends.ember.flags(cpu_parity=True):
        assert torch.ember.current_stream().query()  # drained first
    assert torch.equal(y.cpu(), torch.arange(4.0) + 1)


@pytest.mark.parametrize("parity", [False, True])
def test_cpu_parity_launches_nothing(parity):
    x = torch.randn(256, device="ember")
    with torch.backends.ember.flags(async_execution=True, cpu_parity=parity):
        torch_ember.reset_launch_stats()
        sleep_on_stream(0.05)  # queued work ahead: a launchable op would queue behind it
        y = torch.relu(x)
        torch.ember.synchronize()
        launched = launched_count("aten::relu")
    assert launched == (0 if parity else 1)
    assert torch.equal(y.cpu(), torch.relu(x.cpu()))


# -------------------------------------------------- streams, threads, training


def test_launched_work_on_two_streams_is_ordered_by_events():
    producer, consumer = torch.ember.Stream(), torch.ember.Stream()
    x = torch.arange(6.0, device="ember")
    with torch.ember.stream(producer):
        sleep_on_stream(0.1, producer)
        y = x * 2
        done = torch.ember.Event()
        done.record(producer)
    consumer.wait_event(done)
    with torch.ember.stream(consumer):
        z = y + 1
    consumer.synchronize()
    assert torch.equal(z.cpu(), torch.arange(6.0) * 2 + 1)


def test_training_steps_match_synchronous_execution():
    def train():
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 4)
        ).to("ember")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = torch.randn(8, 16).to("ember")
        target = torch.randint(0, 4, (8,)).to("ember")
        for _ in range(3):
            opt.zero_grad()
            loss = F.cross_entropy(model(data), target)
            loss.backward()
            opt.step()
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    launched, synchronous = _both_modes(train)
    assert torch.equal(launched, synchronous)


def _program(rng: random.Random, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    for _ in range(rng.randint(3, 8)):
        choice = rng.randrange(7)
        if choice == 0:
            x = x + y
        elif choice == 1:
            x = torch.relu(x - 0.5)
        elif choice == 2:
            x = torch.softmax(x, -1) * 4
        elif choice == 3:
            x = F.layer_norm(x, (x.shape[-1],))
        elif choice == 4:
            x = torch.cat([x, y], 0)[: y.shape[0]]
        elif choice == 5:
            x = torch.tanh(x).mul_(2)
        else:
            x = (x @ y.t() @ y).contiguous() / 8
    return x


def test_threads_devices_and_streams_under_load_match_cpu():
    """8 Python threads x 2 devices x 2 streams, random programs of
    launched ops with a cross-stream event per program, compared with CPU,
    for a bounded time."""
    devices = range(min(2, torch.ember.device_count()))
    errors: list[str] = []
    deadline = time.monotonic() + 4.0

    def worker(seed: int) -> None:
        try:
            run(seed)
        except Exception as e:  # noqa: BLE001 -- reported by the test, not lost in the thread
            errors.append(f"seed {seed}: {type(e).__name__}: {e}")

    def run(seed: int) -> None:
        rng = random.Random(seed)
        device = f"ember:{seed % len(devices)}"
        streams = [torch.ember.Stream(device), torch.ember.Stream(device)]
        while time.monotonic() < deadline and not errors:
            x_cpu = torch.randn(
                4, 8, generator=torch.Generator().manual_seed(rng.randrange(1 << 30))
            )
            y_cpu = torch.randn(
                4, 8, generator=torch.Generator().manual_seed(rng.randrange(1 << 30))
            )
            program_seed = rng.randrange(1 << 30)
            expected = _program(random.Random(program_seed), x_cpu, y_cpu)
            with torch.ember.stream(streams[0]):
                x = x_cpu.to(device)
                y = y_cpu.to(device)
                half = _program(random.Random(program_seed), x, y)
                ready = torch.ember.Event()
                ready.record(streams[0])
            streams[1].wait_event(ready)
            with torch.ember.stream(streams[1]):
                out = half.cpu()
            # ember's default kernels (skinny GEMM, tanh) agree with CPU within
            # float32 tolerances; a program compounds up to eight ops.
            if not torch.allclose(out, expected, rtol=1e-4, atol=1e-4):
                errors.append(f"seed {seed}: max diff {(out - expected).abs().max()}")

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert launched_count("aten::add.Tensor") > 0


def test_a_small_upload_behind_queued_work_is_staged_not_waited_for():
    """A blocking copy of a small host tensor into ember while work is queued
    (position ids, masks: built on the host each decode step) does not wait
    for the queue: the source's bytes are staged at the call and the write
    is queued behind the work. The caller may change its memory at once; a
    read of the destination sees what was copied."""
    torch.ember.synchronize()
    torch_ember.reset_launch_stats()
    host = torch.arange(6, dtype=torch.int64)
    sleep_on_stream()
    begin = time.monotonic()
    on_ember = host.to("ember")
    assert returned_before_the_sleep_ended(begin)
    host.fill_(-1)  # after the call: not what was copied
    assert on_ember.tolist() == [0, 1, 2, 3, 4, 5]
    stats = torch_ember.launch_stats()
    assert stats["aten::copy_ (host to ember, staged)"]["launched"] == 1
    assert "aten::copy_" not in stats, stats


def test_a_wait_after_an_op_is_not_counted_under_that_ops_name():
    """An op's name lasts while its call does: a later wait by code that is
    no op (here an engine query run at the call) is unnamed work, not the
    last op's."""
    torch.ember.synchronize()
    y = torch.arange(4.0, device="ember")
    sleep_on_stream()
    torch.cumprod(y, 0)  # synchronous: waits, counted as aten::cumprod
    sleep_on_stream()
    torch_ember.reset_launch_stats()
    torch_ember._C._engine_inline_threads(0)  # waits for the sleep
    stats = torch_ember.launch_stats()
    assert stats == {"(unnamed work)": {"launched": 0, "waited": 1}}, stats


def test_a_large_upload_behind_queued_work_waits_and_is_counted_as_a_copy():
    """Over 64 KiB the copy runs at the call once the queue has drained,
    counted as a wait of aten::copy_ (not of the op before it)."""
    torch.ember.synchronize()
    host = torch.ones(64 * 1024 // 4 + 1)
    x = torch.ones(4, device="ember")
    sleep_on_stream()
    _ = x + 1
    torch_ember.reset_launch_stats()
    on_ember = host.to("ember")
    stats = torch_ember.launch_stats()
    assert stats["aten::copy_"]["waited"] == 1, stats
    assert torch.equal(on_ember.cpu(), host)
