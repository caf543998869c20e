"""torch.backends.ember inspection: is_available/is_built, version(),
capabilities() against /proc/cpuinfo, get_cpu_capability(), and the
``python -m torch_ember info`` report (text and --json) of every flag."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import torch_ember
import torch_ember.backends as ember_backends
from torch_ember import info

NUM_DEVICES = torch.ember.device_count()

# Every flags() keyword; the report lists each under this name in --json.
FLAG_KEYWORDS = (
    "async_execution",
    "cpu_parity",
    "packed_weights_limit",
    "deterministic",
    "benchmark",
    "benchmark_limit",
    "fallback",
    "matmul_fp32_precision",
    "conv_fp32_precision",
    "blas_library",
    "verbose",
    "flash_sdp",
    "math_sdp",
)
# What the text report names them (attribute or function of torch.backends.ember).
TEXT_NAMES = (
    "cpu_parity",
    "packed_weights_limit",
    "deterministic",
    "are_deterministic_algorithms_enabled",
    "benchmark",
    "benchmark_limit",
    "fallback",
    "matmul.fp32_precision",
    "conv.fp32_precision",
    "float32_matmul_precision",
    "preferred_blas_library",
    "verbose",
    "flash_sdp_enabled",
    "math_sdp_enabled",
    "opt_einsum",
)


def _cpuinfo_flags() -> set[str] | None:
    path = Path("/proc/cpuinfo")
    if not path.exists():
        return None
    for line in path.read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return None


def _run_info(*args: str, env: dict[str, str | None] | None = None) -> str:
    environment = dict(os.environ)
    for name in ("EMBER_VERBOSE", "EMBER_FALLBACK", "EMBER_STRICT"):
        environment.pop(name, None)
    for name, value in (env or {}).items():
        if value is None:
            environment.pop(name, None)
        else:
            environment[name] = value
    result = subprocess.run(
        [sys.executable, "-m", "torch_ember", "info", *args],
        env=environment,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def _row(report: str, name: str) -> str:
    """The value column of the text report's row called ``name``."""
    match = re.search(rf"^\s+{re.escape(name)}\s+(.*)$", report, re.MULTILINE)
    assert match, f"no row {name!r} in:\n{report}"
    return match.group(1)


# -- availability, versions, CPU features ----------------------------------------


def test_is_built_and_is_available():
    assert ember_backends.is_built() is True
    assert ember_backends.is_available() is (NUM_DEVICES > 0)
    assert torch.backends.ember is ember_backends


def test_version_names_ember_torch_and_kernel_libraries():
    versions = ember_backends.version()
    assert versions["ember"] == torch_ember.__version__
    assert versions["torch"] == torch.__version__
    assert ("mkl" in versions) == torch.backends.mkl.is_available()
    assert ("onednn" in versions) == torch.backends.mkldnn.is_available()
    for name, value in versions.items():
        assert isinstance(value, str) and value, name
        if name in ("mkl", "onednn", "torch", "ember"):
            assert re.match(r"\d+\.\d+", value), (name, value)
    if "onednn" in versions:
        assert f"v{versions['onednn']}" in torch.__config__.show()


def test_capabilities_are_bools_and_match_proc_cpuinfo():
    capabilities = ember_backends.capabilities()
    assert {"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"} <= set(capabilities)
    assert all(isinstance(value, bool) for value in capabilities.values())
    cpu_flags = _cpuinfo_flags()
    if cpu_flags is None:
        pytest.skip("no /proc/cpuinfo flags line")
    for name, present in capabilities.items():
        if name.startswith("amx"):
            # Needs the CPU feature and the OS's permission for the tile state.
            assert not present or name in cpu_flags, name
        else:
            assert present == (name in cpu_flags), name
    # AMX data types are usable only with AMX tiles.
    assert not capabilities["amx_bf16"] or capabilities["amx_tile"]
    assert not capabilities["amx_int8"] or capabilities["amx_tile"]


def test_feature_hierarchy_is_consistent():
    c = ember_backends.capabilities()
    assert not c["avx2"] or c["avx"]
    assert not c["avx512f"] or c["avx2"]
    assert not c["avx512_bf16"] or c["avx512f"]


def test_get_cpu_capability_is_atens_level_and_fits_the_cpu():
    level = ember_backends.get_cpu_capability()
    assert level == torch.backends.cpu.get_cpu_capability()
    c = ember_backends.capabilities()
    if level.startswith("AVX512"):
        assert c["avx512f"] and c["avx512bw"] and c["avx512vl"] and c["avx512dq"]
    elif level == "AVX2":
        assert c["avx2"] and c["fma"]
    if "ATEN_CPU_CAPABILITY" not in os.environ and c["avx2"] and c["fma"]:
        assert level != "DEFAULT"


