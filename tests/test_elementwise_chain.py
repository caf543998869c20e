"""Elementwise chains (ops/kernels/elementwise/ElementwiseChain.h): ember's
fp32 elementwise ops over the same elements, held on their stream and run as
one pass when the stream is next used. The results must be the bits the ops
give unchained, every way the host or another stream can observe them."""

import math
import os
import subprocess
import sys
import threading
import time

import pytest
import torch
from async_helpers import launched_count, sleep_on_stream
from isa import VECTOR_KERNELS

import torch_ember

be = torch.backends.ember
N = (64, 1024)  # 65536 elements: chained (>= 16384)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)

pytestmark = [
    pytest.mark.usefixtures("held_work"),
    pytest.mark.skipif(
        not VECTOR_KERNELS,
        reason="ember's elementwise kernels need AVX-512F or AVX2",
    ),
]


def gelu_new(x):
    """transformers' NewGELUActivation (GPT-2): eight elementwise ops."""
    return 0.5 * x * (1.0 + torch.tanh(SQRT_2_OVER_PI * (x + 0.044715 * torch.pow(x, 3.0))))


def chain_counts():
    """chain_stats() of the elementwise chains (not of convolution epilogues)."""
    stats = torch_ember.chain_stats()
    return {k: stats[k] for k in ("chains", "steps", "written", "skipped")}


def unchained(fn, *args):
    with be.flags(fuse_elementwise=False):
        out = fn(*args)
        return out.cpu() if isinstance(out, torch.Tensor) else [t.cpu() for t in out]


def test_gelu_chain_is_one_pass_writing_only_its_result_with_unchained_bits():
    x = torch.randn(N).to("ember")
    with torch.inference_mode():
        out = gelu_new(x).cpu()
        assert chain_counts() == {"chains": 1, "steps": 8, "written": 1, "skipped": 0}
        assert torch.equal(out, unchained(gelu_new, x))
        torch.testing.assert_close(out, gelu_new(x.cpu()))


def test_a_submitted_chain_runs_at_the_call_or_queues_as_one_launch(queued_launches):
    """Submitted, the chain is one launched unit under the engine's rules
    (docs/engine-launch-rules.md): a large one runs at the call on an idle stream and
    is queued behind queued work."""
    x = torch.randn(N).to("ember")
    torch_ember.reset_launch_stats()
    y = gelu_new(x)
    torch.ember.current_stream().query()  # submits it: idle, so at the call
    assert launched_count("ember::elementwise_chain") == 0
    sleep_on_stream(0.1)
    z = gelu_new(y)
    assert not torch.ember.current_stream().query()
    assert launched_count("ember::elementwise_chain") == 1
    assert launched_count("aten::mul.Tensor") == 0  # the steps: not launched alone
    assert torch.equal(z.cpu(), unchained(lambda: gelu_new(gelu_new(x))))


def test_results_held_by_the_caller_are_written():
    x = torch.randn(N).to("ember")
    y = torch.randn(N).to("ember")

    def steps(x, y):
        a = x * y
        b = a + 2.0
        c = torch.relu(b - y)
        d = torch.pow(c, 2) / (a + 3.0)
        return [a, b, c, d, torch.tanh(d)]

    outs = [t.cpu() for t in steps(x, y)]
    stats = torch_ember.chain_stats()
    assert stats["chains"] == 1 and stats["written"] == 5, stats
    for got, want in zip(outs, unchained(steps, x, y), strict=True):
        assert torch.equal(got, want)
    for got, want in zip(outs, steps(x.cpu(), y.cpu()), strict=True):
        torch.testing.assert_close(got, want)


def test_a_result_nobody_reads_is_not_computed():
    x = torch.randn(N).to("ember")
    kept = x * 3.0
    torch.tanh(x + 1.0)  # dropped at once: neither step is needed
    assert torch.equal(kept.cpu(), x.cpu() * 3.0)
    assert chain_counts() == {"chains": 1, "steps": 1, "written": 1, "skipped": 2}


def test_a_slice_of_a_held_result_is_read_after_it_is_computed():
    x = torch.randn(2 * N[0] * N[1]).to("ember")
    held = x * 2.0  # flat, 2x the size of the halves below
    half = N[0] * N[1]
    lo, hi = held[:half], held[half:]
    out = lo + hi  # reads the held result at two offsets: a chain of its own
    expect = (x.cpu() * 2.0)[:half] + (x.cpu() * 2.0)[half:]
    assert torch.equal(out.cpu(), expect)


@pytest.mark.parametrize(
    "read",
    [
        lambda t: t.cpu(),
        lambda t: torch.tensor(t.sum().item()),
        lambda t: torch.tensor(t.tolist()),
        lambda t: (torch.ember.synchronize(), t.cpu())[1],
        lambda t: torch.tensor(float(t[3, 5])),
    ],
    ids=["cpu", "item", "tolist", "synchronize", "scalar"],
)
def test_every_host_read_sees_the_held_result(read):
    x = torch.randn(N).to("ember")
    y = gelu_new(x)
    expect = read(unchained(gelu_new, x).to("ember"))
    assert torch.equal(read(y), expect)


