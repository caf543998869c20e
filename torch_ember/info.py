"""``python -m torch_ember info``: what ember is, what it runs on and how it
is configured right now, in the spirit of ``torch.utils.collect_env``.

:func:`collect` gathers everything into a JSON-ready dict; :func:`render`
turns that dict into the text report. A part that cannot be read (e.g. a
binding the extension does not have yet) is reported as
``"not available: <reason>"`` instead of failing the whole report.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import torch_ember
from torch_ember import _C
from torch_ember import backends as ember_backends

# Environment variables that change ember's behaviour at start-up.
ENVIRONMENT_VARIABLES = (
    "EMBER_DEVICES",
    "EMBER_CPU_PARITY",
    "EMBER_ASYNC",
    "EMBER_LAUNCH_BLOCKING",
    "EMBER_VERBOSE",
    "EMBER_FALLBACK",
    "EMBER_STRICT",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "ONEDNN_DEFAULT_FPMATH_MODE",
)


def _safe(read: Callable[[], Any]) -> Any:
    try:
        return read()
    except Exception as error:  # noqa: BLE001 - one missing binding must not end the report
        return f"not available: {type(error).__name__}: {error}"


def _flags() -> dict[str, Any]:
    """Every switch of torch.backends.ember under its ``flags()`` keyword,
    with what it resolves to where that differs from the setting."""
    be = ember_backends
    return {
        "async_execution": _safe(lambda: be.async_execution),
        "cpu_parity": _safe(lambda: be.cpu_parity),
        "fuse_elementwise": _safe(lambda: be.fuse_elementwise),
        "packed_weights_limit": _safe(lambda: be.packed_weights_limit),
        "deterministic": _safe(lambda: be.deterministic),
        "effective_deterministic": _safe(lambda: _C.flags.effective_deterministic()),
        "benchmark": _safe(lambda: be.benchmark),
        "benchmark_limit": _safe(lambda: be.benchmark_limit),
        "fallback": _safe(lambda: be.fallback),
        "strict": _safe(torch_ember.is_strict),
        "matmul_fp32_precision": _safe(lambda: be.matmul.fp32_precision),
        "effective_matmul_fp32_precision": _safe(lambda: be.matmul.effective_fp32_precision),
        "conv_fp32_precision": _safe(lambda: be.conv.fp32_precision),
        "effective_conv_fp32_precision": _safe(lambda: be.conv.effective_fp32_precision),
        "blas_library": _safe(be.preferred_blas_library),
        "available_blas_libraries": _safe(lambda: list(be.available_blas_libraries())),
        "verbose": _safe(be.get_verbose),
        "flash_sdp": _safe(be.flash_sdp_enabled),
        "math_sdp": _safe(be.math_sdp_enabled),
    }


def _torch_settings() -> dict[str, Any]:
    """torch's own global switches that ember's kernels follow."""
    opt_einsum = torch.backends.opt_einsum
    return {
        "are_deterministic_algorithms_enabled": torch.are_deterministic_algorithms_enabled(),
        "deterministic_algorithms_warn_only": (
            torch.is_deterministic_algorithms_warn_only_enabled()
        ),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "opt_einsum_available": opt_einsum.is_available(),
        "opt_einsum_enabled": opt_einsum.enabled,
        "opt_einsum_strategy": opt_einsum.strategy,
    }


def _cpu() -> dict[str, Any]:
    features = _safe(_C.cpu_features)
    if isinstance(features, str):
        features = {}
    numa_root = Path("/sys/devices/system/node")
    numa_nodes = sorted(p.name for p in numa_root.glob("node[0-9]*")) if numa_root.is_dir() else []
    return {
        "vendor": features.get("vendor", platform.processor() or "unknown"),
        "model": features.get("model_name", "unknown"),
        "logical_cpus": os.cpu_count(),
        "host_numa_nodes": len(numa_nodes),
        "cpu_capability": _safe(ember_backends.get_cpu_capability),
        "capabilities": _safe(ember_backends.capabilities),
    }


def _device(index: int) -> dict[str, Any]:
    props = torch.ember.get_device_properties(index)
    stats = torch.ember.memory_stats(index)
    free, total = torch.ember.mem_get_info(index)
    return {
        "index": index,
        "name": props.name,
        "cores": props.cores,
        "numa_node": props.numa_node,
        "total_memory": props.total_memory,
        "isa": props.isa,
        "memory": {
            "allocated": stats.get("allocated_bytes.all.current", 0),
            "peak_allocated": stats.get("allocated_bytes.all.peak", 0),
            "reserved": stats.get("reserved_bytes.all.current", 0),
            "allocations": stats.get("allocation.all.allocated", 0),
            "ooms": stats.get("num_ooms", 0),
            "free": free,
            "total": total,
        },
    }


def _benchmark_cache() -> Any:
    info = ember_backends.benchmark_cache_info()
    return {"entries": info.get("entries"), "limit": info.get("limit")}


def collect() -> dict[str, Any]:
    """Everything ``python -m torch_ember info`` reports, as plain data.

    An invalid ``EMBER_*`` setting makes every use of a device raise; the
    report still runs and says which setting is wrong (it is the tool one
    reaches for when something is wrong)."""
    try:
        count = torch.ember.device_count()
    except RuntimeError as error:
        count, devices = 0, [f"unavailable: {error}"]
    else:
        devices = [_safe(lambda i=i: _device(i)) for i in range(count)]
    return {
        "versions": _safe(ember_backends.version),
        "is_built": _safe(ember_backends.is_built),
        "is_available": _safe(ember_backends.is_available),
        "python": platform.python_version(),
        "os": platform.platform(),
        "cpu": _cpu(),
        "flags": _flags(),
        "torch": _torch_settings(),
        "benchmark_cache": _safe(_benchmark_cache),
        "device_count": count,
        "devices": devices,
        "threads": {
            "num_threads": torch.get_num_threads(),
            "num_interop_threads": torch.get_num_interop_threads(),
        },
        "environment": {name: os.environ.get(name) for name in ENVIRONMENT_VARIABLES},
    }


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


def _rows(pairs: list[tuple[str, Any]], indent: str = "  ") -> list[str]:
    width = max(len(name) for name, _ in pairs)
    return [f"{indent}{name.ljust(width)}  {value}" for name, value in pairs]


def render(info: dict[str, Any]) -> str:
    """The text report of :func:`collect`'s dict."""
    lines: list[str] = []
    versions = info["versions"]
    if isinstance(versions, dict):
        lines.append(f"ember {versions.get('ember', '?')}")
        lines.append("library versions:")
        lines += _rows([(name, value) for name, value in versions.items() if name != "ember"])
    else:
        lines.append(f"versions: {versions}")
    lines += _rows(
        [
            ("is_built", info["is_built"]),
            ("is_available", info["is_available"]),
            ("python", info["python"]),
            ("os", info["os"]),
        ],
        indent="",
    )

    cpu = info["cpu"]
    lines += ["", "CPU:"]
    lines += _rows(
        [
            ("vendor", cpu["vendor"]),
            ("model", cpu["model"]),
            ("logical cpus", cpu["logical_cpus"]),
            ("host NUMA nodes", cpu["host_numa_nodes"]),
            ("get_cpu_capability", cpu["cpu_capability"]),
        ]
    )
    capabilities = cpu["capabilities"]
    lines.append("  capabilities():")
    if isinstance(capabilities, dict):
        lines += _rows([(name, "yes" if on else "no") for name, on in capabilities.items()], "    ")
    else:
        lines.append(f"    {capabilities}")

    flags, settings = info["flags"], info["torch"]
    blas = flags["available_blas_libraries"]
    blas = ", ".join(blas) if isinstance(blas, list) else blas
    deterministic = (
        f"{flags['deterministic']} (effective: {flags['effective_deterministic']}; "
        "torch.are_deterministic_algorithms_enabled: "
        f"{settings['are_deterministic_algorithms_enabled']})"
    )
    matmul = (
        f"{flags['matmul_fp32_precision']} (effective: {flags['effective_matmul_fp32_precision']})"
    )
    conv = f"{flags['conv_fp32_precision']} (effective: {flags['effective_conv_fp32_precision']})"
    opt_einsum = (
        f"enabled: {settings['opt_einsum_enabled']}, "
        f"strategy: {settings['opt_einsum_strategy']} "
        f"(available: {settings['opt_einsum_available']})"
    )
    cache = info["benchmark_cache"]
    if isinstance(cache, dict):
        cache = f"{cache['entries']} entries (limit {cache['limit']}, 0 = unbounded)"
    lines += ["", "flags (torch.backends.ember):"]
    lines += _rows(
        [
            ("async_execution", flags["async_execution"]),
            ("cpu_parity", flags["cpu_parity"]),
            ("fuse_elementwise", flags["fuse_elementwise"]),
            ("packed_weights_limit", flags["packed_weights_limit"]),
            ("deterministic", deterministic),
            ("benchmark", flags["benchmark"]),
            ("benchmark_limit", flags["benchmark_limit"]),
            ("benchmark cache", cache),
            ("fallback", f"{flags['fallback']} (strict: {flags['strict']})"),
            ("matmul.fp32_precision", matmul),
            ("conv.fp32_precision", conv),
            ("torch float32_matmul_precision", settings["float32_matmul_precision"]),
            ("preferred_blas_library", f"{flags['blas_library']} (available: {blas})"),
            ("verbose", flags["verbose"]),
            ("flash_sdp_enabled", flags["flash_sdp"]),
            ("math_sdp_enabled", flags["math_sdp"]),
            ("opt_einsum", opt_einsum),
        ]
    )

    lines += ["", f"devices: {info['device_count']} (torch.ember.device_count())"]
    for device in info["devices"]:
        if not isinstance(device, dict):
            lines.append(f"  {device}")
            continue
        memory = device["memory"]
        usage = (
            f"allocated {_mib(memory['allocated'])}, "
            f"peak {_mib(memory['peak_allocated'])}, "
            f"reserved {_mib(memory['reserved'])}, "
            f"free {_mib(memory['free'])} of {_mib(memory['total'])}, "
            f"ooms {memory['ooms']}"
        )
        lines.append(f"  ember:{device['index']}")
        lines += _rows(
            [
                ("name", device["name"]),
                ("cores", device["cores"]),
                ("numa_node", device["numa_node"]),
                ("isa", device["isa"]),
                ("total_memory", _mib(device["total_memory"])),
                ("memory", usage),
            ],
            "    ",
        )
    threads = info["threads"]
    lines += ["", "threads:"]
    lines += _rows(
        [
            ("torch.get_num_threads", threads["num_threads"]),
            ("torch.get_num_interop_threads", threads["num_interop_threads"]),
        ]
    )
    lines += ["", "environment:"]
    lines += _rows([(name, value) for name, value in info["environment"].items()])
    return "\n".join(lines)
