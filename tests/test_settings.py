"""Settings fail clearly and never break plain torch (issue 14, item 4).

* Every name of ``torch.backends.ember`` is protected: only the documented
  switches are assignable (validated); assigning or deleting anything else
  raises AttributeError and leaves the flag API working.
* Counts out of int64 range raise ValueError, not the binding's TypeError.
* Every ``EMBER_*`` environment variable is validated with the rule and the
  message of its Python setter. An invalid value never fails ``import
  torch``: CPU-only programs (seeding included) keep working, and the first
  use of ember raises RuntimeError naming the variable and its value.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torch_ember.backends as be

# ---------------------------------------------------------------------------
# torch.backends.ember: assignment


def _public_names() -> list[str]:
    return sorted(n for n in vars(be) if not n.startswith("_"))


def test_every_public_name_that_is_not_a_switch_is_protected():
    names = _public_names()
    for required in ("matmul", "conv", "verbose", "flags", "version", "set_flags"):
        assert required in names
    for name in names:
        before = vars(be)[name]
        with pytest.raises(
            AttributeError, match=rf"torch.backends.ember.{name} cannot be assigned"
        ):
            setattr(be, name, 3)
        with pytest.raises(AttributeError, match=rf"torch.backends.ember.{name} cannot be deleted"):
            delattr(be, name)
        assert vars(be)[name] is before, name


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("matmul", "set torch.backends.ember.matmul.fp32_precision"),
        ("conv", "set torch.backends.ember.conv.fp32_precision"),
        ("verbose", r"call torch.backends.ember.verbose\(level\)"),
        ("flags", r"use torch.backends.ember.flags\(...\)"),
        (
            "version",
            "the assignable switches are async_execution, benchmark, benchmark_limit, cpu_parity",
        ),
    ],
)
def test_assigning_the_issues_names_says_what_to_do_instead(name, hint):
    with pytest.raises(AttributeError, match=hint):
        setattr(torch.backends.ember, name, "replaced")
    # The flag API still works afterwards (it broke before).
    be.matmul.fp32_precision = "bf16"
    assert be.matmul.fp32_precision == "bf16"
    with be.verbose(1):
        assert be.get_verbose() == 1
    with be.flags(deterministic=True):
        assert be.deterministic is True
    assert be.version()["ember"]


def test_switches_stay_assignable_and_validated():
    be.benchmark = True
    assert be.benchmark is True
    with pytest.raises(ValueError, match="True or False"):
        be.benchmark = "yes"
    with pytest.raises(AttributeError, match="cannot be deleted"):
        del be.benchmark
    assert be.benchmark is True


@pytest.mark.parametrize("name", ["benchmark_limit", "packed_weights_limit"])
@pytest.mark.parametrize("value", [2**70, 2**63, -(2**70), -1])
def test_counts_out_of_range_raise_value_error(name, value):
    before = getattr(be, name)
    with pytest.raises(ValueError, match=r"must be an int in \[0, 2\*\*63 - 1\]"):
        setattr(be, name, value)
    with pytest.raises(ValueError, match=r"must be an int in \[0, 2\*\*63 - 1\]"):
        be.set_flags(**{name: value})
    assert getattr(be, name) == before


def test_largest_count_is_accepted():
    with be.flags(benchmark_limit=2**63 - 1):
        assert be.benchmark_limit == 2**63 - 1


# ---------------------------------------------------------------------------
# EMBER_* environment variables

# Runs with the variable set. A CPU-only program first (import, seeding,
# arithmetic), then ember: availability, and the error of its first use.
PROBE = textwrap.dedent(
    """
    import json, warnings
    import torch
    torch.manual_seed(0)
    torch.seed()
    cpu = (torch.randn(4, 4) @ torch.ones(4, 4)).shape == (4, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        available = torch.ember.is_available()
    errors = {}
    for name, use in [
        ("empty", lambda: torch.empty(2, device="ember")),
        ("to", lambda: torch.ones(2).to("ember")),
        ("device_count", torch.ember.device_count),
        ("manual_seed", lambda: torch.ember.manual_seed(1)),
        ("memory_allocated", torch.ember.memory_allocated),
        ("empty_cache", torch.ember.empty_cache),
    ]:
        try:
            use()
            errors[name] = None
        except Exception as error:
            errors[name] = [type(error).__name__, str(error)]
    print(json.dumps({
        "cpu": cpu,
        "available": available,
        "warnings": [str(w.message) for w in caught],
        "errors": errors,
        "verbose": torch.backends.ember.get_verbose(),
        "fallback": torch.backends.ember.fallback,
        "cpu_parity": torch.backends.ember.cpu_parity,
    }))
    """
)

INVALID = [
    ("EMBER_VERBOSE", "7"),
    ("EMBER_VERBOSE", "abc"),
    ("EMBER_VERBOSE", "-1"),
    ("EMBER_FALLBACK", "bogus"),
    ("EMBER_FALLBACK", "Error"),
    ("EMBER_CPU_PARITY", "yes"),
    ("EMBER_CPU_PARITY", "2"),
    ("EMBER_STRICT", "true"),
    ("EMBER_DEBUG_HEAP", "on"),
    ("EMBER_ASYNC", "sometimes"),
    ("EMBER_ASYNC", "2"),
    ("EMBER_DEVICES", "0"),
    ("EMBER_DEVICES", "abc"),
    ("EMBER_DEVICES", "-1"),
    ("EMBER_DEVICES", "65"),
]
# Valid values: no error, and the setting takes effect.
VALID = [
    ("EMBER_VERBOSE", "2", ("verbose", 2)),
    ("EMBER_VERBOSE", "", ("verbose", 0)),  # empty = unset
    ("EMBER_FALLBACK", "warn", ("fallback", "warn")),
    ("EMBER_CPU_PARITY", "1", ("cpu_parity", True)),
    ("EMBER_CPU_PARITY", "0", ("cpu_parity", False)),
    ("EMBER_STRICT", "1", ("fallback", "error")),
]
_VARIABLES = {name for name, _ in INVALID}


def _environment(name: str, value: str, autoload: bool = True) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _VARIABLES}
    env["EMBER_DEVICES"] = "2"
    env[name] = value
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    if not autoload:
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    return env


@pytest.fixture(scope="module")
def probes():
    """Every (variable, value) probe, run concurrently once."""
    processes = {}
    for name, value in INVALID + [(n, v) for n, v, _ in VALID]:
        processes[name, value] = subprocess.Popen(
            [sys.executable, "-c", PROBE],
            env=_environment(name, value),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    results = {}
    for key, process in processes.items():
        stdout, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, f"{key}: import or CPU work failed:\n{stderr}"
        results[key] = json.loads(stdout)
    return results


def _expected_message(name: str, value: str) -> str:
    if name == "EMBER_DEVICES":
        return f"EMBER_DEVICES='{value}' is invalid: expected an integer between 1 and 64"
    if name in ("EMBER_VERBOSE", "EMBER_FALLBACK"):
        # The setter's own message (it raises before changing anything).
        parsed = int(value) if value.lstrip("-").isdigit() else value
        with pytest.raises(ValueError) as setter:
            if name == "EMBER_VERBOSE":
                be.verbose(parsed)
            else:
                be.fallback = parsed
        return f"{name}='{value}' is invalid: {setter.value}"
    setting = {
        "EMBER_CPU_PARITY": "cpu_parity",
        "EMBER_STRICT": "strict",
        "EMBER_DEBUG_HEAP": "heap checks",
        "EMBER_ASYNC": "async_execution",
    }[name]
    got = value if value.lstrip("-").isdigit() else f"'{value}'"
    return f"{name}='{value}' is invalid: {setting} must be 1 or 0 (True or False); got {got}"


@pytest.mark.parametrize(("name", "value"), INVALID)
def test_invalid_variable_keeps_torch_working_and_fails_at_first_ember_use(probes, name, value):
    probe = probes[name, value]
    assert probe["cpu"] is True
    expected = _expected_message(name, value)
    assert probe["available"] is False
    assert probe["warnings"] == [f"ember is not available: {expected}"]
    for use, error in probe["errors"].items():
        assert error == ["RuntimeError", expected], use


@pytest.mark.parametrize(("name", "value", "effect"), VALID)
def test_valid_variable_takes_effect(probes, name, value, effect):
    probe = probes[name, value]
    assert probe["available"] is True
    assert probe["warnings"] == []
    assert probe["errors"] == dict.fromkeys(probe["errors"])
    key, expected = effect
    assert probe[key] == expected


def test_every_invalid_variable_is_named_at_once(run_python):
    code = textwrap.dedent(
        """
        import torch
        try:
            torch.empty(1, device="ember")
        except RuntimeError as error:
            print(error)
        """
    )
    env = {"EMBER_DEVICES": "x", "EMBER_VERBOSE": "9", "EMBER_FALLBACK": "no"}
    result = run_python(code, env=env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert [line.split("=")[0] for line in lines] == [
        "EMBER_DEVICES",
        "EMBER_VERBOSE",
        "EMBER_FALLBACK",
    ]


def test_explicit_import_with_autoload_off_does_not_fail_either():
    code = (
        "import torch, torch_ember\nprint(torch.ones(2).sum().item(), torch.ember.is_available())"
    )
    result = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code],
        env=_environment("EMBER_DEVICES", "abc", autoload=False),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["2.0", "False"]
