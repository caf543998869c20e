"""Autograd and training on ember: gradients and optimizer steps equal CPU's.

Under ``cpu_parity`` the kernels are PyTorch's CPU kernels run on the same
bytes, so gradients, double-backward results and whole training steps
(forward, loss, backward, optimizer) must be ``torch.equal`` to the CPU run.
With ember's default kernels (its own GEMMs) they agree within tolerance.
"""

import os

import pytest
import torch
import torch.nn.functional as F
from tiny_models import bert_config

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models are built from configs

DEVICE = "ember"


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------- op gradients


def _run_backward(fn, inputs: list[torch.Tensor], device: str):
    """Output and the gradient of every floating-point input, on ``device``."""
    leaves = [t.detach().to(device).requires_grad_(t.is_floating_point()) for t in inputs]
    out = fn(*leaves)
    grad_out = _randn(*out.shape, seed=99).to(device)
    out.backward(grad_out)
    grads = [t.grad for t in leaves if t.requires_grad]
    assert all(g is not None and g.device.type == device for g in grads)
    return out.detach().cpu(), [g.cpu() for g in grads]


def _index(*values) -> torch.Tensor:
    return torch.tensor(values)


OPS = {
    "matmul": (torch.matmul, [_randn(3, 5, 7, seed=1), _randn(7, 4, seed=2)]),
    "linear": (F.linear, [_randn(6, 8, seed=1), _randn(5, 8, seed=2), _randn(5, seed=3)]),
    "conv2d": (
        lambda x, w, b: F.conv2d(x, w, b, padding=1),
        [_randn(2, 3, 8, 8, seed=1), _randn(4, 3, 3, 3, seed=2), _randn(4, seed=3)],
    ),
    "layer_norm": (
        lambda x, w, b: F.layer_norm(x, (16,), w, b),
        [_randn(4, 16, seed=1), _randn(16, seed=2), _randn(16, seed=3)],
    ),
    "softmax": (lambda x: F.softmax(x, dim=-1), [_randn(4, 16, seed=1)]),
    "log_softmax": (lambda x: F.log_softmax(x, dim=-1), [_randn(4, 16, seed=1)]),
    "gelu": (F.gelu, [_randn(4, 16, seed=1)]),
    "embedding": (
        lambda w, i: F.embedding(i, w),
        [_randn(10, 8, seed=1), _index([1, 2, 2], [9, 0, 1])],
    ),
    "embedding_padding_idx": (
        lambda w, i: F.embedding(i, w, padding_idx=2),
        [_randn(10, 8, seed=1), _index([1, 2, 2], [9, 0, 1])],
    ),
    "index": (lambda x, i: x[i], [_randn(6, 5, seed=1), _index(0, 3, 3, 5)]),
    "index_put": (
        lambda x, v, i: x.index_put((i,), v, accumulate=True),
        [_randn(6, 5, seed=1), _randn(4, 5, seed=2), _index(0, 3, 3, 5)],
    ),
    "gather": (
        lambda x, i: torch.gather(x, 1, i),
        [_randn(4, 6, seed=1), _index([0, 1], [2, 2], [5, 0], [1, 1])],
    ),
    "scatter": (
        lambda x, s, i: x.scatter(1, i, s),
        [_randn(4, 6, seed=1), _randn(4, 2, seed=2), _index([0, 1], [2, 3], [5, 0], [1, 4])],
    ),
    "scatter_add": (
        lambda x, s, i: x.scatter_add(1, i, s),
        [_randn(4, 6, seed=1), _randn(4, 2, seed=2), _index([0, 1], [2, 2], [5, 0], [1, 1])],
    ),
    "index_add": (
        lambda x, s, i: x.index_add(0, i, s),
        [_randn(4, 6, seed=1), _randn(3, 6, seed=2), _index(0, 2, 2)],
    ),
    "cross_entropy": (
        lambda x, t: F.cross_entropy(x, t),
        [_randn(4, 6, seed=1), _index(0, 2, 5, 1)],
    ),
}


@pytest.mark.cpu_parity
@pytest.mark.parametrize("name", list(OPS))
def test_op_gradients_bitwise(name):
    fn, inputs = OPS[name]
    cpu_out, cpu_grads = _run_backward(fn, inputs, "cpu")
    ember_out, ember_grads = _run_backward(fn, inputs, DEVICE)
    assert torch.equal(cpu_out, ember_out)
    assert len(cpu_grads) == len(ember_grads) > 0
    for i, (a, b) in enumerate(zip(cpu_grads, ember_grads, strict=True)):
        assert torch.equal(a, b), f"gradient of input {i} differs"


@pytest.mark.parametrize("name", ["matmul", "linear"])
def test_op_gradients_close_with_default_kernels(name):
    fn, inputs = OPS[name]
    cpu_out, cpu_grads = _run_backward(fn, inputs, "cpu")
    ember_out, ember_grads = _run_backward(fn, inputs, DEVICE)
    torch.testing.assert_close(ember_out, cpu_out)
    for a, b in zip(cpu_grads, ember_grads, strict=True):
        torch.testing.assert_close(b, a)