# -- python -m torch_ember info -----------------------------------------------------


def test_collect_reports_current_flag_values_in_process():
    with ember_backends.flags(benchmark=True, benchmark_limit=3, fallback="warn"):
        report = info.collect()
        text = info.render(report)
    assert report["flags"]["benchmark"] is True
    assert report["flags"]["benchmark_limit"] == 3
    cache = ember_backends.benchmark_cache_info()
    assert report["benchmark_cache"] == {"entries": cache["entries"], "limit": 3}
    assert _row(text, "benchmark cache").startswith(f"{cache['entries']} entries (limit 3")
    assert report["flags"]["fallback"] == "warn"
    assert _row(text, "benchmark") == "True"
    assert _row(text, "benchmark_limit") == "3"
    assert _row(text, "fallback").startswith("warn")
    after = info.collect()["flags"]
    assert after["benchmark"] is False and after["fallback"] == "allow"


def test_info_json_has_every_flags_keyword():
    report = info.collect()
    assert set(FLAG_KEYWORDS) <= set(report["flags"])
    # The surface's own keyword tables: a new flag must show up in the report.
    known = set(ember_backends._PROPERTIES) | set(ember_backends._FLAG_KEYWORDS)
    assert known <= set(report["flags"])


def test_info_text_lists_every_flag_and_the_topology():
    out = _run_info()
    for name in TEXT_NAMES:
        assert name in out, name
    assert f"ember {torch_ember.__version__}" in out
    assert _row(out, "fallback") == "allow (strict: False)"
    assert _row(out, "verbose") == "0"
    assert _row(out, "get_cpu_capability") == ember_backends.get_cpu_capability()
    assert _row(out, "torch.get_num_threads").isdigit()
    assert f"devices: {NUM_DEVICES}" in out
    for index in range(NUM_DEVICES):
        assert f"ember:{index}" in out
    props = torch.ember.get_device_properties(0)
    assert _row(out, "numa_node") == str(props.numa_node)
    assert _row(out, "cores") == str(props.cores)
    for name, present in ember_backends.capabilities().items():
        assert _row(out, name) == ("yes" if present else "no")


def test_info_json_parses_and_follows_the_environment():
    report = json.loads(_run_info("--json", env={"EMBER_VERBOSE": "2", "EMBER_FALLBACK": "error"}))
    flags = report["flags"]
    assert flags["verbose"] == 2
    assert flags["fallback"] == "error" and flags["strict"] is True
    assert set(FLAG_KEYWORDS) <= set(flags)
    assert report["versions"] == ember_backends.version()
    assert report["cpu"]["capabilities"] == ember_backends.capabilities()
    assert report["device_count"] == NUM_DEVICES
    assert [d["index"] for d in report["devices"]] == list(range(NUM_DEVICES))
    assert report["devices"][0]["memory"]["total"] > 0
    assert report["torch"]["float32_matmul_precision"] == torch.get_float32_matmul_precision()
    assert report["environment"]["EMBER_FALLBACK"] == "error"

    default = json.loads(_run_info("--json"))["flags"]
    assert default["verbose"] == 0 and default["fallback"] == "allow"


def test_info_text_follows_strict_and_warn_environment():
    strict = _run_info(env={"EMBER_STRICT": "1", "EMBER_VERBOSE": "1"})
    assert _row(strict, "fallback") == "error (strict: True)"
    assert _row(strict, "verbose") == "1"
    warn = _run_info(env={"EMBER_FALLBACK": "warn"})
    assert _row(warn, "fallback") == "warn (strict: False)"


def test_info_names_an_invalid_setting_instead_of_failing():
    """The diagnostic tool still reports when a setting makes every device unusable."""
    report = json.loads(_run_info("--json", env={"EMBER_VERBOSE": "abc"}))
    assert report["device_count"] == 0
    assert len(report["devices"]) == 1 and "EMBER_VERBOSE='abc' is invalid" in report["devices"][0]
    assert report["environment"]["EMBER_VERBOSE"] == "abc"
    assert "EMBER_VERBOSE='abc' is invalid" in _run_info(env={"EMBER_VERBOSE": "abc"})


def test_info_reports_a_missing_part_instead_of_failing(monkeypatch):
    def broken():
        raise RuntimeError("not built")

    # The module's names are protected from assignment: patch its namespace.
    monkeypatch.setitem(vars(ember_backends), "capabilities", broken)
    report = info.collect()
    assert report["cpu"]["capabilities"].startswith("not available")
    assert "not available: RuntimeError: not built" in info.render(report)


def test_main_without_command_prints_usage():
    result = subprocess.run(
        [sys.executable, "-m", "torch_ember"], check=False, capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "info" in result.stderr
