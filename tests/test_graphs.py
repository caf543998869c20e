"""Graph capture and replay (torch.ember.EmberGraph, torch.ember.graph,
make_graphed_callables, torch.accelerator.Graph): replays equal eager
execution bit for bit, in-place ops and views, RNG per replay, pools shared
between graphs, memory released by reset() (capture errors:
test_graphs_errors.py)."""

import pytest
import torch
from isa import VECTOR_KERNELS

import torch_ember

DEV = "ember"


def _mlp(width=32):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width),
        torch.nn.GELU(),
        torch.nn.Linear(width, 8),
    ).to(DEV)


def _capture(fn, *args):
    fn(*args)  # warm-up, as with CUDA graphs: ember packs a weight on its
    # second call, here the capture (the pack then serves eager calls too)
    g = torch.ember.EmberGraph()
    with torch.ember.graph(g):
        out = fn(*args)
    return g, out


@pytest.mark.parametrize("batch", [1, 4, 64])
def test_mlp_replay_is_bitwise_equal_to_eager(batch):
    model = _mlp().eval()
    static_x = torch.randn(batch, 32, device=DEV)
    with torch.inference_mode():
        g, static_y = _capture(model, static_x)
        for seed in range(3):
            new = torch.randn(batch, 32, generator=torch.Generator().manual_seed(seed))
            static_x.copy_(new)
            g.replay()
            expected = model(new.to(DEV))
            assert torch.equal(static_y.cpu(), expected.cpu())


@pytest.mark.parametrize("async_execution", [False, True])
def test_replay_leaves_the_callers_thread_count(async_execution):
    """Recorded units run at their launching thread count (a device's
    cores); a replay on the calling thread (synchronous execution) sets the
    caller's count back: a changed count failed Dynamo's global-state guard
    and recompiled mode="reduce-overhead" code on every call after a replay."""
    model = _mlp().eval()
    x = torch.randn(2, 32, device=DEV)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)  # other than any device's core count
        with torch.inference_mode(), torch.backends.ember.flags(async_execution=async_execution):
            g, y = _capture(model, x)
            g.replay()
            torch.ember.synchronize()
            assert torch.get_num_threads() == threads + 1
            assert torch.equal(y.cpu(), model(x).cpu())
    finally:
        torch.set_num_threads(threads)


def test_capture_leaves_real_values_and_records_units():
    model = _mlp().eval()
    x = torch.randn(2, 32, device=DEV)
    with torch.inference_mode():
        expected = model(x).cpu()
        g = torch.ember.EmberGraph()
        g.enable_debug_mode()
        with torch.ember.graph(g):
            y = model(x)
    assert torch.equal(y.cpu(), expected)


def test_debug_dump_lists_the_captured_ops(tmp_path):
    x = torch.randn(8, device=DEV)
    g = torch.ember.EmberGraph()
    g.enable_debug_mode()
    with torch.ember.graph(g):
        y = torch.relu(x) * 2
    path = tmp_path / "graph.txt"
    g.debug_dump(str(path))
    units = path.read_text().split()
    assert units == ["aten::relu", "aten::mul.Tensor"], units
    del y


def test_replay_does_no_per_op_host_work():
    model = _mlp().eval()
    x = torch.randn(1, 32, device=DEV)
    with torch.inference_mode():
        g, _ = _capture(model, x)
        torch.ember.synchronize()
        torch_ember.reset_launch_stats()
        for _ in range(5):
            g.replay()
        torch.ember.synchronize()
    stats = torch_ember.launch_stats()
    assert sum(stats.get("launches", {}).values()) == 0, stats


def test_transformer_block_replays_like_eager():
    torch.manual_seed(0)
    block = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    block = block.to(DEV).eval()
    x = torch.randn(2, 10, 64, device=DEV)
    with torch.no_grad():
        g, y = _capture(block, x)
        new = torch.randn(2, 10, 64)
        x.copy_(new)
        g.replay()
        assert torch.equal(y.cpu(), block(new.to(DEV)).cpu())


