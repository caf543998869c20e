"""The ember device: backend naming, generated methods, autoload, the device
module (torch.ember) and torch.accelerator, and copies between devices."""

import os
import threading
import warnings

import pytest
import torch
from torch.nn.utils.rnn import pack_sequence

NUM_DEVICES = torch.ember.device_count()

# ---------------------------------------------------------------------------
# Naming and generated methods


def test_privateuse1_backend_is_renamed_to_ember():
    assert torch._C._get_privateuse1_backend_name() == "ember"


def test_device_strings_parse():
    device = torch.device("ember:0")
    assert device.type == "ember"
    assert device.index == 0
    assert torch.device("ember").index is None
    assert torch.device("ember", 0) == device
    assert torch.empty(1, device="ember").device == device


def test_tensor_ember_method_and_is_ember():
    cpu = torch.arange(6.0).reshape(2, 3)
    assert not cpu.is_ember
    moved = cpu.ember()
    assert moved.is_ember
    assert moved.device == torch.device("ember", 0)
    assert torch.equal(moved.cpu(), cpu)
    # Already on the device: no copy.
    assert moved.ember() is moved


@pytest.mark.requires_two_devices
@pytest.mark.parametrize("target", [1, "ember:1", torch.device("ember", 1)])
def test_tensor_ember_method_with_device_argument(target):
    cpu = torch.arange(4)
    moved = cpu.ember(target)
    assert moved.device == torch.device("ember", 1)
    assert torch.equal(moved.cpu(), cpu)


def test_module_ember_moves_parameters_and_buffers():
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    expected = {name: t.clone() for name, t in module.state_dict().items()}
    assert module.ember() is module
    for name, tensor in module.state_dict().items():
        assert tensor.device == torch.device("ember", 0), name
        assert torch.equal(tensor.cpu(), expected[name]), name


@pytest.mark.requires_two_devices
def test_module_ember_with_device_index():
    module = torch.nn.Linear(2, 2).ember(1)
    assert module.weight.device == torch.device("ember", 1)
    assert module.bias.device == torch.device("ember", 1)


def test_untyped_storage_ember_and_is_ember():
    cpu_storage = torch.tensor([1, 2, 3, 250], dtype=torch.uint8).untyped_storage()
    assert not cpu_storage.is_ember
    storage = cpu_storage.ember()
    assert storage.is_ember
    assert storage.device == torch.device("ember", 0)
    assert list(storage.cpu()) == [1, 2, 3, 250]
    assert torch.ones(2, device="ember").untyped_storage().is_ember


def test_typed_storage_ember_and_is_ember():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # TypedStorage is deprecated
        cpu_storage = torch.TypedStorage([1.5, -2.0, 3.25], dtype=torch.float64)
        assert not cpu_storage.is_ember
        storage = cpu_storage.ember()
        assert storage.is_ember
        assert storage.dtype == torch.float64
        assert storage.device == torch.device("ember", 0)
        assert list(storage.cpu()) == [1.5, -2.0, 3.25]


def test_packed_sequence_ember():
    packed = pack_sequence([torch.arange(3.0), torch.arange(2.0)])
    moved = packed.ember()
    assert moved.is_ember
    assert moved.data.device == torch.device("ember", 0)
    assert torch.equal(moved.data.cpu(), packed.data)


# ---------------------------------------------------------------------------
# Autoload (fresh interpreters)


def test_import_torch_autoloads_ember(run_python):
    result = run_python(
        "import torch; print(torch.ember.is_available(), torch.ember.device_count())",
        env={"TORCH_DEVICE_BACKEND_AUTOLOAD": None, "EMBER_DEVICES": None},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "1"]


