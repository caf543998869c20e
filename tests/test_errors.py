"""Errors: invalid device indices, mixing devices.

Each error is the exception type CUDA raises, names what went wrong, and
leaves the tensors involved unchanged."""

import pytest
import torch

NUM_DEVICES = torch.ember.device_count()


def _snapshot(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.detach().cpu().clone() for t in tensors]


def _assert_unchanged(tensors, snapshots) -> None:
    for tensor, snapshot in zip(tensors, snapshots, strict=True):
        assert torch.equal(tensor.cpu(), snapshot)


# ---------------------------------------------------------------------------
# Invalid device indices


def test_empty_on_invalid_device_index():
    with pytest.raises(RuntimeError, match="7"):
        torch.empty(2, device="ember:7")


def test_copy_to_invalid_device_index():
    cpu = torch.arange(3.0)
    with pytest.raises(RuntimeError, match="7"):
        cpu.to("ember:7")
    assert torch.equal(cpu, torch.arange(3.0))


def test_set_device_invalid_index():
    with pytest.raises(RuntimeError, match="7"):
        torch.ember.set_device(7)
    assert torch.ember.current_device() == 0
    with pytest.raises(RuntimeError, match="7"):
        torch.accelerator.set_device_index(7)
    assert torch.ember.current_device() == 0


def test_device_context_invalid_index():
    with pytest.raises(RuntimeError, match="7"), torch.ember.device(7):
        pass
    assert torch.ember.current_device() == 0


@pytest.mark.parametrize(
    "call",
    [
        lambda: torch.ember.get_device_properties(7),
        lambda: torch.ember.synchronize(7),
        lambda: torch.ember.memory_allocated(7),
        lambda: torch.ember.Stream(device=7),
        lambda: torch.Generator(device="ember:7"),
    ],
    ids=["properties", "synchronize", "memory_allocated", "stream", "generator"],
)
def test_device_module_invalid_index(call):
    with pytest.raises(RuntimeError, match="7"):
        call()


# ---------------------------------------------------------------------------
# Mixing devices


def test_ember_plus_cpu_tensor_raises():
    a = torch.arange(3.0, device="ember")
    b = torch.ones(3)
    snapshots = _snapshot(a, b)
    for call in (lambda: a + b, lambda: b + a, lambda: torch.mm(a.view(1, 3), b.view(3, 1))):
        with pytest.raises(
            RuntimeError, match="Expected all tensors to be on the same device"
        ) as info:
            call()
        assert "ember:0" in str(info.value)
        assert "cpu" in str(info.value)
    _assert_unchanged([a, b], snapshots)


def test_in_place_with_cpu_tensor_leaves_data_unchanged():
    a = torch.arange(3.0, device="ember")
    b = torch.ones(3)
    snapshots = _snapshot(a, b)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a.add_(b)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a.mul_(b)
    _assert_unchanged([a, b], snapshots)


def test_cpu_out_argument_raises():
    a = torch.arange(3.0, device="ember")
    out = torch.full((3,), -5.0)
    with pytest.raises(RuntimeError):
        torch.add(a, a, out=out)
    assert torch.equal(out, torch.full((3,), -5.0))
    scalar_out = torch.tensor(-5.0)
    with pytest.raises(RuntimeError):
        torch.sum(a, dim=0, out=scalar_out)
    assert torch.equal(scalar_out, torch.tensor(-5.0))
    assert torch.equal(a.cpu(), torch.arange(3.0))


def test_zero_dim_cpu_tensor_is_allowed():
    a = torch.arange(3.0, device="ember")
    scalar = torch.tensor(2.0)
    left = a + scalar
    right = scalar * a
    assert left.device == torch.device("ember", 0)
    assert right.device == torch.device("ember", 0)
    assert torch.equal(left.cpu(), torch.arange(3.0) + 2)
    assert torch.equal(right.cpu(), torch.arange(3.0) * 2)
    a.mul_(torch.tensor(3.0))
    assert torch.equal(a.cpu(), torch.arange(3.0) * 3)
    chosen = torch.where(a > 1, a, torch.tensor(-1.0))
    assert torch.equal(chosen.cpu(), torch.tensor([-1.0, 3.0, 6.0]))
    assert torch.equal(scalar, torch.tensor(2.0))


def test_cpu_index_tensor_is_allowed():
    x = torch.arange(12.0).view(4, 3)
    on_ember = x.to("ember")
    index = torch.tensor([3, 0])
    picked = on_ember[index]
    assert picked.device == torch.device("ember", 0)
    assert torch.equal(picked.cpu(), x[index])
    on_ember[index] = torch.tensor(-1.0)
    expected = x.clone()
    expected[index] = -1.0
    assert torch.equal(on_ember.cpu(), expected)


@pytest.mark.requires_two_devices
def test_mixing_two_ember_devices_raises():
    a = torch.arange(3.0, device="ember:0")
    b = torch.ones(3, device="ember:1")
    snapshots = _snapshot(a, b)
    for call in (lambda: a + b, lambda: b + a, lambda: a.add_(b), lambda: torch.cat([a, b])):
        with pytest.raises(
            RuntimeError, match="Expected all tensors to be on the same device"
        ) as info:
            call()
        assert "ember:0" in str(info.value)
        assert "ember:1" in str(info.value)
    _assert_unchanged([a, b], snapshots)
    assert a.device.index == 0 and b.device.index == 1


@pytest.mark.requires_two_devices
def test_out_argument_on_other_ember_device_raises():
    a = torch.ones(3, device="ember:0")
    out = torch.full((3,), -1.0, device="ember:1")
    with pytest.raises(RuntimeError, match="ember:1"):
        torch.add(a, a, out=out)
    assert torch.equal(out.cpu(), torch.full((3,), -1.0))
    assert out.device == torch.device("ember", 1)


@pytest.mark.requires_two_devices
def test_zero_dim_ember_tensor_on_other_device_raises():
    # CUDA allows only *CPU* scalars beside device tensors.
    a = torch.arange(3.0, device="ember:0")
    scalar = torch.tensor(2.0, device="ember:1")
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        a + scalar
    assert torch.equal(a.cpu(), torch.arange(3.0))


# ---------------------------------------------------------------------------
# Invalid EMBER_DEVICES no longer fails the import: tests/test_settings.py
# checks that it is raised at the first use of ember instead.
