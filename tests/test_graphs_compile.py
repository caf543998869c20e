"""Graphs through torch.compile: ``backend="ember"`` with graphs (the Dynamo
graph's ops replayed), Inductor's ``mode="reduce-overhead"`` (the compiled
code replayed, ``torch_ember/compile/inductor_graphs.py``), and compiled code
captured by hand. Replays give the bits of the code they captured."""

import warnings

import pytest
import torch
from test_graphs import _mlp

import torch_ember
from torch_ember.compile import graphed

DEV = "ember"


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_compile_reduce_overhead_on_the_ember_backend_replays_a_graph():
    model = _mlp().eval()
    x = torch.randn(2, 32, device=DEV)
    before = dict(graphed.counters)
    with torch.inference_mode():
        compiled = torch.compile(model, backend="ember", mode="reduce-overhead")
        for _ in range(4):  # two warm-ups, the capture, one replay
            out = compiled(x)
        assert graphed.counters["captures"] == before["captures"] + 1
        assert graphed.counters["replays"] == before["replays"] + 1
        assert torch.equal(out.cpu(), model(x).cpu())
        other = torch.randn(2, 32, device=DEV)
        assert torch.equal(compiled(other).cpu(), model(other).cpu())


def test_the_ember_backend_replays_small_inference_graphs_by_default():
    """backend="ember" without a graphs option replays a small inference graph
    (a batch-1 MLP: host work is its cost) with each call's outputs its own;
    a graph with a large value, or compiled with grad enabled, goes to Inductor."""
    from torch_ember.compile import backend as ember_backend

    model = _mlp().eval()
    before, auto = dict(graphed.counters), ember_backend.counters["auto_graphs"]
    inputs = [torch.randn(1, 32, device=DEV) for _ in range(5)]
    with torch.inference_mode():
        for _ in range(2):  # weights packed (a weight's first call is not packed)
            model(inputs[0])
        compiled = torch.compile(model, backend="ember")
        outs = [compiled(x) for x in inputs]  # two warm-ups, the capture, replays
        assert ember_backend.counters["auto_graphs"] == auto + 1
        assert graphed.counters["captures"] == before["captures"] + 1
        assert graphed.counters["replays"] == before["replays"] + 2
        # not overwritten by later calls: each equals eager on its own input
        for x, out in zip(inputs, outs):
            assert torch.equal(out.cpu(), model(x).cpu())
        torch._dynamo.reset()
        torch.compile(model, backend="ember")(torch.randn(1024, 32, device=DEV))
        assert ember_backend.counters["auto_graphs"] == auto + 1  # 32768 elements: Inductor
    torch._dynamo.reset()
    torch.compile(model, backend="ember")(inputs[0]).sum().backward()
    assert ember_backend.counters["auto_graphs"] == auto + 1  # training: Inductor


