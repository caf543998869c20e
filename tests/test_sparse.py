"""Sparse tensors on ember (ops/SparseBridge.h): COO and the compressed
layouts, whose components (indices, values) are ember tensors. Ops run
CPU's sparse kernels over aliases of the components; results equal CPU's,
components stay on ember, autograd works, mixing with host tensors raises
CUDA's device error, and copy_ between host and ember copies as on CUDA."""

import warnings

import pytest
import torch

import torch_ember  # noqa: F401

DEVICE = "ember"

pytestmark = [
    pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta state"),
    pytest.mark.filterwarnings("ignore:Sparse invariant checks are implicitly disabled"),
]


def _coo():
    indices = torch.tensor([[0, 1, 1, 0], [2, 0, 2, 2]])
    values = torch.tensor([3.0, 4.0, 5.0, -1.0])
    return torch.sparse_coo_tensor(indices, values, (2, 3))


def _dense(shape=(4, 6), seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).relu()  # about half zeros


def test_coo_built_on_ember_keeps_its_components_there():
    cpu = _coo()
    on_ember = torch.sparse_coo_tensor(cpu._indices().to(DEVICE), cpu._values().to(DEVICE), (2, 3))
    assert on_ember.device.type == DEVICE and on_ember.layout == torch.sparse_coo
    assert on_ember._indices().device.type == DEVICE
    assert on_ember._values().device.type == DEVICE
    assert on_ember._nnz() == 4 and not on_ember.is_coalesced()
    assert torch.equal(on_ember.to_dense().cpu(), cpu.to_dense())
    assert "device='ember:0'" in str(on_ember)


def test_coo_ops_match_cpu():
    cpu = _coo()
    on_ember = cpu.to(DEVICE)
    coalesced = on_ember.coalesce()
    assert coalesced.is_coalesced()
    assert torch.equal(coalesced._indices().cpu(), cpu.coalesce()._indices())
    assert torch.equal(coalesced._values().cpu(), cpu.coalesce()._values())
    assert torch.equal((on_ember + on_ember).to_dense().cpu(), (cpu + cpu).to_dense())
    assert torch.equal((on_ember * 2).to_dense().cpu(), (cpu * 2).to_dense())
    assert torch.equal(torch.sparse.sum(on_ember).cpu(), torch.sparse.sum(cpu))
    dense = torch.randn(3, 4)
    assert torch.equal(
        torch.sparse.mm(on_ember, dense.to(DEVICE)).cpu(), torch.sparse.mm(cpu, dense)
    )
    back = on_ember.cpu()
    assert back.layout == torch.sparse_coo and torch.equal(back.to_dense(), cpu.to_dense())


def test_inplace_op_on_a_sparse_tensor_updates_it():
    cpu = _coo()
    on_ember = cpu.to(DEVICE)
    returned = on_ember.add_(cpu.to(DEVICE))
    assert returned is on_ember
    assert torch.equal(on_ember.to_dense().cpu(), (cpu + cpu).to_dense())
    assert on_ember._values().device.type == DEVICE


def test_to_sparse_of_an_ember_tensor_and_memory_is_embers():
    x = _dense()
    on_ember = x.to(DEVICE)
    before = torch.ember.memory_allocated()
    sparse = on_ember.to_sparse()
    assert torch.ember.memory_allocated() > before  # indices and values
    assert sparse.device.type == DEVICE and sparse._nnz() == int((x != 0).sum())
    assert torch.equal(sparse.to_dense().cpu(), x)


@pytest.mark.parametrize("layout", ["csr", "csc", "bsr"])
def test_compressed_layouts_match_cpu(layout):
    x = _dense()
    convert = {
        "csr": lambda t: t.to_sparse_csr(),
        "csc": lambda t: t.to_sparse_csc(),
        "bsr": lambda t: t.to_sparse_bsr((2, 2)),
    }[layout]
    cpu = convert(x)
    on_ember = convert(x.to(DEVICE))
    assert on_ember.layout == cpu.layout and on_ember.device.type == DEVICE
    assert on_ember.values().device.type == DEVICE
    assert torch.equal(on_ember.values().cpu(), cpu.values())
    assert torch.equal(on_ember.to_dense().cpu(), x)
    assert on_ember.cpu().layout == cpu.layout


