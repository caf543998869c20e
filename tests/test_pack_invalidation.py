"""Packed weights see the writes no version counter tells of.

ember packs a GEMM's weight once and checks, at each call, that it was not
written since: by its version counter, and by the writes ember's own op
paths report for its storage (ops/StorageWrites.h). These tests write a
packed weight where no counter moves -- an inference tensor (a model moved
to ember under torch.inference_mode()), a graph replay, a compiled kernel's
raw stores -- and check that the next linear computes from the new values.
"""

import pytest
import torch

import torch_ember  # noqa: F401

DEVICE = "ember"
be = torch.backends.ember


pytestmark = pytest.mark.usefixtures("empty_caches")


def _assert_linear(out, lin, x):
    ref = torch.nn.functional.linear(x.cpu(), lin.weight.cpu(), lin.bias.cpu())
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-5, atol=1e-5)


INFERENCE_WRITES = {
    "mul_": lambda w: w.mul_(2),
    "add_": lambda w: w.add_(1.0),
    "copy_": lambda w: w.copy_(torch.randn(w.shape)),
    "fill_": lambda w: w.fill_(0.5),
    "zero_": lambda w: w.zero_(),
    "normal_": lambda w: w.normal_(),
    "init": lambda w: torch.nn.init.xavier_uniform_(w),
    "row": lambda w: w.__setitem__(0, 3.0),
    "view": lambda w: w.view(-1)[::7].mul_(-1),
    "load_state_dict": None,  # the module's own load_state_dict
}


@pytest.mark.parametrize("rows", [1, 40])  # the skinny kernel; the tall route
@pytest.mark.parametrize("write", list(INFERENCE_WRITES))
def test_inference_tensors_are_packed_and_their_writes_seen(write, rows):
    torch.manual_seed(0)
    with torch.inference_mode():
        lin = torch.nn.Linear(48, 32).to(DEVICE)
        x = torch.randn(rows, 48, device=DEVICE)
        assert lin.weight.is_inference()
        for _ in range(3):
            lin(x)
        info = be.packed_weights_info()
        assert info["packs"] >= 1 and info["hits"] >= 1
        if write == "load_state_dict":
            lin.load_state_dict({"weight": torch.randn(32, 48), "bias": torch.randn(32)})
        else:
            INFERENCE_WRITES[write](lin.weight)
        outs = [lin(x) for _ in range(3)]  # the new contents packed on their second use
    assert be.packed_weights_info()["invalidations"] >= 1
    for out in outs:
        _assert_linear(out, lin, x)


@pytest.mark.parametrize("inference", [False, True])
def test_a_replay_that_writes_a_packed_weight_drops_its_pack(inference):
    """A replay runs its recorded kernels, through none of ember's op paths
    and with no version counter bumped: the graph reports the storages its
    capture wrote at each replay."""
    torch.manual_seed(0)
    scope = torch.inference_mode() if inference else torch.no_grad()
    with scope:
        lin = torch.nn.Linear(64, 64).to(DEVICE)
        x = torch.randn(20, 64, device=DEVICE)
        for _ in range(3):
            lin(x)
        g = torch.ember.EmberGraph()
        with torch.ember.graph(g):
            lin.weight.mul_(2)
        for _ in range(2):
            for _ in range(3):
                lin(x)  # packed again after the capture's own write
            g.replay()
            _assert_linear(lin(x), lin, x)


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_a_compiled_in_place_update_of_a_weight_drops_its_pack(mode):
    """Inductor's C++ kernel writes the weight through a raw pointer: its
    non-const pointer arguments are reported as written at the launch, so
    an eager linear after it does not use the weight's old pack (under
    inference_mode the weight has no version counter to tell it)."""
    torch.manual_seed(0)
    scope = torch.no_grad() if mode == "no_grad" else torch.inference_mode()
    with scope:
        lin = torch.nn.Linear(64, 48).to(DEVICE)
        x = torch.randn(8, 64, device=DEVICE)

        @torch.compile
        def update(w):
            w.mul_(2.0)
            w.add_(1.0)

        for _ in range(3):
            lin(x)  # packed
        for _ in range(3):
            update(lin.weight)
            _assert_linear(lin(x), lin, x)


def test_an_inference_graph_sees_a_weight_another_graphs_replay_updates():
    """A graph's packed linear checks its weight at each replay; the update
    comes from another graph's replay (a graphed optimizer step)."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 64).to(DEVICE)
    x = torch.randn(20, 64, device=DEVICE)
    with torch.no_grad():
        for _ in range(3):
            lin(x)
        forward, update = torch.ember.EmberGraph(), torch.ember.EmberGraph()
        with torch.ember.graph(update):  # first: its capture's own write is
            lin.weight.mul_(2)  # then older than the forward's check
        for _ in range(3):
            lin(x)
        with torch.ember.graph(forward):
            y = lin(x)
        for _ in range(3):
            update.replay()
            forward.replay()
            _assert_linear(y, lin, x)