def test_index_with_host_index_tensor_gradient():
    """CUDA-style indexing with a CPU index tensor: same gradient as CPU."""
    x_cpu = _randn(6, 5, seed=1).requires_grad_()
    x_ember = x_cpu.detach().to(DEVICE).requires_grad_()
    index = _index(4, 0, 4)
    x_cpu[index].sum().backward()
    x_ember[index].sum().backward()
    assert torch.equal(x_cpu.grad, x_ember.grad.cpu())


def _double_backward(fn, device: str):
    x = _randn(3, 4, seed=1).to(device).requires_grad_()
    w = _randn(4, 4, seed=2).to(device).requires_grad_()
    gx, gw = torch.autograd.grad(fn(x, w), (x, w), create_graph=True)
    assert gx.requires_grad and gw.requires_grad
    penalty = (gx**2).sum() + (gw * w).sum()
    hx, hw = torch.autograd.grad(penalty, (x, w))
    return [t.detach().cpu() for t in (gx, gw, hx, hw)]


def _shared_matmul(x, w):
    z = x @ w
    return (torch.tanh(z) ** 2 + F.softplus(z)).sum()


def _two_matmuls(x, w):
    return (torch.tanh(x @ w) + torch.tanh(x @ w)).sum()


@pytest.mark.cpu_parity
def test_double_backward_create_graph():
    cpu = _double_backward(_shared_matmul, "cpu")
    ember = _double_backward(_shared_matmul, DEVICE)
    for i, (a, b) in enumerate(zip(cpu, ember, strict=True)):
        assert torch.equal(a, b), f"result {i} differs"


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="autograd sequence numbers are thread-local: the create_graph backward runs on "
    "the ember device thread (pt_autograd_0), so the nodes it records are numbered apart "
    "from the forward's; the second backward then runs them in another order than on CPU "
    "and sums the three gradient contributions of x in another order",
)
def test_double_backward_multi_path_accumulation():
    cpu = _double_backward(_two_matmuls, "cpu")
    ember = _double_backward(_two_matmuls, DEVICE)
    assert torch.equal(cpu[0], ember[0]) and torch.equal(cpu[1], ember[1])  # first order
    for i, (a, b) in enumerate(zip(cpu, ember, strict=True)):
        assert torch.equal(a, b), f"result {i} differs"


def test_double_backward_is_deterministic_on_ember():
    first = _double_backward(_two_matmuls, DEVICE)
    second = _double_backward(_two_matmuls, DEVICE)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


def test_gelu_backward_through_sum():
    """sum's backward hands gelu_backward an expanded (stride 0) gradient, which CPU's
    kernel runs through oneDNN with a scratch buffer from CPUAllocator::raw_allocate."""
    grads = []
    for device in ("cpu", DEVICE):
        x = _randn(3, 4, seed=1).to(device).requires_grad_()
        F.gelu(x).sum().backward()
        grads.append(x.grad.cpu())
    assert torch.equal(grads[0], grads[1])


def test_layer_norm_double_backward():
    def run(device):
        x = _randn(2, 8, seed=1).to(device).requires_grad_()
        (g,) = torch.autograd.grad(F.layer_norm(x, (8,)).pow(3).sum(), x, create_graph=True)
        (h,) = torch.autograd.grad(g.sum(), x)
        return g.detach().cpu(), h.cpu()

    for a, b in zip(run("cpu"), run(DEVICE), strict=True):
        assert torch.equal(a, b)


# --------------------------------------------------------------------------- training steps


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32),
        torch.nn.GELU(),
        torch.nn.LayerNorm(32),
        torch.nn.Linear(32, 4),
    )


def _bert() -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    config = bert_config(
        transformers,
        num_labels=3,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    return transformers.BertForSequenceClassification(config)


def _mlp_batch() -> dict[str, torch.Tensor]:
    return {"x": _randn(8, 16, seed=1), "labels": _index(0, 3, 1, 2, 2, 0, 1, 3)}


def _bert_batch() -> dict[str, torch.Tensor]:
    input_ids = torch.randint(0, 1000, (2, 12), generator=torch.Generator().manual_seed(1))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 9:] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": _index(0, 2)}


MODELS = {"mlp": (_mlp, _mlp_batch), "bert": (_bert, _bert_batch)}

OPTIMIZERS = {
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "sgd_momentum_nesterov_wd": lambda p: torch.optim.SGD(
        p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-2
    ),
    # foreach=None: each device's default (for-loop on CPU, foreach on ember)
    "adamw_default": lambda p: torch.optim.AdamW(p, lr=1e-2),
    "adamw_foreach_false": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=False),
    "adamw_foreach_true": lambda p: torch.optim.AdamW(p, lr=1e-2, foreach=True),
    "adamw_fused": lambda p: torch.optim.AdamW(p, lr=1e-2, fused=True),
}