def test_small_cnn_replays_like_eager():
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 8, 3),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, 4),
    )
    net = net.to(DEV).eval()
    x = torch.randn(2, 3, 16, 16, device=DEV)
    with torch.inference_mode():
        g, y = _capture(net, x)
        new = torch.randn(2, 3, 16, 16)
        x.copy_(new)
        g.replay()
        assert torch.equal(y.cpu(), net(new.to(DEV)).cpu())


def test_launched_gemms_and_convolutions_replay_like_eager():
    """With asynchronous execution on, GEMMs of more than 16 rows and
    convolutions are launched work, which the capturing stream records."""
    torch.manual_seed(0)
    conv = torch.nn.Sequential(
        torch.nn.Conv2d(4, 8, 1), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3, padding=1)
    )
    linear = torch.nn.Linear(8, 8)
    conv, linear = conv.to(DEV).eval(), linear.to(DEV).eval()

    def step(x):
        h = conv(x).flatten(2).transpose(1, 2).reshape(-1, 8).contiguous()  # 64 rows
        h = linear(h)
        return h @ (h.t() * 0.5)  # two activations: the GEMM engine

    previous = torch.backends.ember.async_execution
    torch.backends.ember.async_execution = True
    try:
        x = torch.randn(1, 4, 8, 8, device=DEV)
        with torch.inference_mode():
            step(x)  # the weights are packed on their second call
            g, y = _capture(step, x)
            stats = torch_ember.launch_stats()
            for unit in (
                "aten::convolution (channel-gemm)",
                "aten::convolution (onednn)",
                f"aten::addmm ({torch.backends.ember.packed_weights_info()['library']})",
                "aten::mm",
            ):
                assert stats.get(unit, {}).get("launched", 0) > 0, (unit, stats)
            for seed in range(2):
                new = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(seed))
                x.copy_(new)
                g.replay()
                assert torch.equal(y.cpu(), step(new.to(DEV)).cpu())
    finally:
        torch.ember.synchronize()
        torch.backends.ember.async_execution = previous


def test_replay_writes_captured_outputs_in_place():
    """ember's own kernels and the launched ops' out= forms are recorded into
    the tensors capture returned: a replay allocates nothing (no fresh
    result copied into the captured one)."""
    if not VECTOR_KERNELS:
        pytest.skip("ember's batch-norm, pooling and GELU kernels need AVX-512F or AVX2")
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(8, 16, 1),  # ember's channel GEMM
        torch.nn.BatchNorm2d(16),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(16 * 4 * 4, 8),  # the skinny GEMM
        torch.nn.GELU(),
    )
    net = net.to(DEV).eval()
    x = torch.randn(1, 8, 8, 8, device=DEV)
    with torch.inference_mode():
        net(x)
        g, y = _capture(net, x)
        x.copy_(torch.randn(1, 8, 8, 8))
        allocated = torch.ember.memory_stats()["allocation.all.allocated"]
        g.replay()
        torch.ember.synchronize()
        assert torch.ember.memory_stats()["allocation.all.allocated"] == allocated
        assert torch.equal(y.cpu(), net(x).cpu())


@pytest.mark.parametrize("rows", [1, 64])  # the skinny kernel, MKL's or oneDNN's packed GEMM
@pytest.mark.parametrize("bias", [True, False])
def test_out_forms_of_linears_replay_the_packed_kernels(rows, bias):
    """Compiled code calls addmm/mm with out= (Inductor's extern kernels):
    captured, they record the packed-weight kernel into the out= tensor, as
    the functional forms do (before, the general GEMM ran at each replay,
    1.5x slower on a GPT-2 projection), and a later write of the weight is seen."""
    torch.manual_seed(0)
    weight = torch.randn(48, 32, device=DEV)
    b = torch.randn(48, device=DEV)
    x = torch.randn(rows, 32, device=DEV)
    out = torch.empty(rows, 48, device=DEV)

    def step():
        if bias:
            torch.addmm(b, x, weight.t(), out=out)
        else:
            torch.mm(x, weight.t(), out=out)

    with torch.inference_mode(), torch.backends.ember.flags(async_execution=True):
        step()
        step()  # packs the weight
        expected = out.clone()
        torch_ember.reset_launch_stats()
        g = torch.ember.EmberGraph()
        with torch.ember.graph(g):
            step()
        stats = torch_ember.launch_stats()
        library = torch.backends.ember.packed_weights_info()["library"]
        packed = "aten::addmm (skinny)" if rows == 1 else f"aten::addmm ({library})"
        assert stats.get(packed, {}).get("launched", 0) == 1, stats
        out.zero_()
        g.replay()
        assert torch.equal(out.cpu(), expected.cpu())
        weight.mul_(2)
        g.replay()
        reference = x.cpu() @ weight.cpu().t() + (b.cpu() if bias else 0)
        torch.testing.assert_close(out.cpu(), reference)