def test_default_inductor_replays_small_inference_graphs(monkeypatch):
    """With ``inductor_graphs.AUTO_REPLAY`` (off by default), the default backend
    (no mode) replays a small inference graph's compiled
    code with each call's outputs its own, bitwise equal to that code run
    without a graph; a graph with a kernel that opens an OpenMP region, with a
    dynamic input, or compiled with grad enabled, runs as compiled."""
    from torch_ember.compile import inductor_graphs

    model = _mlp().eval()
    inputs = [torch.randn(1, 32, device=DEV) for _ in range(5)]
    with torch.inference_mode():
        for _ in range(2):  # weights packed (a weight's first call is not packed)
            model(inputs[0])
        monkeypatch.setattr(inductor_graphs, "AUTO_REPLAY", False)
        plain = torch.compile(model)
        expected = [plain(x).clone() for x in inputs]
        torch._dynamo.reset()
        monkeypatch.setattr(inductor_graphs, "AUTO_REPLAY", True)
        before = _counts()
        compiled = torch.compile(model)
        outs = [compiled(x) for x in inputs]  # two warm-ups, the capture, replays
        assert graphed.counters["inductor_auto_graphs"] == before["inductor_auto_graphs"] + 1
        assert graphed.counters["captures"] == before["captures"] + 1
        assert graphed.counters["replays"] == before["replays"] + 2
        # not overwritten by later calls: each is the compiled code's result
        for want, out in zip(expected, outs):
            assert torch.equal(out.cpu(), want.cpu())
        # captured by hand in a graph of the caller's: the replay is recorded
        x = inputs[0].clone()
        side = torch.ember.Stream()
        side.wait_stream(torch.ember.current_stream())
        graph = torch.ember.EmberGraph()
        with torch.ember.graph(graph, stream=side):
            out = compiled(x)
        x.copy_(inputs[1])
        graph.replay()
        assert torch.equal(out.cpu(), expected[1].cpu())
        torch._dynamo.reset()
        auto = graphed.counters["inductor_auto_graphs"]
        # a softmax over 64 rows: Inductor's kernel runs its rows in an OpenMP region
        softmax = torch.compile(lambda a: torch.softmax(a * 2, -1))
        x = torch.randn(64, 256, device=DEV)
        for _ in range(4):
            torch.testing.assert_close(softmax(x).cpu(), torch.softmax(x.cpu() * 2, -1))
        assert graphed.counters["inductor_auto_graphs"] == auto
        # a GEMM's result allocated by its extern kernel (ember::gemm), and its
        # operands (copied on every call), are values as large as any
        a, b = torch.randn(256, 256, device=DEV), torch.randn(256, 256, device=DEV)
        product = torch.compile(lambda p, q: p @ q)
        for _ in range(4):
            torch.testing.assert_close(product(a, b).cpu(), a.cpu() @ b.cpu(), rtol=1e-4, atol=1e-4)
        assert graphed.counters["inductor_auto_graphs"] == auto
        # a dynamic batch summed away: no buffer is dynamic, the input is
        total = torch.compile(lambda a: a.sum(0))
        for rows in (3, 3, 3, 3, 5, 7):
            x = torch.randn(rows, 32, device=DEV)
            torch._dynamo.mark_dynamic(x, 0)
            torch.testing.assert_close(total(x).cpu(), x.cpu().sum(0))
        assert graphed.counters["inductor_auto_graphs"] == auto
    torch._dynamo.reset()
    torch.compile(model)(inputs[0]).sum().backward()
    assert graphed.counters["inductor_auto_graphs"] == auto


@pytest.mark.parametrize("backend", ["inductor", "ember"])
@pytest.mark.parametrize("streams", [False, True])
def test_automatic_graphs_are_safe_to_call_from_several_threads(backend, streams, monkeypatch):
    """A graph the backend chose to replay (small, outputs cloned) is called from
    4 threads at once, each on its own input (and, with ``streams``, its own
    stream): every call gets its own input's result, as the compiled code would
    give it. (One set of static inputs serves all calls: without turns, a
    thread's input copy lands between another's copy and its replay.)"""
    import sys
    import threading

    from torch_ember.compile import inductor_graphs

    monkeypatch.setattr(inductor_graphs, "AUTO_REPLAY", True)  # the default backend's: opt-in
    model = _mlp().eval()
    inputs = [torch.randn(1, 32, device=DEV) for _ in range(4)]
    with torch.inference_mode():
        for _ in range(2):
            model(inputs[0])
        compiled = torch.compile(model, backend=backend)
        for _ in range(3):  # two warm-ups, the capture
            compiled(inputs[0])
        expected = [compiled(x).cpu() for x in inputs]  # replays, one at a time
    failures = []

    def run(i):
        stream = torch.ember.Stream() if streams else torch.ember.current_stream()
        with torch.inference_mode(), torch.ember.stream(stream):
            for _ in range(20):
                if not torch.equal(compiled(inputs[i]).cpu(), expected[i]):
                    failures.append(i)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as they can
    try:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not failures, f"{len(failures)} of 80 calls got another input's result"