def test_autoload_disabled_leaves_ember_absent_until_imported(run_python):
    code = (
        "import torch\n"
        "print(hasattr(torch, 'ember'), torch._C._get_privateuse1_backend_name())\n"
        "import torch_ember\n"
        "print(hasattr(torch, 'ember'), torch._C._get_privateuse1_backend_name(),"
        " torch.ember.is_available(), torch.ones(2, device='ember').device)\n"
    )
    result = run_python(code, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.splitlines()
    assert first == "False privateuseone"
    assert second == "True ember True ember:0"


def test_ember_devices_env_sets_device_count(run_python):
    code = (
        "import torch\n"
        "print(torch.ember.device_count(), torch.accelerator.device_count(),"
        " torch.empty(1, device='ember:2').device)\n"
    )
    result = run_python(code, env={"EMBER_DEVICES": "3"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["3", "3", "ember:2"]


# ---------------------------------------------------------------------------
# torch.accelerator


def test_accelerator_is_ember():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator().type == "ember"
    assert torch.accelerator.device_count() == NUM_DEVICES
    assert torch.accelerator.current_device_index() == 0


def test_accelerator_synchronize_then_results_visible():
    x = torch.arange(10.0, device="ember")
    y = x * 2
    torch.accelerator.synchronize()
    torch.accelerator.synchronize(0)
    assert torch.equal(y.cpu(), torch.arange(10.0) * 2)


@pytest.mark.requires_two_devices
def test_accelerator_set_device_index():
    torch.accelerator.set_device_index(1)
    assert torch.accelerator.current_device_index() == 1
    assert torch.ember.current_device() == 1
    assert torch.empty(1, device="ember").device == torch.device("ember", 1)
    torch.accelerator.set_device_index(0)
    assert torch.ember.current_device() == 0


@pytest.mark.requires_two_devices
def test_accelerator_device_index_context():
    with torch.accelerator.device_index(1):
        assert torch.ember.current_device() == 1
    assert torch.ember.current_device() == 0


# ---------------------------------------------------------------------------
# torch.ember device module


def test_device_count_matches_environment():
    assert torch.ember.is_available()
    assert torch.ember.device_count() == int(os.environ.get("EMBER_DEVICES", "1"))


def test_current_device_defaults_to_zero():
    assert torch.ember.current_device() == 0


@pytest.mark.requires_two_devices
@pytest.mark.parametrize("target", [1, "ember:1", torch.device("ember", 1)])
def test_set_device(target):
    torch.ember.set_device(target)
    assert torch.ember.current_device() == 1
    assert torch.empty(1, device="ember").device == torch.device("ember", 1)
    assert torch.ones(1).to("ember").device == torch.device("ember", 1)
    torch.ember.set_device(0)
    assert torch.ember.current_device() == 0


@pytest.mark.requires_two_devices
def test_device_context_manager_restores():
    with torch.ember.device(1):
        assert torch.ember.current_device() == 1
        assert torch.empty(1, device="ember").device.index == 1
        with torch.ember.device("ember:0"):
            assert torch.ember.current_device() == 0
        assert torch.ember.current_device() == 1
    assert torch.ember.current_device() == 0


@pytest.mark.requires_two_devices
def test_device_context_manager_restores_when_body_raises():
    with pytest.raises(ZeroDivisionError), torch.ember.device(torch.device("ember", 1)):
        assert torch.ember.current_device() == 1
        _ = 1 / 0
    assert torch.ember.current_device() == 0


@pytest.mark.requires_two_devices
def test_device_of_tensor():
    on_second = torch.ones(1, device="ember:1")
    with torch.ember.device_of(on_second):
        assert torch.ember.current_device() == 1
    assert torch.ember.current_device() == 0
    with torch.ember.device_of(torch.ones(1)):  # CPU tensors leave the device alone
        assert torch.ember.current_device() == 0


@pytest.mark.requires_two_devices
def test_current_device_and_stream_are_per_thread():
    torch.ember.set_device(1)
    stream = torch.ember.Stream(device=1)
    torch.ember.set_stream(stream)
    seen = {}

    def worker():
        seen["device"] = torch.ember.current_device()
        seen["stream"] = torch.ember.current_stream(1).stream_id
        torch.ember.set_device(0)
        seen["allocated_on"] = torch.empty(1, device="ember").device

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == {"device": 0, "stream": 0, "allocated_on": torch.device("ember", 0)}
    assert torch.ember.current_device() == 1
    assert torch.ember.current_stream(1) == stream


@pytest.mark.requires_two_devices
def test_ops_run_on_the_device_of_their_inputs():
    x = torch.full((3,), 2.0, device="ember:1")
    assert torch.ember.current_device() == 0
    y = x * x + 1
    assert y.device == torch.device("ember", 1)
    assert torch.equal(y.cpu(), torch.full((3,), 5.0))
    with torch.ember.device(1):
        assert torch.randn(2, device="ember").device == torch.device("ember", 1)
        assert torch.arange(3, device="ember").device == torch.device("ember", 1)


def test_device_context_manager_with_current_device():
    with torch.ember.device(0):
        assert torch.ember.current_device() == 0
    with torch.ember.device(None):
        assert torch.ember.current_device() == 0
    assert torch.ember.current_device() == 0


def test_synchronize():
    x = torch.full((4,), 3.0, device="ember")
    y = x.mul(2)
    torch.ember.synchronize()
    torch.ember.synchronize(0)
    torch.ember.synchronize("ember:0")
    assert torch.equal(y.cpu(), torch.full((4,), 6.0))


def test_device_name():
    name = torch.ember.get_device_name()
    assert "ember" in name
    assert torch.ember.get_device_name(0) == name
    assert torch.ember.get_device_properties(0).name == name


def test_device_properties():
    props = torch.ember.get_device_properties(0)
    assert props.cores >= 1
    assert props.cores <= os.cpu_count()
    assert props.total_memory > 0
    assert props.isa in {"amx", "avx512", "avx2", "default"}
    assert props.numa_node >= 0
    assert props.index == 0
    assert props.multi_processor_count == props.cores
    assert "ember" in repr(props)


@pytest.mark.requires_two_devices
def test_device_properties_of_second_device():
    assert torch.ember.get_device_properties("ember:1").index == 1
    assert torch.ember.get_device_properties(torch.device("ember", 1)).index == 1


def test_device_properties_rejects_other_device_types():
    with pytest.raises(ValueError):
        torch.ember.get_device_properties("cpu")


# ---------------------------------------------------------------------------
# Copies between CPU and ember, and across ember devices

DTYPES = [
    torch.float32,
    torch.float64,
    torch.bfloat16,
    torch.float16,
    torch.int8,
    torch.int64,
    torch.bool,
    torch.complex64,
]

VIEWS = {
    "contiguous": lambda t: t,
    "transpose": lambda t: t.t(),
    "step_slice": lambda t: t[::2, 1::3],
    "offset_slice": lambda t: t[2:, 3:],
    "expand": lambda t: t[:1].expand(5, t.shape[1]),
    "column": lambda t: t[:, 4],
}


def _sample(dtype: torch.dtype, *shape: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1234)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    if dtype.is_complex:
        return torch.randn(*shape, dtype=dtype, generator=generator)
    if dtype.is_floating_point:
        return (torch.randn(*shape, generator=generator) * 10).to(dtype)
    return torch.randint(-100, 100, shape, generator=generator).to(dtype)


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_copy_cpu_view_to_ember(dtype, view):
    source = VIEWS[view](_sample(dtype, 6, 8))
    result = source.to("ember")
    assert result.device == torch.device("ember", 0)
    assert result.dtype == dtype
    assert result.shape == source.shape
    assert torch.equal(result.cpu(), source)


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_copy_ember_view_to_cpu(dtype, view):
    cpu = _sample(dtype, 6, 8)
    result = VIEWS[view](cpu.to("ember")).cpu()
    assert result.device == torch.device("cpu")
    assert torch.equal(result, VIEWS[view](cpu))


@pytest.mark.requires_two_devices
@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_copy_ember_view_across_devices(dtype, view):
    cpu = _sample(dtype, 6, 8)
    result = VIEWS[view](cpu.to("ember:0")).to("ember:1")
    assert result.device == torch.device("ember", 1)
    assert torch.equal(result.cpu(), VIEWS[view](cpu))


@pytest.mark.parametrize("source_device", ["cpu", "ember:0", "ember:1"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_copy_into_non_contiguous_ember_destination(dtype, source_device):
    if source_device == "ember:1" and NUM_DEVICES < 2:
        pytest.skip("needs two ember devices (run with EMBER_DEVICES=2)")
    cpu = _sample(dtype, 6, 8)
    destination = torch.zeros(8, 6, dtype=dtype, device="ember").t()
    assert not destination.is_contiguous()
    returned = destination.copy_(cpu.to(source_device))
    assert returned is destination
    assert torch.equal(destination.cpu(), cpu)


CONVERSIONS = [
    (torch.float32, torch.bfloat16),
    (torch.float32, torch.float16),
    (torch.float64, torch.float32),
    (torch.float16, torch.float64),
    (torch.bfloat16, torch.float32),
    (torch.float32, torch.int64),
    (torch.int64, torch.float32),
    (torch.int8, torch.int64),
    (torch.bool, torch.int8),
    (torch.float32, torch.bool),
    (torch.complex64, torch.complex128),
    (torch.float32, torch.complex64),
]


@pytest.mark.parametrize("src_dtype,dst_dtype", CONVERSIONS, ids=str)
def test_dtype_conversion_during_copy(src_dtype, dst_dtype):
    cpu = _sample(src_dtype, 6, 8).t()
    expected = cpu.to(dst_dtype)
    on_ember = cpu.to("ember")
    results = {
        "cpu->ember": cpu.to("ember", dst_dtype),
        "ember->cpu": on_ember.to("cpu", dst_dtype),
        "ember->ember": on_ember.to(dst_dtype),
        "copy_": torch.empty(8, 6, dtype=dst_dtype, device="ember").copy_(on_ember),
        "copy_ from cpu": torch.empty(6, 8, dtype=dst_dtype, device="ember").t().copy_(cpu),
    }
    for how, result in results.items():
        assert result.dtype == dst_dtype, how
        assert torch.equal(result.cpu(), expected), how


@pytest.mark.requires_two_devices
@pytest.mark.parametrize("src_dtype,dst_dtype", CONVERSIONS[:6], ids=str)
def test_dtype_conversion_across_devices(src_dtype, dst_dtype):
    cpu = _sample(src_dtype, 6, 8)
    source = cpu.to("ember:0")[::2]
    result = source.to("ember:1", dst_dtype)
    assert result.device == torch.device("ember", 1)
    assert torch.equal(result.cpu(), cpu[::2].to(dst_dtype))
    destination = torch.zeros(3, 8, dtype=dst_dtype, device="ember:1")
    destination.copy_(source)
    assert torch.equal(destination.cpu(), cpu[::2].to(dst_dtype))


def test_storage_offsets_are_respected():
    base_cpu = torch.arange(40.0)
    base = base_cpu.to("ember")
    view = base[7:27].view(4, 5)[:, 1:]
    assert view.storage_offset() == 8
    assert torch.equal(view.cpu(), base_cpu[7:27].view(4, 5)[:, 1:])
    assert torch.equal(view.contiguous().cpu(), base_cpu[7:27].view(4, 5)[:, 1:])

    # Writing into a view at an offset touches only that view.
    base[10:15].copy_(torch.full((5,), -1.0))
    expected = base_cpu.clone()
    expected[10:15] = -1.0
    assert torch.equal(base.cpu(), expected)

    # A CPU source with an offset.
    source = torch.arange(100.0)[37:49]
    assert torch.equal(source.to("ember").cpu(), torch.arange(37.0, 49.0))


@pytest.mark.requires_two_devices
def test_storage_offsets_across_devices():
    base_cpu = torch.arange(64, dtype=torch.int64).view(8, 8)
    view = base_cpu.to("ember:0")[3:, 2::3]
    moved = view.to("ember:1")
    assert torch.equal(moved.cpu(), base_cpu[3:, 2::3])
    destination = torch.zeros(8, 8, dtype=torch.int64, device="ember:1")
    assert view.shape == (5, 2)
    destination[1:6, 3:5].copy_(view)
    expected = torch.zeros(8, 8, dtype=torch.int64)
    expected[1:6, 3:5] = base_cpu[3:, 2::3]
    assert torch.equal(destination.cpu(), expected)


def test_copy_preserves_special_float_bits():
    values = torch.tensor(
        [float("nan"), float("inf"), float("-inf"), -0.0, 0.0, 1e-45, 3.4e38],
        dtype=torch.float32,
    )
    bits = values.view(torch.int32)
    round_trip = values.to("ember").cpu()
    assert torch.equal(round_trip.view(torch.int32), bits)
    non_contiguous = torch.stack([values, values], dim=1)[:, 0].to("ember").cpu()
    assert torch.equal(non_contiguous.view(torch.int32), bits)


def test_copy_of_conjugate_and_negative_views():
    cpu = _sample(torch.complex64, 4, 5)
    on_ember = cpu.to("ember")
    assert torch.equal(cpu.conj().to("ember").cpu(), cpu.conj())
    assert torch.equal(on_ember.conj().cpu(), cpu.conj())
    destination = torch.empty(4, 5, dtype=torch.complex64, device="ember")
    destination.copy_(on_ember.conj())
    assert torch.equal(destination.cpu(), cpu.conj().resolve_conj())
    assert torch.equal(on_ember._neg_view().cpu(), -cpu)


@pytest.mark.parametrize(
    "shape", [(1, 256, 14, 14), (2, 17, 5, 7), (3, 33, 9, 1), (2, 5, 1, 1), (1, 130, 11, 13)]
)
@pytest.mark.parametrize("to_channels_last", [True, False])
def test_copy_between_nchw_and_channels_last_is_exact(shape, to_channels_last):
    """ember re-lays fp32 images between the two layouts with its own
    transposes (any odd size, partial tiles, sizes where both layouts
    coincide); the bits and CPU's strides come out, also from an ember
    tensor of the other device and from the host, and under cpu_parity."""
    x = torch.randn(shape)
    x.view(-1)[:3] = torch.tensor([float("nan"), -0.0, float("inf")])
    src_format, dst_format = torch.contiguous_format, torch.channels_last
    if not to_channels_last:
        src_format, dst_format = dst_format, src_format
    source = x.contiguous(memory_format=src_format)
    expected = source.contiguous(memory_format=dst_format)
    on_ember = source.to("ember")
    for parity in (False, True):
        with torch.backends.ember.flags(cpu_parity=parity):
            out = on_ember.contiguous(memory_format=dst_format)
            assert out.stride() == expected.stride()
            assert torch.equal(out.cpu().view(torch.int32), expected.view(torch.int32))
            into = torch.empty_like(expected, device="ember")
            into.copy_(source)  # from the host
            assert torch.equal(into.cpu().view(torch.int32), expected.view(torch.int32))


@pytest.mark.parametrize("parity", [False, True])
@pytest.mark.parametrize(
    "make_pair",
    [
        # shifted by one element (a classic memmove)
        lambda t: (t.view(-1)[1:], t.view(-1)[:-1]),
        # the same bytes in another layout
        lambda t: (t, t.as_strided(t.shape, (16, 1, 8, 4))),
    ],
    ids=["shifted", "relaid"],
)
def test_copy_refuses_a_partially_overlapping_source_as_cpu_does(make_pair, parity):
    """A within-device copy whose source shares some bytes with its
    destination raises CPU's RuntimeError and leaves the data untouched
    (ember's kernels run on CPU aliases, which cannot see the overlap)."""
    cpu = torch.arange(16.0).reshape(1, 4, 2, 2)
    dst_cpu, src_cpu = make_pair(cpu)
    with pytest.raises(RuntimeError) as cpu_error:
        dst_cpu.copy_(src_cpu)
    on_ember = cpu.to("ember")
    dst, src = make_pair(on_ember)
    with torch.backends.ember.flags(cpu_parity=parity), pytest.raises(RuntimeError) as ember_error:
        dst.copy_(src)
    assert str(ember_error.value) == str(cpu_error.value)
    assert torch.equal(on_ember.cpu(), torch.arange(16.0).reshape(1, 4, 2, 2))
    # A full overlap (the same view) is a no-op on both.
    on_ember.copy_(on_ember.view(1, 4, 2, 2))
    assert torch.equal(on_ember.cpu(), cpu)


def test_non_blocking_copy():
    cpu = torch.arange(1000, dtype=torch.int64)
    on_ember = cpu.to("ember", non_blocking=True)
    back = on_ember.to("cpu", non_blocking=True)
    torch.ember.synchronize()
    assert torch.equal(back, cpu)


def test_module_to_ember_keeps_parameter_identity_like_cuda():
    """`param.data` is swapped in place (as for CUDA), so an optimizer built before
    the move still updates the module's parameters, and lazy modules work."""
    model = torch.nn.Linear(3, 4)
    weight = model.weight
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model.to("ember")
    assert model.weight is weight and weight.device.type == "ember"
    before = weight.detach().cpu().clone()
    model(torch.randn(2, 3, device="ember")).sum().backward()
    optimizer.step()
    assert not torch.equal(weight.detach().cpu(), before)
    lazy = torch.nn.LazyConv1d(5, 3).to("ember")
    assert lazy(torch.randn(2, 4, 3, device="ember")).shape == (2, 5, 1)
