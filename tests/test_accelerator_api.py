"""torch.accelerator and torch.cuda-shaped API points a user reaches for
next: empty_host_cache, get_device_capability, Stream.priority, the
OutOfMemoryError alias, and loading safetensors files onto ember."""

import pytest
import torch

import torch_ember

QUANTIZED = {torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4}


def test_empty_host_cache_after_ember_tensor_exists(run_python):
    # It dereferenced a null host allocator (exit 139) once ember was used.
    result = run_python(
        "import torch\n"
        "x = torch.ones(3, device='ember')\n"
        "torch.accelerator.empty_host_cache()\n"
        "torch.accelerator.empty_host_cache()\n"
        "print('done', x.sum().item())\n"
    )
    assert result.returncode == 0, result.stderr
    assert "done 3.0" in result.stdout


def test_empty_host_cache_in_process_keeps_pinned_tensors():
    pinned = torch.arange(8.0).pin_memory()
    torch.accelerator.empty_host_cache()
    assert torch.equal(pinned, torch.arange(8.0))


def test_accelerator_get_device_capability():
    capability = torch.accelerator.get_device_capability()
    dtypes = capability["supported_dtypes"]
    assert {torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool} <= dtypes
    assert torch.complex64 in dtypes and torch.float8_e4m3fn in dtypes
    assert not (QUANTIZED & dtypes)  # ember has no quantized tensors
    assert torch.accelerator.get_device_capability("ember:0") == capability
    assert torch.accelerator.get_device_capability(0) == capability


def test_ember_get_device_capability_has_accelerator_form_and_cpu_features():
    capability = torch.ember.get_device_capability()
    assert (
        capability["supported_dtypes"]
        == torch.accelerator.get_device_capability()["supported_dtypes"]
    )
    assert capability["cpu_features"] == torch_ember._C.cpu_features()


def test_get_device_capability_bad_index_raises():
    with pytest.raises(RuntimeError):
        torch.accelerator.get_device_capability(torch.ember.device_count() + 3)


def test_stream_priority():
    assert torch.ember.Stream(priority=-1).priority == -1
    assert torch.ember.Stream().priority == 0
    assert torch.ember.current_stream().priority == 0
    assert torch.ember.default_stream().priority == 0
    high = torch.ember.Stream(priority=-1)
    with torch.ember.stream(high):
        assert torch.ember.current_stream().priority == -1


def test_out_of_memory_error_alias():
    assert torch.ember.OutOfMemoryError is torch.OutOfMemoryError
    assert "OutOfMemoryError" in torch.ember.__all__
    with pytest.raises(torch.ember.OutOfMemoryError):
        torch.empty(1 << 62, dtype=torch.uint8, device="ember")


def test_safetensors_load_file_onto_ember(tmp_path):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    path = tmp_path / "weights.safetensors"
    tensors = {"w": torch.randn(4, 3), "b": torch.arange(5, dtype=torch.int64)}
    safetensors_torch.save_file(tensors, str(path))

    # safetensors validates device names against a fixed list: "ember" is
    # refused there, before torch sees it (documented in the README).
    with pytest.raises(Exception, match="ember"):
        safetensors_torch.load_file(str(path), device="ember")

    # The documented alternatives: an index (torch resolves an int device to
    # the current accelerator, ember), or CPU then .to("ember").
    loaded = safetensors_torch.load_file(str(path), device=torch.ember.current_device())
    moved = {k: v.to("ember") for k, v in safetensors_torch.load_file(str(path)).items()}
    for result in (loaded, moved):
        assert set(result) == set(tensors)
        for name, tensor in result.items():
            assert tensor.device == torch.device("ember", 0)
            assert torch.equal(tensor.cpu(), tensors[name])