def test_compile_graphs_capture_again_when_a_parameter_gets_new_memory():
    """A replay reads the parameters' memory as captured: after `param.data =
    ...` (new storage, same Parameter object) the graph is captured again."""
    model = _mlp().eval()
    x = torch.randn(2, 32, device=DEV)
    with torch.inference_mode():
        # not frozen: the parameters are the graph's inputs (a frozen graph
        # keeps the values it was compiled with, docs/compile.md)
        compiled = torch.compile(
            model, backend="ember", options={"graphs": True, "freezing": False}
        )
        for _ in range(4):  # two warm-ups, the capture, one replay
            compiled(x)
        before = dict(graphed.counters)
    weight = next(model.parameters())
    weight.data = weight.data * 2
    with torch.inference_mode():
        expected = model(x).cpu()
        for _ in range(4):  # whether Dynamo recompiles or the replay notices
            assert torch.equal(compiled(x).cpu(), expected)
        assert graphed.counters["captures"] > before["captures"]


@pytest.mark.parametrize("async_execution", [True, False])
def test_capturing_compiled_code_records_its_cpp_kernels(async_execution, monkeypatch):
    """Code compiled by the default Inductor backend can be captured as CUDA's
    can: its generated C++ kernels are recorded like ops, and a replay gives
    the compiled call's bits for the new input. (The compiled code itself: so
    small a graph is otherwise replayed by the backend, whose replay a capture
    records as one unit, test_default_inductor_replays_small_inference_graphs.)"""
    from torch_ember.compile import inductor_graphs

    monkeypatch.setattr(inductor_graphs, "AUTO_REPLAY", False)
    model = _mlp().eval()
    compiled = torch.compile(model)
    x = torch.randn(2, 32, device=DEV)
    with torch.inference_mode(), torch.backends.ember.flags(async_execution=async_execution):
        for _ in range(3):  # compiles; packs the weights on their second use
            compiled(x)
        torch_ember.reset_launch_stats()
        side = torch.ember.Stream()
        side.wait_stream(torch.ember.current_stream())
        graph = torch.ember.EmberGraph()
        with torch.ember.graph(graph, stream=side):
            out = compiled(x)
        recorded = {k for k in torch_ember.launch_stats() if k.startswith("cpp_")}
        assert recorded  # the kernels went through the capture
        new = torch.randn(2, 32, device=DEV)
        x.copy_(new)
        graph.replay()
        assert torch.equal(out.cpu(), compiled(new.clone()).cpu())


def test_compile_graphs_falls_back_to_eager_with_a_warning():

    host = torch.arange(16.0).reshape(1, 1, 4, 4)

    def fn(a):
        return a + host.to(DEV)  # a host tensor: an input a graph cannot keep

    x = torch.randn(1, 1, 4, 4, device=DEV)
    compiled = torch.compile(fn, backend="ember", options={"graphs": True})
    with torch.inference_mode(), pytest.warns(UserWarning, match="running eagerly"):
        outs = [compiled(x) for _ in range(3)]
    assert all(torch.equal(out.cpu(), fn(x).cpu()) for out in outs)


# --------------------------------------------------------------------------- Inductor, reduce-overhead


def _counts():
    return dict(graphed.counters)


def test_inductor_reduce_overhead_replays_the_compiled_code():
    """mode="reduce-overhead" with the default backend: two warm-ups run the
    compiled code, the third call captures it, later calls replay it. A
    replay gives the compiled code's bits, for the captured input and for a
    new one."""
    model = _mlp().eval()
    x = torch.randn(2, 32, device=DEV)
    new = torch.randn(2, 32, device=DEV)  # made outside inference_mode, as x (no recompile)
    with torch.inference_mode():
        compiled = torch.compile(model, mode="reduce-overhead")
        plain = torch.compile(model)
        before = _counts()
        first = compiled(x).clone()  # warm-up: the compiled code itself
        outs = [compiled(x).clone() for _ in range(4)]  # warm-up, capture, 2 replays
        assert graphed.counters["captures"] == before["captures"] + 1
        assert graphed.counters["replays"] == before["replays"] + 2
        assert all(torch.equal(first.cpu(), out.cpu()) for out in outs)
        replayed = compiled(new).clone()
        assert graphed.counters["replays"] == before["replays"] + 3
        assert torch.equal(replayed.cpu(), plain(new).cpu())
        torch.testing.assert_close(replayed.cpu(), model(new).cpu())


