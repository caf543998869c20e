"""Shared fixtures for the ember test suite.

Run with ``EMBER_DEVICES=2`` to exercise the multi-device tests; without it
there is one ember device and tests marked ``requires_two_devices`` skip.
"""

import gc
import os
import subprocess
import sys

import pytest
import torch

import torch_ember  # registers the backend even without autoload

NUM_DEVICES = torch.ember.device_count()


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "requires_two_devices: needs at least two ember devices (EMBER_DEVICES>=2)"
    )
    config.addinivalue_line(
        "markers",
        "cpu_parity: runs with torch.backends.ember.cpu_parity = True (the test compares "
        "with CPU bit for bit; ember's default kernels agree only within tolerance)",
    )


def pytest_collection_modifyitems(config, items):
    if NUM_DEVICES >= 2:
        return
    skip = pytest.mark.skip(reason="needs two ember devices (run with EMBER_DEVICES=2)")
    for item in items:
        if "requires_two_devices" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _restore_device_and_streams():
    """Every test starts on ember:0 with default streams and leaves it that way."""
    torch.ember.set_device(0)
    yield
    for index in range(NUM_DEVICES):
        torch.ember.set_stream(torch.ember.default_stream(index))
    torch.ember.set_device(0)


@pytest.fixture
def queued_launches():
    """Small launched work is queued even while a stream's worker sleeps.

    By default ember runs small work at the call while the worker sleeps with
    nothing queued (waking it costs more than the kernel); whether a worker
    has gone to sleep depends on how long the test paused, so tests that
    count launched work use this to make queuing independent of timing."""
    torch_ember._C._engine_keep_workers_awake(True)
    yield
    torch_ember._C._engine_keep_workers_awake(False)


@pytest.fixture
def async_on():
    """Asynchronous execution on for the test, launch counts reset; the
    stream drained and the switch restored after it."""
    previous = torch.backends.ember.async_execution
    torch.backends.ember.async_execution = True
    torch_ember.reset_launch_stats()
    yield
    torch.ember.synchronize()
    torch.backends.ember.async_execution = previous


@pytest.fixture
def held_work():
    """Asynchronous execution and held work (fuse_elementwise) on, chain and
    epilogue counts reset; the streams drained before and after."""
    with torch.backends.ember.flags(async_execution=True, fuse_elementwise=True):
        torch.ember.synchronize()
        torch_ember.reset_chain_stats()
        yield
        torch.ember.synchronize()


@pytest.fixture
def clean_memory():
    """Frees cached blocks and resets peak statistics of every ember device."""
    gc.collect()
    torch.ember.empty_cache()
    for index in range(NUM_DEVICES):
        torch.ember.reset_peak_memory_stats(index)
    yield
    gc.collect()
    torch.ember.empty_cache()


@pytest.fixture
def empty_caches():
    """Empties ember's caches (blocks, packed weights, tuning choices) before
    and after the test, so that each test's packs and choices are its own."""
    torch.ember.empty_cache()
    yield
    torch.ember.empty_cache()


@pytest.fixture
def run_python():
    """Runs ``python -c code`` in a fresh interpreter with environment overrides.

    ``env`` maps variable names to values; a value of ``None`` removes the
    variable. Returns the CompletedProcess (text mode).
    """

    def run(code: str, env: dict[str, str | None] | None = None, timeout: float = 120):
        environment = dict(os.environ)
        for key, value in (env or {}).items():
            if value is None:
                environment.pop(key, None)
            else:
                environment[key] = value
        return subprocess.run(
            [sys.executable, "-c", code],
            env=environment,
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return run


@pytest.fixture(autouse=True)
def _restore_backend_flags():
    """torch.backends.ember switches and the torch globals they follow come
    back to their values after every test, pass or fail."""
    be = torch.backends.ember
    saved = be.current_flags()
    float32_precision = torch.get_float32_matmul_precision()
    deterministic_algorithms = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    threads = torch.get_num_threads()
    yield
    be.set_flags(**saved)
    torch.set_float32_matmul_precision(float32_precision)
    torch.use_deterministic_algorithms(deterministic_algorithms, warn_only=warn_only)
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _cpu_parity_for_marked_tests(request, _restore_backend_flags):
    """Tests marked ``cpu_parity`` run with every op on CPU's own kernel
    (restored afterwards by _restore_backend_flags)."""
    if request.node.get_closest_marker("cpu_parity") is not None:
        torch.backends.ember.cpu_parity = True
