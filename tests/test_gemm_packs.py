"""ember's packed-weight cache: a GEMM weight is packed once and reused;
the pack is dropped when the weight is written (its version counter,
load_state_dict, ``param.data =``, writes through aliases), freed by
``empty_cache`` and by the weight's release, and the cache is bounded by
``torch.backends.ember.packed_weights_limit`` (counted in memory stats).
Writes no version counter tells of: test_pack_invalidation.py."""

import gc

import pytest
import torch
from gemm_reference import check_fp32 as _check_fp32

import torch_ember  # noqa: F401

DEVICE = "ember"
be = torch.backends.ember


def _packs():
    return be.packed_weights_info()


pytestmark = pytest.mark.usefixtures("empty_caches")


def test_weight_writes_invalidate_packs():
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 24).to(DEVICE)
    x = torch.randn(3, 32, device=DEVICE)
    for _ in range(3):
        lin(x)
    assert _packs()["entries"] == 1

    def check():
        w, b = lin.weight.detach().cpu(), lin.bias.detach().cpu()
        for _ in range(3):  # unpacked, repacked, packed
            _check_fp32(lin(x), x.cpu(), w.t(), b)

    with torch.no_grad():
        lin.weight.mul_(-2.0)  # in-place write: version counter
    check()
    state = {"weight": torch.randn(24, 32), "bias": torch.randn(24)}
    lin.load_state_dict(state)
    check()
    lin.weight.data = torch.randn(24, 32, device=DEVICE)  # a new storage
    check()
    assert _packs()["invalidations"] >= 2