def test_inductor_reduce_overhead_replay_launches_no_kernel_one_by_one():
    """A replay runs the recorded kernels as one unit: none of the compiled
    code's C++ kernels is launched (and counted) on its own."""
    model = _mlp().eval()
    x = torch.randn(2, 32, device=DEV)
    with torch.inference_mode(), torch.backends.ember.flags(async_execution=True):
        compiled = torch.compile(model, mode="reduce-overhead")
        for _ in range(3):
            compiled(x)
        expected = compiled(x).clone()
        torch_ember.reset_launch_stats()
        compiled(x)
        stats = torch_ember.launch_stats()
        assert not any(k.startswith("cpp_") for k in stats)  # no kernel launched one by one
        assert torch.equal(compiled(x).cpu(), expected.cpu())


def test_inductor_reduce_overhead_writes_a_fixed_input_in_place():
    """A graph that updates a buffer in place (a static KV cache's pattern):
    the buffer keeps its memory from call to call, so the replay writes it."""

    def step(cache, x):
        cache.add_(x)
        return cache * 2

    cache = torch.zeros(4, device=DEV)
    x = torch.ones(4, device=DEV)
    with torch.inference_mode():
        compiled = torch.compile(step, mode="reduce-overhead")
        before = _counts()
        for i in range(1, 6):
            out = compiled(cache, x)
            assert torch.equal(cache.cpu(), torch.full((4,), float(i)))
            assert torch.equal(out.cpu(), torch.full((4,), 2.0 * i))
        assert graphed.counters["replays"] == before["replays"] + 2


def test_inductor_reduce_overhead_runs_eagerly_when_a_written_input_moves():
    """A written input with new memory on every call cannot be replayed
    (the replay would write its static copy): the compiled code runs, once warned."""

    def step(cache, x):
        cache.add_(x)
        return cache.sum()

    x = torch.ones(4, device=DEV)
    with torch.inference_mode():
        compiled = torch.compile(step, mode="reduce-overhead")
        before = _counts()
        caches = [torch.zeros(4, device=DEV) for _ in range(4)]  # new memory every call
        with pytest.warns(UserWarning, match="written in place"):
            sums = [compiled(cache, x).item() for cache in caches]
        assert sums == [4.0] * 4
        assert all(torch.equal(cache.cpu(), torch.ones(4)) for cache in caches)
        assert graphed.counters["captures"] == before["captures"]


def _dropout_mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Dropout(0.5), torch.nn.Linear(64, 8)
    ).to(DEV)


def _train(mode, steps=8, batches=1):
    """SGD steps of the dropout MLP compiled in ``mode``; each step takes
    ``batches`` forwards before its backward. Losses and final parameters."""
    model = _dropout_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    compiled = torch.compile(model, mode=mode)
    torch.manual_seed(1)
    losses = []
    for _ in range(steps):
        loss = sum(compiled(torch.randn(4, 32, device=DEV)).square().mean() for _ in range(batches))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


def test_inductor_reduce_overhead_replays_training_steps():
    """A training step under reduce-overhead: AOTAutograd's forward and
    backward are each captured on their third call and replayed after it.
    Dropout draws new numbers on every replay, as the compiled code does
    (the capture consumes them like a call), so losses and parameters are
    the compiled code's, bit for bit."""
    expected = _train(None)
    torch._dynamo.reset()
    before = _counts()
    losses, params = _train("reduce-overhead")
    assert graphed.counters["captures"] == before["captures"] + 2  # forward, backward
    assert graphed.counters["replays"] == before["replays"] + 2 * (8 - 3)
    assert graphed.counters["busy_outputs"] == before["busy_outputs"]
    assert losses == expected[0]
    assert all(torch.equal(p, q) for p, q in zip(params, expected[1]))
    assert len(set(losses)) == len(losses)  # dropout differs per step