@pytest.mark.parametrize("layer", ["linear", "conv"])
def test_a_weight_written_between_replays_is_seen(layer):
    torch.manual_seed(0)
    if layer == "linear":
        net = torch.nn.Linear(16, 8).to(DEV).eval()
        x = torch.randn(2, 16, device=DEV)
    else:
        net = torch.nn.Conv2d(3, 4, 3).to(DEV).eval()
        x = torch.randn(1, 3, 8, 8, device=DEV)
    with torch.inference_mode():
        g, y = _capture(net, x)
    with torch.no_grad():
        net.weight.mul_(-2)  # between replays, as an optimizer step
    with torch.inference_mode():
        g.replay()
        torch.testing.assert_close(y.cpu(), net(x).cpu())


def test_in_place_ops_and_views_replay_each_time():
    x = torch.zeros(6, device=DEV)
    g = torch.ember.EmberGraph()
    with torch.ember.graph(g):
        x.add_(1)
        tail = x[2:]
        tail.mul_(2)
        total = x.sum()
    assert x.cpu().tolist() == [1, 1, 2, 2, 2, 2]  # the capture's own run
    g.replay()
    assert x.cpu().tolist() == [2, 2, 6, 6, 6, 6]
    assert total.item() == 28
    g.replay()
    assert x.cpu().tolist() == [3, 3, 14, 14, 14, 14]


def test_dropout_draws_new_numbers_per_replay_matching_eager():
    x = torch.ones(1000, device=DEV)
    drop = torch.nn.Dropout(0.5)
    g = torch.ember.EmberGraph()
    with torch.ember.graph(g):
        y = drop(x)
    torch.ember.manual_seed(123)
    replays = []
    for _ in range(3):
        g.replay()
        replays.append(y.cpu().clone())
    assert not torch.equal(replays[0], replays[1])
    torch.ember.manual_seed(123)
    eager = [drop(x).cpu() for _ in range(3)]
    for r, e in zip(replays, eager):
        assert torch.equal(r, e)


def test_capture_consumes_no_random_numbers():
    torch.ember.manual_seed(7)
    expected = torch.rand(4, device=DEV).cpu()
    torch.ember.manual_seed(7)
    x = torch.ones(4, device=DEV)
    g = torch.ember.EmberGraph()
    with torch.ember.graph(g):
        x.bernoulli_(0.5)
    assert torch.equal(torch.rand(4, device=DEV).cpu(), expected)


def test_graphs_share_a_pool_and_replay_in_capture_order():
    pool = torch.ember.graph_pool_handle()
    a = torch.randn(16, device=DEV)
    g1, g2 = torch.ember.EmberGraph(), torch.ember.EmberGraph()
    with torch.ember.graph(g1, pool=pool):
        b = a * 3
    with torch.ember.graph(g2, pool=g1.pool()):
        c = b + 1
    assert g1.pool() == g2.pool() == pool
    new = torch.randn(16)
    a.copy_(new)
    g1.replay()
    g2.replay()
    assert torch.equal(c.cpu(), new * 3 + 1)


def test_replay_on_the_default_stream_after_capture():
    a = torch.randn(8, device=DEV)
    g, b = _capture(torch.neg, a)
    assert torch.ember.current_stream() == torch.ember.default_stream()
    g.replay()
    torch.ember.synchronize()
    assert torch.equal(b.cpu(), -a.cpu())


def test_accelerator_graph_works_on_ember():
    x = torch.zeros(4, device=DEV)
    s = torch.ember.Stream()
    g = torch.accelerator.Graph()
    with torch.ember.stream(s), g:
        x += 1
    g.replay()
    assert x.cpu().tolist() == [2.0] * 4


