"""einsum on ember follows ``torch.backends.opt_einsum``: the contraction
order (seen as the bmm calls that run on ember tensors) is opt_einsum's path
for the chosen strategy, left to right when disabled, and every order gives
CPU's result bitwise."""

import opt_einsum
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

# A 4-operand chain whose greedy and optimal paths differ (a-e sizes below).
EQUATION = "ab,bc,cd,de->ae"
SIZES = {"a": 64, "b": 8, "c": 64, "d": 8, "e": 2}
SHAPES = [(SIZES[term[0]], SIZES[term[1]]) for term in EQUATION.split("->")[0].split(",")]
# Left to right as an opt_einsum path (each contraction's result joins the end of the list).
LEFT_TO_RIGHT = [(0, 1), (0, 2), (0, 1)]


class _RecordMatmuls(TorchDispatchMode):
    """Records (op, shape of a, shape of b, device type) of every bmm/mm."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple, tuple, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.bmm, torch.ops.aten.mm):
            a, b = args[0], args[1]
            self.calls.append(
                (func.overloadpacket.__name__, tuple(a.shape), tuple(b.shape), a.device.type)
            )
        return func(*args, **(kwargs or {}))

    def flops(self) -> int:
        """Multiply-adds counted as opt_einsum counts them (2 per inner product term)."""
        total = 0
        for _, a, b, _ in self.calls:
            batch = a[0] if len(a) == 3 else 1
            total += 2 * batch * a[-2] * a[-1] * b[-1]
        return total


@pytest.fixture(autouse=True)
def _restore_opt_einsum():
    backend = torch.backends.opt_einsum
    enabled, strategy = backend.enabled, backend.strategy
    yield
    backend.enabled = enabled
    backend.strategy = strategy


def _operands(device: str) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=generator).to(device) for shape in SHAPES]


def _einsum(device: str) -> tuple[torch.Tensor, _RecordMatmuls]:
    operands = _operands(device)
    with _RecordMatmuls() as record:
        result = torch.einsum(EQUATION, *operands)
    return result.cpu(), record


def _path_cost(optimize) -> int:
    return opt_einsum.contract_path(EQUATION, *SHAPES, shapes=True, optimize=optimize)[1].opt_cost


def test_opt_einsum_is_installed_and_on():
    assert torch.backends.opt_einsum.is_available()
    assert torch.backends.opt_einsum.enabled
    assert opt_einsum.__version__ == "3.4.0"  # requirements-dev.txt pin


def test_the_chain_has_different_greedy_and_optimal_paths():
    assert _path_cost("optimal") < _path_cost("greedy") < _path_cost(LEFT_TO_RIGHT)


@pytest.mark.parametrize("strategy", ["greedy", "optimal", "auto"])
def test_contraction_order_follows_the_strategy(strategy):
    torch.backends.opt_einsum.strategy = strategy
    _, record = _einsum("ember")
    assert len(record.calls) == 3
    assert all(device == "ember" for *_, device in record.calls)
    # "auto" is opt_einsum's optimal search for up to four operands.
    assert record.flops() == _path_cost(strategy)


def test_strategies_run_different_contractions():
    orders = {}
    for strategy in ("greedy", "optimal"):
        torch.backends.opt_einsum.strategy = strategy
        orders[strategy] = _einsum("ember")[1]
    torch.backends.opt_einsum.enabled = False
    orders["disabled"] = _einsum("ember")[1]
    calls = {name: tuple(record.calls) for name, record in orders.items()}
    assert len(set(calls.values())) == 3
    flops = {name: record.flops() for name, record in orders.items()}
    assert flops["optimal"] < flops["greedy"] < flops["disabled"]


def test_disabled_contracts_left_to_right():
    torch.backends.opt_einsum.enabled = False
    _, record = _einsum("ember")
    assert record.flops() == _path_cost(LEFT_TO_RIGHT)


@pytest.mark.cpu_parity
@pytest.mark.parametrize("strategy", ["greedy", "optimal", "auto", "disabled"])
def test_ember_equals_cpu_bitwise(strategy):
    if strategy == "disabled":
        torch.backends.opt_einsum.enabled = False
    else:
        torch.backends.opt_einsum.strategy = strategy
    ember, ember_record = _einsum("ember")
    cpu, cpu_record = _einsum("cpu")
    assert [c[:3] for c in ember_record.calls] == [c[:3] for c in cpu_record.calls]
    assert torch.equal(ember, cpu)


def test_every_order_gives_the_same_product_to_rounding():
    reference = torch.linalg.multi_dot([t.double() for t in _operands("cpu")])
    for strategy in ("greedy", "optimal"):
        torch.backends.opt_einsum.strategy = strategy
        torch.testing.assert_close(_einsum("ember")[0].double(), reference, rtol=1e-4, atol=1e-4)


@pytest.mark.cpu_parity
@pytest.mark.requires_two_devices
def test_einsum_on_the_second_device():
    torch.backends.opt_einsum.strategy = "optimal"
    operands = [t.to("ember:1") for t in _operands("cpu")]
    result = torch.einsum(EQUATION, *operands)
    assert result.device == torch.device("ember:1")
    assert torch.equal(result.cpu(), _einsum("cpu")[0])