def test_csr_products_match_cpu():
    x = _dense()
    cpu = x.to_sparse_csr()
    on_ember = x.to(DEVICE).to_sparse_csr()
    assert torch.equal(on_ember.crow_indices().cpu(), cpu.crow_indices())
    assert torch.equal(on_ember.col_indices().cpu(), cpu.col_indices())
    w = torch.randn(6, 3)
    assert torch.equal((on_ember @ w.to(DEVICE)).cpu(), cpu @ w)
    a, b = torch.randn(4, 5), torch.randn(5, 6)
    expected = torch.sparse.sampled_addmm(cpu, a, b, beta=0.5, alpha=2.0)
    result = torch.sparse.sampled_addmm(on_ember, a.to(DEVICE), b.to(DEVICE), beta=0.5, alpha=2.0)
    assert torch.equal(result.to_dense().cpu(), expected.to_dense())


def test_gradients_through_sparse_ops_match_cpu():
    x = _dense()
    w = torch.randn(6, 3)
    grads = []
    for device in ("cpu", DEVICE):
        leaf = x.detach().to(device).requires_grad_()
        weight = w.detach().to(device).requires_grad_()
        out = torch.sparse.mm(leaf.to_sparse(), weight)
        out.square().sum().backward()
        grads.append((leaf.grad.cpu(), weight.grad.cpu()))
    for ours, cpus in zip(grads[1], grads[0]):
        # The dense GEMMs of backward take ember's kernels: within rounding.
        torch.testing.assert_close(ours, cpus)


def test_sparse_mm_reduce_backward_sees_that_inputs_require_grad():
    """CPU's kernel keeps the argmax for backward only when an input
    requires grad: the aliases ember hands it must say so."""
    a = _dense((5, 5), seed=1).to_sparse_csr()
    b = torch.randn(5, 3)
    grads = []
    for device in ("cpu", DEVICE):
        sparse = a.detach().to(device).requires_grad_()
        dense = b.detach().to(device).requires_grad_()
        out = torch.sparse.mm(sparse, dense, "amax")
        grad = torch.autograd.grad(out, (sparse, dense), torch.ones_like(out))
        grads.append((grad[0].to_dense().cpu(), grad[1].cpu()))
    for ours, cpus in zip(grads[1], grads[0]):
        assert torch.equal(ours, cpus)


def test_mixing_host_sparse_and_ember_dense_raises_like_cuda():
    on_ember = torch.randn(3, 4, device=DEVICE)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.sparse.mm(_coo(), on_ember)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.equal(on_ember.cpu(), on_ember.cpu())  # the data is intact


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_save_and_load_keep_layout_and_device(tmp_path, layout):
    x = _dense().to(DEVICE)
    sparse = x.to_sparse() if layout == "coo" else x.to_sparse_csr()
    torch.save(sparse, tmp_path / "sparse.pt")
    loaded = torch.load(tmp_path / "sparse.pt")
    assert loaded.device == sparse.device and loaded.layout == sparse.layout
    assert torch.equal(loaded.to_dense().cpu(), x.cpu())


def test_copy_between_host_and_ember_sparse_tensors_as_cuda_copies():
    """copy_ between a host sparse tensor and an ember one copies across
    devices (as CUDA does): the destination keeps its device, takes the
    source's shape, components and dtype conversion; CPU's errors stay."""
    src = _coo()
    dst = torch.sparse_coo_tensor(torch.tensor([[0], [0]]), torch.tensor([9.0]), (2, 3))
    dst = dst.to(DEVICE).double()
    dst.copy_(src)
    assert dst.device.type == DEVICE and dst._values().device.type == DEVICE
    assert dst.dtype == torch.float64 and dst._nnz() == src._nnz()
    assert torch.equal(dst.to_dense().cpu(), src.to_dense().double())
    back = torch.sparse_coo_tensor(torch.zeros(2, 0, dtype=torch.long), torch.zeros(0), (2, 3))
    back.copy_(dst)
    assert back.device.type == "cpu" and torch.equal(back.to_dense(), src.to_dense())
    csr_src = _dense().to_sparse_csr()
    csr = (csr_src * 2).to(DEVICE)
    csr.copy_(csr_src)
    assert torch.equal(csr.to_dense().cpu(), csr_src.to_dense())
    empty = torch.zeros(4, 6).to_sparse_csr()
    with pytest.raises(RuntimeError) as cpu_error:
        empty.copy_(csr_src)
    with pytest.raises(RuntimeError) as ember_error:
        empty.to(DEVICE).copy_(csr_src)
    assert str(ember_error.value) == str(cpu_error.value)
