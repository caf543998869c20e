"""Elementwise fusion at run time (csrc/ops/HeldElementwise.h): large
elementwise results that would run at the call are held by their stream and
run, when anything else happens on it, range by range through every held op.
Nothing observable changes but time: the bits are those of the ops run one
by one, and every reader (a host read, a GEMM, a synchronous op, another
stream, a graph capture) finds the held work done."""

import math
import threading

import pytest
import torch
import torch.nn.functional as F

import torch_ember

be = torch.backends.ember
# Large enough to run at the call on an idle stream (EMBER_ASYNC_INLINE_NUMEL).
ROWS, COLS = 128, 3072


@pytest.fixture(autouse=True)
def _fusion_on():
    if not be.async_execution:
        pytest.skip("held work needs asynchronous execution")
    with be.flags(fuse_elementwise=True):
        yield


def _new_gelu(x):
    """transformers' NewGELUActivation (GPT-2): eight elementwise ops."""
    return (
        0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    )


def _held():
    return sum(counts["held"] for counts in torch_ember.launch_stats().values())


def _unfused(fn, *args):
    with be.flags(fuse_elementwise=False):
        return fn(*args).cpu()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(ROWS, COLS), (100_003,), (3, 65_537)])
def test_a_chain_is_held_then_runs_fused_with_the_bits_of_the_ops_one_by_one(shape, dtype):
    x = torch.randn(shape).to(dtype).to("ember")
    torch.ember.synchronize()
    torch_ember.reset_launch_stats()
    out = _new_gelu(x)
    assert _held() == 8, torch_ember.launch_stats()
    assert not torch.ember.current_stream().query()  # held: not run yet
    assert torch.equal(out.cpu(), _unfused(_new_gelu, x))
    assert torch.ember.current_stream().query()


def test_fused_chain_is_close_to_cpu():
    x = torch.randn(ROWS, COLS)
    torch.testing.assert_close(_new_gelu(x.to("ember")).cpu(), _new_gelu(x))


def test_held_work_is_done_before_anything_reads_it():
    x = torch.randn(ROWS, COLS)
    w = torch.randn(64, COLS)
    xe, we = x.to("ember"), w.to("ember")
    expected = (x * 3 + 1).sort(dim=1).values
    torch.testing.assert_close((xe * 3 + 1).sort(dim=1).values.cpu(), expected)  # a synchronous op
    F.linear(xe, we), F.linear(xe, we)  # the weight packed (its route settled)
    linear = F.linear(xe * 3 + 1, we).cpu()  # a GEMM
    assert torch.equal(linear, _unfused(lambda a, b: F.linear(a * 3 + 1, b), xe, we))
    y = xe * 3 + 1
    assert y[5, 7].item() == pytest.approx((x * 3 + 1)[5, 7].item())  # a host read
    small = xe[:2, :5] * 2  # a small op after held work: queued or at the call
    z = xe * 3 + 1
    torch.testing.assert_close(small.cpu(), x[:2, :5] * 2)
    torch.testing.assert_close(z.cpu(), x * 3 + 1)


def test_another_stream_waiting_on_an_event_sees_held_results():
    x = torch.randn(ROWS, COLS)
    xe = x.to("ember")
    torch.ember.synchronize()
    producer, consumer = torch.ember.Stream(), torch.ember.Stream()
    with torch.ember.stream(producer):
        y = xe * 2 + 1
        done = torch.ember.Event()
        done.record()
    with torch.ember.stream(consumer):
        consumer.wait_event(done)
        z = y - 1
    torch.ember.synchronize()
    assert torch.equal(z.cpu(), x * 2 + 1 - 1)


def test_held_work_before_a_capture_is_not_part_of_the_graph():
    x = torch.randn(ROWS, COLS).to("ember")
    torch.ember.synchronize()
    y = x * 2  # held
    g = torch.ember.EmberGraph()
    static = torch.zeros(ROWS, COLS, device="ember")
    with torch.ember.graph(g):
        out = static + 1
    assert torch.equal(y.cpu(), x.cpu() * 2)
    static.copy_(x)
    g.replay()
    assert torch.equal(out.cpu(), x.cpu() + 1)


def test_operands_sharing_memory_at_an_offset_stay_correct():
    base = torch.randn(ROWS * COLS + 64)
    a, b = base[: ROWS * COLS], base[64:]  # the same storage, shifted
    be_base = base.to("ember")
    ae, bee = be_base[: ROWS * COLS], be_base[64:]
    out = (ae * 2) + (bee * 3) + ae
    assert torch.equal(out.cpu(), _unfused(lambda p, q: (p * 2) + (q * 3) + p, ae, bee))
    torch.testing.assert_close(out.cpu(), (a * 2) + (b * 3) + a)


def test_what_a_stream_holds_is_bounded():
    x = torch.ones(1 << 18, device="ember")  # 1 MiB
    torch.ember.synchronize()
    torch.ember.reset_peak_memory_stats()
    for _ in range(200):
        x * 2  # each held, then dropped by Python
    torch.ember.synchronize()
    assert torch.ember.max_memory_allocated() < 40 * (1 << 20)


@pytest.mark.parametrize(
    "setting",
    [
        {"fuse_elementwise": False},
        pytest.param({"cpu_parity": True}, marks=pytest.mark.cpu_parity),
        {"deterministic": True},
    ],
    ids=["switch_off", "cpu_parity", "deterministic"],
)
def test_nothing_is_held_when_switched_off(setting):
    x = torch.randn(ROWS, COLS).to("ember")
    torch.ember.synchronize()
    torch_ember.reset_launch_stats()
    with be.flags(**setting):
        out = _new_gelu(x)
        assert _held() == 0
    torch.testing.assert_close(out.cpu(), _new_gelu(x.cpu()))


def test_small_results_and_other_ops_are_not_held():
    x = torch.randn(1000).to("ember")
    big = torch.randn(ROWS, COLS).to("ember")
    torch.ember.synchronize()
    torch_ember.reset_launch_stats()
    x * 2  # small: queued or at the call, as before
    big.exp()  # not an op held as elementwise work
    big * torch.randn(COLS, device="ember")  # a broadcast operand
    torch.ember.synchronize()
    assert _held() == 0, torch_ember.launch_stats()


def test_threads_with_their_own_streams_fuse_independently():
    inputs = [torch.randn(ROWS, COLS) for _ in range(4)]
    results = [None] * 4

    def run(i):
        with torch.ember.stream(torch.ember.Stream()):
            results[i] = _new_gelu(inputs[i].to("ember")).cpu()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(4):
        assert torch.equal(results[i], _unfused(_new_gelu, inputs[i].to("ember")))


def test_the_environment_sets_the_default(run_python):
    result = run_python(
        "import torch, torch_ember; print(torch.backends.ember.fuse_elementwise)",
        env={"EMBER_FUSE_ELEMENTWISE": "0"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False"]