def test_is_current_stream_capturing():
    assert not torch.ember.is_current_stream_capturing()
    g = torch.ember.EmberGraph()
    x = torch.ones(2, device=DEV)
    with torch.ember.graph(g):
        assert torch.ember.is_current_stream_capturing()
        x.mul_(2)
    assert not torch.ember.is_current_stream_capturing()


def test_static_cache_decode_replays_the_eager_tokens():
    tr = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = tr.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=100, n_positions=64)
    model = tr.GPT2LMHeadModel(cfg).eval().to(DEV)
    prompt = torch.randint(0, 100, (1, 6), generator=torch.Generator().manual_seed(1))

    def start():
        cache = tr.StaticCache(config=cfg, max_cache_len=32)
        out = model(
            input_ids=prompt.to(DEV),
            past_key_values=cache,
            cache_position=torch.arange(6, device=DEV),
        )
        return cache, out.logits[:, -1:].argmax(-1), torch.tensor([6], device=DEV)

    def step(cache, token, position):
        logits = model(input_ids=token, past_key_values=cache, cache_position=position)
        token.copy_(logits.logits[:, -1].argmax(-1, keepdim=True))
        position.add_(1)

    with torch.inference_mode():
        cache, token, position = start()
        eager = []
        for _ in range(8):
            step(cache, token, position)
            eager.append(token.item())
        cache, token, position = start()
        step(cache, token, position)  # warm-up: the first eager token
        replayed = [token.item()]
        g = torch.ember.EmberGraph()
        with torch.ember.graph(g):
            step(cache, token, position)  # capture runs the second
        replayed.append(token.item())
        for _ in range(6):
            g.replay()
            replayed.append(token.item())
    assert replayed == eager


# --------------------------------------------------------------------------- memory


def test_reset_and_empty_cache_release_graph_memory():
    torch.ember.empty_cache()
    x = torch.randn(256, 1024, device=DEV)
    base = torch.ember.memory_reserved()
    g = torch.ember.EmberGraph()
    with torch.ember.graph(g):
        y = (x * 2).relu() + 1
    held = torch.ember.memory_reserved()
    assert held > base
    del y
    g.reset()
    torch.ember.empty_cache()
    assert torch.ember.memory_reserved() == base


# --------------------------------------------------------------------------- graphed callables


def test_make_graphed_callables_training_matches_eager():
    model = _mlp(16)
    reference = _mlp(16)
    reference.load_state_dict(model.state_dict())
    x = torch.randn(4, 16, device=DEV, requires_grad=True)
    graphed = torch.ember.make_graphed_callables(model, (x,))
    for seed in range(2):
        data = torch.randn(4, 16, generator=torch.Generator().manual_seed(seed)).to(DEV)
        model.zero_grad(set_to_none=True)
        reference.zero_grad(set_to_none=True)
        graphed(data.requires_grad_()).sum().backward()
        reference(data.detach().requires_grad_()).sum().backward()
        for p, r in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad.cpu(), r.grad.cpu(), rtol=0, atol=0)


def test_make_graphed_callables_function_inference():
    w = torch.randn(8, 8, device=DEV)

    def fn(a):
        return torch.tanh(a @ w)

    sample = torch.randn(3, 8, device=DEV)
    fn(sample)
    graphed = torch.ember.make_graphed_callables(fn, (sample,))
    data = torch.randn(3, 8, device=DEV)
    assert torch.equal(graphed(data).cpu(), fn(data).cpu())
    with pytest.raises(ValueError, match="differs from the sample"):
        graphed(torch.randn(4, 8, device=DEV))


@pytest.mark.requires_two_devices
def test_default_capture_stream_is_the_current_devices():
    """torch.ember.graph's default side stream is per device (CUDA's stays on
    the device current when it was first made): a capture on ember:1 after
    one on ember:0 records ember:1's work."""
    for index in (0, 1):
        x = torch.ones(4, device=f"ember:{index}")
        with torch.ember.device(index):
            g = torch.ember.EmberGraph()
            with torch.ember.graph(g):
                y = x * 2
            assert torch.ember.graph.default_capture_stream.device.index == index
        x.fill_(3)
        g.replay()
        assert torch.equal(y.cpu(), torch.full((4,), 6.0))