def _train(model_name: str, optimizer_name: str, device: str, steps: int = 2):
    make_model, make_batch = MODELS[model_name]
    model = make_model().to(device).train()
    optimizer = OPTIMIZERS[optimizer_name](model.parameters())
    batch = {k: v.to(device) for k, v in make_batch().items()}
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        if model_name == "mlp":
            loss = F.cross_entropy(model(batch["x"]), batch["labels"])
        else:
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.detach().cpu())
    params = {name: p.detach().cpu() for name, p in model.named_parameters()}
    state = [
        t.cpu() for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)
    ]
    return losses, params, state


@pytest.mark.cpu_parity
@pytest.mark.parametrize("optimizer_name", list(OPTIMIZERS))
@pytest.mark.parametrize("model_name", list(MODELS))
def test_training_steps_bitwise(model_name, optimizer_name):
    cpu_losses, cpu_params, cpu_state = _train(model_name, optimizer_name, "cpu")
    ember_losses, ember_params, ember_state = _train(model_name, optimizer_name, DEVICE)
    for step, (a, b) in enumerate(zip(cpu_losses, ember_losses, strict=True)):
        assert torch.equal(a, b), f"loss of step {step} differs"
    assert cpu_params.keys() == ember_params.keys()
    for name, p in cpu_params.items():
        assert torch.equal(p, ember_params[name]), f"parameter {name} differs"
    assert len(cpu_state) == len(ember_state)
    for a, b in zip(cpu_state, ember_state, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("optimizer_name", ["sgd_momentum", "adamw_default"])
@pytest.mark.parametrize("model_name", list(MODELS))
def test_training_steps_close_with_default_kernels(model_name, optimizer_name):
    cpu_losses, cpu_params, _ = _train(model_name, optimizer_name, "cpu")
    ember_losses, ember_params, _ = _train(model_name, optimizer_name, DEVICE)
    for a, b in zip(cpu_losses, ember_losses, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    for name, p in cpu_params.items():
        # Adam's step is ~lr * sign(grad) where a gradient is ~0: allow lr/10
        torch.testing.assert_close(ember_params[name], p, rtol=1e-4, atol=1e-4, msg=name)


def test_parameters_actually_change():
    """Guards the training test against a no-op step."""
    _, before, _ = _train("mlp", "adamw_default", DEVICE, steps=0)
    _, after, _ = _train("mlp", "adamw_default", DEVICE, steps=2)
    assert any(not torch.equal(before[n], after[n]) for n in before)


def test_torch_manual_seed_makes_ember_dropout_reproducible():
    def masks():
        torch.manual_seed(123)
        return F.dropout(torch.ones(64, device=DEVICE), p=0.5, training=True).cpu()

    assert torch.equal(masks(), masks())


def test_script_ending_right_after_an_ember_backward_exits_cleanly():
    """The autograd device thread must not be left releasing Python-owned tensors
    while the interpreter finalizes (it used to abort: 'terminate called without an
    active exception', exit 134, most runs on an idle machine)."""
    import subprocess
    import sys

    code = (
        "import torch\n"
        "x = torch.randn(3, 4, device='ember', requires_grad=True)\n"
        "torch.tanh(x).sum().backward()\n"
    )
    for _ in range(5):
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, result.stderr[-1000:]


@pytest.mark.parametrize("name", ["LSTM", "GRU", "LSTMCell", "GRUCell"])
def test_recurrent_modules_match_cpu_to_rounding(name):
    """ATen sends PrivateUse1 to the fused-cell kernels (CUDA-only in ATen); ember's
    own fused cells add the biases separately, so equality is to rounding."""
    import copy

    torch.manual_seed(0)
    cell = name.endswith("Cell")
    module = getattr(torch.nn, name)(5, 7) if cell else getattr(torch.nn, name)(5, 7, 2)
    x = torch.randn((3, 5) if cell else (4, 3, 5))
    on_ember = copy.deepcopy(module).to(DEVICE)
    x_cpu, x_ember = x.clone().requires_grad_(), x.to(DEVICE).requires_grad_()
    out_cpu, out_ember = module(x_cpu), on_ember(x_ember)
    out_cpu = out_cpu[0] if isinstance(out_cpu, tuple) else out_cpu
    out_ember = out_ember[0] if isinstance(out_ember, tuple) else out_ember
    torch.testing.assert_close(out_ember.cpu(), out_cpu, rtol=1e-5, atol=1e-6)
    out_cpu.pow(2).sum().backward()
    out_ember.pow(2).sum().backward()
    torch.testing.assert_close(x_ember.grad.cpu(), x_cpu.grad, rtol=1e-5, atol=1e-6)
    for p_cpu, p_ember in zip(module.parameters(), on_ember.parameters(), strict=True):
        torch.testing.assert_close(p_ember.grad.cpu(), p_cpu.grad, rtol=1e-5, atol=1e-6)
