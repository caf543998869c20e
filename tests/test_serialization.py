"""torch.save / torch.load of ember tensors and modules, with map_location."""

import io

import pytest
import torch

DTYPES = [
    torch.float32,
    torch.float64,
    torch.bfloat16,
    torch.float16,
    torch.int8,
    torch.uint8,
    torch.int32,
    torch.int64,
    torch.bool,
    torch.complex64,
]


def _round_trip(obj, **load_kwargs):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, **load_kwargs)


def _sample(dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(3)
    if dtype == torch.bool:
        return torch.randint(0, 2, (5, 7), generator=generator).bool()
    if dtype.is_complex:
        return torch.randn(5, 7, dtype=dtype, generator=generator)
    if dtype.is_floating_point:
        return (torch.randn(5, 7, generator=generator) * 30).to(dtype)
    return torch.randint(0, 100, (5, 7), generator=generator).to(dtype)


@pytest.mark.parametrize("weights_only", [True, False])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_is_bit_exact(dtype, weights_only):
    cpu = _sample(dtype)
    loaded = _round_trip(cpu.to("ember"), weights_only=weights_only)
    assert loaded.device == torch.device("ember", 0)
    assert loaded.dtype == dtype
    assert torch.equal(loaded.cpu(), cpu)


def test_round_trip_preserves_nan_bits():
    values = torch.tensor([float("nan"), -0.0, float("inf"), 1e-45])
    loaded = _round_trip(values.to("ember"))
    assert torch.equal(loaded.cpu().view(torch.int32), values.view(torch.int32))


def test_views_keep_sharing_storage():
    base = torch.arange(24.0).view(4, 6).to("ember")
    views = {"base": base, "t": base.t(), "slice": base[1:, ::2]}
    loaded = _round_trip(views, weights_only=True)
    for name, view in views.items():
        assert loaded[name].device == torch.device("ember", 0), name
        assert loaded[name].shape == view.shape, name
        assert loaded[name].stride() == view.stride(), name
        assert loaded[name].storage_offset() == view.storage_offset(), name
        assert torch.equal(loaded[name].cpu(), view.cpu()), name
    pointer = loaded["base"].untyped_storage().data_ptr()
    assert loaded["t"].untyped_storage().data_ptr() == pointer
    assert loaded["slice"].untyped_storage().data_ptr() == pointer
    # Shared for real: writing through one view shows in the others.
    loaded["base"][1, 0] = -7.0
    assert loaded["t"][0, 1].item() == -7.0
    assert loaded["slice"][0, 0].item() == -7.0


def _module() -> torch.nn.Module:
    torch.default_generator.manual_seed(0)  # parameters are initialised on the CPU
    return torch.nn.Sequential(
        torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.ReLU(), torch.nn.Linear(4, 2)
    )


def test_module_state_dict_round_trip():
    module = _module().to("ember")
    module.train()
    module(torch.randn(8, 3, device="ember"))  # updates BatchNorm buffers
    state = _round_trip(module.state_dict(), weights_only=True)
    for name, tensor in module.state_dict().items():
        assert state[name].device == torch.device("ember", 0), name
        assert torch.equal(state[name].cpu(), tensor.cpu()), name
    restored = _module().to("ember")
    restored.load_state_dict(state)
    module.eval()
    restored.eval()
    x = torch.randn(5, 3, device="ember")
    assert torch.equal(restored(x).cpu(), module(x).cpu())


@pytest.mark.parametrize(
    "map_location,expected",
    [
        ("cpu", torch.device("cpu")),
        ("ember", torch.device("ember", 0)),
        ("ember:0", torch.device("ember", 0)),
        (torch.device("cpu"), torch.device("cpu")),
        (torch.device("ember", 0), torch.device("ember", 0)),
        (torch.device("ember"), torch.device("ember", 0)),
    ],
    ids=str,
)
def test_map_location_of_ember_tensor(map_location, expected):
    cpu = _sample(torch.float32)
    loaded = _round_trip(cpu.to("ember"), map_location=map_location, weights_only=True)
    assert loaded.device == expected
    assert torch.equal(loaded.cpu(), cpu)


@pytest.mark.parametrize("map_location", ["ember", "ember:0", torch.device("ember", 0)], ids=str)
def test_cpu_saved_tensor_loaded_onto_ember(map_location):
    cpu = _sample(torch.int64)
    loaded = _round_trip(cpu, map_location=map_location, weights_only=True)
    assert loaded.device == torch.device("ember", 0)
    assert torch.equal(loaded.cpu(), cpu)


def test_state_dict_saved_on_cpu_loads_onto_ember():
    module = _module()
    state = _round_trip(module.state_dict(), map_location="ember", weights_only=True)
    assert all(t.device == torch.device("ember", 0) for t in state.values())
    restored = _module().to("ember")
    restored.load_state_dict(state)
    for name, tensor in module.state_dict().items():
        assert torch.equal(restored.state_dict()[name].cpu(), tensor), name


@pytest.mark.requires_two_devices
@pytest.mark.parametrize(
    "map_location", ["ember:1", torch.device("ember", 1), {"ember:0": "ember:1"}], ids=str
)
def test_map_location_to_second_device(map_location):
    cpu = _sample(torch.float64)
    loaded = _round_trip(cpu.to("ember:0"), map_location=map_location, weights_only=True)
    assert loaded.device == torch.device("ember", 1)
    assert torch.equal(loaded.cpu(), cpu)


@pytest.mark.requires_two_devices
def test_second_device_round_trip_and_map_back():
    cpu = _sample(torch.bfloat16)
    saved = cpu.to("ember:1")
    assert _round_trip(saved).device == torch.device("ember", 1)
    loaded = _round_trip(saved, map_location="ember:0")
    assert loaded.device == torch.device("ember", 0)
    assert torch.equal(loaded.cpu(), cpu)


def test_file_round_trip(tmp_path):
    path = tmp_path / "tensors.pt"
    payload = {"x": torch.arange(10, device="ember"), "y": torch.ones(2, 2, device="ember")}
    torch.save(payload, path)
    loaded = torch.load(path, weights_only=True)
    assert loaded.keys() == payload.keys()
    for key, tensor in payload.items():
        assert loaded[key].device == tensor.device
        assert torch.equal(loaded[key].cpu(), tensor.cpu())