@pytest.mark.parametrize("rows", [1, 64])  # skinny panels, oneDNN's pack
@pytest.mark.parametrize(
    "write",
    [
        lambda w: w.data.mul_(-2.0),  # .data: a version counter of its own
        lambda w: w.data.copy_(torch.randn(w.shape)),  # ember's copy_
        lambda w: w.data.normal_(),  # a delegated in-place op
        lambda w: torch.mm(torch.eye(w.shape[0], device=w.device), w.data.clone(), out=w.data),
        lambda w: torch.empty(0, device=w.device).set_(w.untyped_storage(), 0, w.shape).zero_(),
    ],
    ids=["data_mul_", "data_copy_", "data_normal_", "mm_out", "storage_alias"],
)
def test_writes_through_aliases_invalidate_packs(write, rows):
    """A pack is dropped when its weight's memory is written through any
    tensor, not only through tensors sharing the weight's version counter."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 24).to(DEVICE)
    x = torch.randn(rows, 32, device=DEVICE)
    with torch.no_grad():
        for _ in range(3):
            lin(x)
        assert _packs()["entries"] == 1
        version = lin.weight._version
        write(lin.weight)
        assert lin.weight._version == version  # the weight's counter did not move
        _check_fp32(lin(x), x.cpu(), lin.weight.cpu().t(), lin.bias.cpu())
    assert _packs()["invalidations"] == 1


def test_a_graph_replay_sees_a_weight_written_through_data():
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 24).to(DEVICE).eval()
    x = torch.randn(1, 32, device=DEVICE)
    with torch.inference_mode():
        lin(x)
        lin(x)
        graph = torch.ember.EmberGraph()
        with torch.ember.graph(graph):
            out = lin(x)
    with torch.no_grad():
        lin.weight.data.mul_(3.0)
    graph.replay()
    _check_fp32(out, x.cpu(), lin.weight.detach().cpu().t(), lin.bias.detach().cpu())


def test_empty_cache_and_release_free_packs():
    lin = torch.nn.Linear(512, 512).to(DEVICE)
    x = torch.randn(2, 512, device=DEVICE)
    before = torch.ember.memory_allocated()
    lin(x), lin(x)
    pack_bytes = torch.ember.memory_stats()["packed_weight_bytes"]
    assert pack_bytes >= 512 * 512 * 4
    assert torch.ember.memory_allocated() - before >= pack_bytes
    torch.ember.empty_cache()
    assert _packs()["entries"] == 0 and _packs()["bytes"] == 0
    assert torch.ember.memory_stats()["packed_weight_bytes"] == 0
    # a released weight's pack goes back at the next miss
    lin(x), lin(x)
    assert _packs()["bytes"] > 0
    del lin
    gc.collect()
    other = torch.nn.Linear(8, 8).to(DEVICE)
    other(torch.randn(1, 8, device=DEVICE))
    assert _packs()["bytes"] == 0


def test_packed_weights_limit_bounds_the_cache():
    layers = [torch.nn.Linear(256, 256).to(DEVICE) for _ in range(4)]
    x = torch.randn(1, 256, device=DEVICE)
    one_pack = 256 * 256 * 4
    with be.flags(packed_weights_limit=2 * one_pack):
        for _ in range(3):
            for lin in layers:
                out = lin(x)
        info = _packs()
        assert info["bytes"] <= 2 * one_pack
        # the two packs held stay; the other weights run unpacked (counted)
        assert info["packs"] >= 2 and info["admissions_refused"] >= 1
        _check_fp32(out, x.cpu(), layers[-1].weight.detach().cpu().t(), layers[-1].bias.cpu())
    with be.flags(packed_weights_limit=0):  # packing off: still correct
        torch.ember.empty_cache()
        for _ in range(2):
            out = layers[0](x)
        assert _packs()["packs"] == 0
    with pytest.raises(ValueError):
        be.packed_weights_limit = -1


def _passes(layers, x, n):
    for _ in range(n):
        for lin in layers:
            out = lin(x)
    return out


def test_a_model_larger_than_the_pack_budget_keeps_its_packs():
    # Three weights used in turn, room for two: LRU alone would evict each
    # pack just before its next use and re-pack on every call (no hits).
    layers = [torch.nn.Linear(256, 256).to(DEVICE) for _ in range(3)]
    x = torch.randn(1, 256, device=DEVICE)
    with be.flags(packed_weights_limit=2 * 256 * 256 * 4):
        _passes(layers, x, 2)
        before = _packs()
        out = _passes(layers, x, 12)
        after = _packs()
    assert after["bytes"] <= 2 * 256 * 256 * 4
    assert after["hits"] - before["hits"] >= 12  # most calls find a pack
    assert after["packs"] - before["packs"] <= 6  # where LRU would make 36
    assert after["admissions_refused"] > before["admissions_refused"]
    _check_fp32(out, x.cpu(), layers[-1].weight.detach().cpu().t(), layers[-1].bias.cpu())


def test_packs_of_a_model_no_longer_run_give_way_to_the_next():
    first = [torch.nn.Linear(256, 256).to(DEVICE) for _ in range(3)]
    second = [torch.nn.Linear(256, 256).to(DEVICE) for _ in range(3)]
    x = torch.randn(1, 256, device=DEVICE)
    with be.flags(packed_weights_limit=3 * 256 * 256 * 4):
        _passes(first, x, 6)
        assert _packs()["entries"] == 3
        hits = _packs()["hits"]
        _passes(second, x, 8)  # `first` stays alive, unused
        info = _packs()
    assert info["evictions"] >= 1 and info["entries"] <= 3
    # the second model's weights are packed and hit within a few passes
    assert info["hits"] - hits >= 3


def test_the_pack_budget_counts_packed_data_and_memory_stats_the_allocation():
    """MKL sizes its pack with room it never writes (~8 MB more for a
    768 x 768 weight): memory statistics count the whole allocation, the
    pack cache's byte budget only the packed data, so a model's packs fit
    the budget as their data does (counting the reserve, BERT-base's MKL
    packs took 1 GB of a 4 GiB budget, and four model copies in one process
    evicted each other's packs on every call)."""
    lin = torch.nn.Linear(768, 768).to(DEVICE)
    x = torch.randn(32, 768, device=DEVICE)
    for _ in range(3):
        lin(x)
    info = _packs()
    assert info["packs"] == 1
    allocated = torch.ember.memory_stats()["packed_weight_bytes"]
    if info["library"] == "mkl":
        assert info["bytes"] == 768 * 768 * 4
        assert allocated > info["bytes"]
    else:
        assert allocated == info["bytes"]