def test_training_replay_keeps_the_outputs_autograd_still_needs():
    """Two forwards before one backward: the second call would overwrite
    the tensors the first one saved for backward, so it runs the compiled
    code without the graph, and the gradients stay the compiled code's."""
    expected = _train(None, steps=5, batches=2)
    torch._dynamo.reset()
    before = _counts()
    losses, params = _train("reduce-overhead", steps=5, batches=2)
    assert graphed.counters["busy_outputs"] > before["busy_outputs"]
    assert graphed.counters["replays"] > before["replays"]  # the first forward, the backward
    assert losses == expected[0]
    assert all(torch.equal(p, q) for p, q in zip(params, expected[1]))


def test_replay_hands_out_views_of_the_callers_input():
    """An output that is an input the replay copies (a training forward
    returns the input it saves) is the caller's tensor, not the static copy."""

    def step(x):
        return x * 2, x.t()

    with torch.inference_mode():
        compiled = torch.compile(step, mode="reduce-overhead")
        before = _counts()
        for i in range(5):
            x = torch.full((2, 3), float(i), device=DEV)
            doubled, view = compiled(x)
            assert torch.equal(doubled.cpu(), torch.full((2, 3), 2.0 * i))
            assert view.data_ptr() == x.data_ptr() and view.shape == (3, 2)
        assert graphed.counters["replays"] == before["replays"] + 2


def test_inductor_graph_policy_is_installed_without_cuda():
    from torch_ember.compile import inductor_graphs

    torch.compile(lambda a: a + 1)(torch.ones(1, device=DEV))  # loads Inductor
    assert inductor_graphs.installed() == (not torch.cuda.is_available())


@pytest.mark.requires_two_devices
@pytest.mark.parametrize("backend", ["inductor", "ember"])
def test_reduce_overhead_captures_on_the_inputs_device(backend):
    """A model on ember:1 while ember:0 is current: the capture runs on a side
    stream of ember:1 (before, it captured on ember:0's and recorded nothing)."""
    model = _mlp().to("ember:1").eval()
    x = torch.randn(2, 32, device="ember:1")
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no fallback to eager
        compiled = torch.compile(model, backend=backend, mode="reduce-overhead")
        before = _counts()
        outs = [compiled(x).clone() for _ in range(4)]
        assert graphed.counters["captures"] == before["captures"] + 1
        assert graphed.counters["replays"] == before["replays"] + 1
        assert outs[-1].device == x.device
        torch.testing.assert_close(outs[-1].cpu(), model(x).cpu())


def test_transformers_static_cache_generate_replays_each_decode_step():
    """The recipe transformers documents for CUDA graphs: a static KV cache
    and the forward compiled with mode="reduce-overhead". Each decode step
    after the warm-ups is one replay, and the tokens are eager's."""
    tr = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = tr.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=256, bos_token_id=0, eos_token_id=1
    )
    model = tr.GPT2LMHeadModel(cfg).eval().to(DEV)
    ids = torch.randint(2, 256, (1, 6), device=DEV)
    kwargs = {"max_new_tokens": 10, "do_sample": False, "cache_implementation": "static"}
    with torch.no_grad():
        expected = model.generate(ids, **kwargs)
        model.forward = torch.compile(model.forward, mode="reduce-overhead")
        before = _counts()
        with warnings.catch_warnings():
            # the prompt's graph takes a host scalar input and runs unreplayed (warned)
            warnings.simplefilter("ignore", UserWarning)
            tokens = model.generate(ids, **kwargs)
    assert torch.equal(tokens.cpu(), expected.cpu())
    # 9 decode steps: two warm-ups, the capture, six replays
    assert graphed.counters["captures"] == before["captures"] + 1
    assert graphed.counters["replays"] == before["replays"] + 6
