"""torch.compile on ember: the generated C++ kernels on the device's stream.

Under asynchronous execution each kernel is queued like an eager op (sized
like one: a large kernel on an idle stream runs at the call), refuses
arguments it cannot pass, reports its errors at the next synchronisation,
and the wrapper's views of graph inputs keep ember's packed weights right.
Shared set-up (fresh Dynamo, no Inductor caches) and helpers: test_compile.py.
"""

import pytest
import torch
from test_compile import TOL, _assert_close, _fresh_compile, _mlp, _randn  # noqa: F401

import torch_ember

DEVICE = "ember"


def _sleep_on_current_stream(seconds: float) -> None:
    stream = torch.ember.current_stream()
    torch_ember._C._engine_enqueue_sleep(stream.device_index, stream.stream_id, seconds)


def _launched_cpp_kernels() -> int:
    return sum(v["launched"] for k, v in torch_ember.launch_stats().items() if k.startswith("cpp_"))


def test_cpp_kernels_are_launched_on_the_stream_behind_queued_work():
    """Under asynchronous execution a generated C++ kernel is queued like an
    eager op: the call returns while the work before it is still queued, and
    the result is the one of synchronous execution."""
    model, x = _mlp(), _randn(8, 32)
    with torch.backends.ember.flags(async_execution=True):
        compiled = torch.compile(model)
        expected = model(x)
        for _ in range(3):  # compiles; packs the weights on their second use
            _assert_close(compiled(x), expected)
        torch_ember.reset_launch_stats()
        _sleep_on_current_stream(1.0)
        out = compiled(x)
        assert not torch.ember.current_stream().query()  # did not wait for the sleep
        assert _launched_cpp_kernels() >= 2  # GELU, LayerNorm
        _assert_close(out, expected)


@pytest.mark.usefixtures("queued_launches")
def test_a_cpp_kernel_over_a_large_tensor_runs_at_the_call_on_an_idle_stream():
    """Sized like an eager op by its largest tensor: over 64 Ki elements it
    runs at the call while the stream has nothing queued (a compiled CNN's
    kernels then share the host's OpenMP team with the convolutions around
    them), and is queued behind queued work."""
    fn = torch.compile(lambda a: torch.relu(a * 2 + 1))
    big = _randn(1 << 17)
    with torch.backends.ember.flags(async_execution=True):
        expected = fn(big)  # compiles
        torch.ember.synchronize()
        torch_ember.reset_launch_stats()
        at_call = fn(big)
        assert torch.ember.current_stream().query()
        assert _launched_cpp_kernels() == 0, torch_ember.launch_stats()
        _sleep_on_current_stream(0.2)
        queued = fn(big)
        assert not torch.ember.current_stream().query()
        assert _launched_cpp_kernels() == 1, torch_ember.launch_stats()
    for out in (at_call, queued):
        assert torch.equal(out.cpu(), expected.cpu())


def test_cpp_kernels_run_at_the_call_when_execution_is_synchronous():
    model, x = _mlp(), _randn(8, 32)
    with torch.backends.ember.flags(async_execution=False):
        compiled = torch.compile(model)
        torch_ember.reset_launch_stats()
        _assert_close(compiled(x), model(x))
        assert _launched_cpp_kernels() == 0


def test_cpp_kernel_launch_refuses_arguments_it_cannot_pass():
    """A float scalar, a CPU tensor or a tensor of another device is not
    launched (the wrapper then calls the kernel itself); nothing is queued."""
    on_cpu, on_ember = torch.ones(2), torch.ones(2, device=DEVICE)
    with torch.backends.ember.flags(async_execution=True):
        torch_ember.reset_launch_stats()
        for args in [(on_ember, 1.5), (on_cpu,), (on_ember, object())]:
            # the address is never called when the arguments are refused
            assert not torch_ember._C.launch_cpp_kernel(None, "cpp_refused", 1, args)
        assert _launched_cpp_kernels() == 0


@pytest.mark.usefixtures("queued_launches")
def test_a_launched_cpp_kernels_error_is_raised_at_the_next_sync_with_its_name():
    """As with an eager op: the kernel's C++ exception (integer division by zero)
    reaches the host at the next synchronisation, naming the kernel; the
    stream works afterwards."""
    fn = torch.compile(lambda a, b: (a // b) + 1)
    a = torch.arange(8, device=DEVICE)
    zero_at_2 = torch.tensor([1, 2, 0, 1, 1, 1, 1, 1], device=DEVICE)
    with torch.backends.ember.flags(async_execution=True):
        fn(a, zero_at_2 + 1)  # compiles
        torch.ember.synchronize()
        fn(a, zero_at_2)
        with pytest.raises(RuntimeError, match=r"cpp_fused_\w+.*ZeroDivisionError"):
            torch.ember.synchronize()
        assert torch.equal(fn(a, zero_at_2 + 1).cpu(), a.cpu() // (zero_at_2.cpu() + 1) + 1)


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_compiled_linears_use_packed_weights_and_see_in_place_writes(mode):
    """Inductor's wrapper views a graph input (a transposed weight) through a
    real view on ember: it shares the weight's version counter, so a pack is
    dropped when the weight is written in place (before, under no_grad the
    compiled linear kept using the old pack), and under inference_mode it is
    not an inference tensor, so the weight is packed at all."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 32).to(DEVICE).eval()
    x = torch.randn(1, 64, device=DEVICE)
    scope = torch.no_grad() if mode == "no_grad" else torch.inference_mode()
    before = torch.backends.ember.packed_weights_info()
    with scope:
        compiled = torch.compile(lin)
        for _ in range(3):  # compile; the second sighting packs
            compiled(x)
        info = torch.backends.ember.packed_weights_info()
        assert info["hits"] > before["hits"]
        lin.weight.mul_(2)
        torch.testing.assert_close(compiled(x).cpu(), lin(x).cpu(), **TOL)