def test_printing_shows_the_held_result():
    x = torch.full(N, 2.0).to("ember")
    assert "5." in str(x * 2.5)


def test_stream_query_and_events_see_the_held_work_finish():
    x = torch.randn(N).to("ember")
    y = torch.tanh(x * 0.5)
    stream = torch.ember.current_stream()
    deadline = time.monotonic() + 30
    while not stream.query():  # the query submits it: it finishes
        assert time.monotonic() < deadline, "held work never finished"
    event = torch.ember.Event()
    z = torch.tanh(y + 1.0)
    event.record()
    event.synchronize()
    assert event.query()
    assert torch.equal(z.cpu(), unchained(lambda: torch.tanh(torch.tanh(x * 0.5) + 1.0)))


def test_another_stream_that_waits_reads_the_held_result():
    x = torch.randn(N).to("ember")
    side = torch.ember.Stream()
    y = gelu_new(x)  # held on the default stream
    side.wait_stream(torch.ember.current_stream())
    with torch.ember.stream(side):
        z = y.clone()
    torch.ember.current_stream().wait_stream(side)
    assert torch.equal(z.cpu(), unchained(gelu_new, x))


def test_an_in_place_write_to_an_operand_waits_for_the_held_read():
    x = torch.randn(N).to("ember")
    before = x.cpu()
    y = x * 2.0  # held: reads x when it runs
    x.add_(1.0)
    assert torch.equal(y.cpu(), before * 2.0)
    assert torch.equal(x.cpu(), before + 1.0)


def test_autograd_through_a_chain_matches_unchained():
    x0 = torch.randn(N)

    def loss_and_grad():
        x = x0.to("ember").requires_grad_()
        loss = gelu_new(x).sum()
        loss.backward()
        return [loss.detach().cpu(), x.grad.cpu()]

    got = loss_and_grad()
    assert torch_ember.chain_stats()["chains"] >= 1
    for g, w in zip(got, unchained(loss_and_grad), strict=True):
        assert torch.equal(g, w)


def test_small_tensors_other_dtypes_and_parity_are_not_chained():
    small = torch.randn(100, 100).to("ember")  # 10000 elements
    (small * 2.0 + 1.0).cpu()
    (torch.randn(N, dtype=torch.float64).to("ember") * 2.0 + 1.0).cpu()
    x = torch.randn(N).to("ember")
    with be.flags(cpu_parity=True):
        (x * 2.0 + 1.0).cpu()
    with be.flags(async_execution=False):
        (x * 2.0 + 1.0).cpu()
    with be.flags(fuse_elementwise=False):
        (x * 2.0 + 1.0).cpu()
    assert torch_ember.chain_stats()["chains"] == 0


def test_chains_longer_than_a_unit_and_of_other_sizes_split():
    x = torch.randn(N).to("ember")
    y = x
    for _ in range(40):  # more steps than one chain holds
        y = y * 1.0009765625 + 0.5
    other = torch.randn(2 * N[0], N[1]).to("ember") * 3.0  # another size
    expect_y = x.cpu()
    for _ in range(40):
        expect_y = expect_y * 1.0009765625 + 0.5
    assert torch.equal(y.cpu(), expect_y)
    assert other.shape == (2 * N[0], N[1])
    assert torch_ember.chain_stats()["chains"] >= 6


def test_threads_on_their_own_streams_get_their_own_results():
    inputs = [torch.randn(N) for _ in range(4)]
    results = [None] * 4

    def work(i):
        stream = torch.ember.Stream()
        with torch.ember.stream(stream):
            x = inputs[i].to("ember")
            for _ in range(20):
                y = gelu_new(x)
            results[i] = y.cpu()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(4):
        assert torch.equal(results[i], unchained(gelu_new, inputs[i].to("ember")))


def test_memory_held_by_a_chain_is_released():
    torch.ember.empty_cache()
    before = torch.ember.memory_allocated()
    x = torch.randn(N).to("ember")
    y = gelu_new(x)
    del x, y
    assert torch.ember.memory_allocated() == before


def test_a_graph_captures_chainable_ops_and_replays_them():
    x = torch.randn(N).to("ember")
    before = x.cpu()
    held = x * 2.0  # held when the capture begins: not part of the graph
    graph = torch.ember.EmberGraph()
    with torch.ember.graph(graph):
        y = gelu_new(x)
    assert torch.equal(held.cpu(), before * 2.0)
    x.copy_(torch.randn(N))
    graph.replay()
    assert torch.equal(y.cpu(), unchained(gelu_new, x))


def test_the_switch_is_a_flag_and_an_environment_variable():
    assert be.fuse_elementwise is True
    with be.flags(fuse_elementwise=False):
        assert be.fuse_elementwise is False
    assert be.fuse_elementwise is True
    with pytest.raises(ValueError):
        be.fuse_elementwise = "yes"
    env = {**os.environ, "EMBER_FUSE_ELEMENTWISE": "0"}
    code = "import torch, torch_ember; print(torch.backends.ember.fuse_elementwise)"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"
