"""The torch.backends.ember switch surface: defaults, validation (unknown
names raise AttributeError with the closest name, bad values ValueError
naming the allowed ones), flags() setting several and restoring all of them
(also when the body raises, and nothing half-applied when a keyword or value
is bad), fp32_precision "none" following torch, and the fallback policy
(allow / warn / error, EMBER_STRICT and set_strict are "error").

The effects of precision, BLAS choice, autotuning and verbose logging on
kernels are tested in their own files (test_backends_matmul.py & co.)."""

import json
import os
import re
import warnings

import pytest
import torch
from isa import NATIVE_BF16

import torch_ember
import torch_ember.backends as ember_backends

be = ember_backends

# Every flags() keyword: (read current value, set value) through the public surface.
SWITCHES = {
    "async_execution": (
        lambda: be.async_execution,
        lambda v: setattr(be, "async_execution", v),
    ),
    "cpu_parity": (lambda: be.cpu_parity, lambda v: setattr(be, "cpu_parity", v)),
    "fuse_elementwise": (
        lambda: be.fuse_elementwise,
        lambda v: setattr(be, "fuse_elementwise", v),
    ),
    "packed_weights_limit": (
        lambda: be.packed_weights_limit,
        lambda v: setattr(be, "packed_weights_limit", v),
    ),
    "deterministic": (lambda: be.deterministic, lambda v: setattr(be, "deterministic", v)),
    "benchmark": (lambda: be.benchmark, lambda v: setattr(be, "benchmark", v)),
    "benchmark_limit": (lambda: be.benchmark_limit, lambda v: setattr(be, "benchmark_limit", v)),
    "fallback": (lambda: be.fallback, lambda v: setattr(be, "fallback", v)),
    "matmul_fp32_precision": (
        lambda: be.matmul.fp32_precision,
        lambda v: setattr(be.matmul, "fp32_precision", v),
    ),
    "conv_fp32_precision": (
        lambda: be.conv.fp32_precision,
        lambda v: setattr(be.conv, "fp32_precision", v),
    ),
    "blas_library": (be.preferred_blas_library, be.preferred_blas_library),
    "verbose": (be.get_verbose, be.verbose),
    "flash_sdp": (be.flash_sdp_enabled, be.enable_flash_sdp),
    "math_sdp": (be.math_sdp_enabled, be.enable_math_sdp),
}

DEFAULTS = {
    "async_execution": len(os.sched_getaffinity(0)) >= 2,
    "cpu_parity": False,
    "fuse_elementwise": True,
    "deterministic": False,
    "benchmark": False,
    "fallback": "allow",
    "matmul_fp32_precision": "none",
    "conv_fp32_precision": "none",
    "blas_library": "default",
    "verbose": 0,
    "flash_sdp": True,
    "math_sdp": True,
}

# A value of each switch other than its default (blas: a library this build has).
_OTHER_BLAS = next((b for b in be.available_blas_libraries() if b != "default"), "default")
CHANGED = {
    "async_execution": False,
    "cpu_parity": True,
    "fuse_elementwise": False,
    "packed_weights_limit": 12345,
    "deterministic": True,
    "benchmark": True,
    "benchmark_limit": 3,
    "fallback": "warn",
    "matmul_fp32_precision": "bf16",
    "conv_fp32_precision": "ieee",
    "blas_library": _OTHER_BLAS,
    "verbose": 1,
    "flash_sdp": False,
    "math_sdp": False,
}

# Invalid values per flags() keyword, with a pattern the error must contain.
_BOOL = r"True or False"
_COUNT = r"an int in \[0, 2\*\*63 - 1\]"
INVALID = {
    "cpu_parity": [("yes", _BOOL), (1, _BOOL)],
    "fuse_elementwise": [("no", _BOOL), (0, _BOOL)],
    "packed_weights_limit": [(-1, _COUNT), (True, _COUNT), (1.5, _COUNT), (2**70, _COUNT)],
    "deterministic": [("yes", _BOOL), (1, _BOOL), (None, _BOOL)],
    "benchmark": [("true", _BOOL), (0, _BOOL)],
    "benchmark_limit": [
        (-1, _COUNT),
        (True, _COUNT),
        (2.5, _COUNT),
        ("8", _COUNT),
        (2**63, _COUNT),
    ],
    "fallback": [("strict", r"'allow', 'warn', 'error'"), (True, r"'allow', 'warn', 'error'")],
    "matmul_fp32_precision": [
        ("tf32", r"'ieee', 'bf16', 'bf16x3', 'none'"),
        ("IEEE", r"'ieee', 'bf16', 'bf16x3', 'none'"),
        (None, r"'ieee', 'bf16', 'bf16x3', 'none'"),
    ],
    "conv_fp32_precision": [
        ("fp16", r"'ieee', 'bf16'"),
        ("bf16x3", r"'ieee', 'bf16'"),  # matmul only: no bf16 conv with an fp32 result
    ],
    "blas_library": [("cublas", r"'default'"), ("openblas", r"'default'")],
    "verbose": [(3, r"0, 1 or 2"), (-1, r"0, 1 or 2"), (True, r"0, 1 or 2"), ("1", r"0, 1 or 2")],
    "flash_sdp": [("on", _BOOL), (1, _BOOL)],
    "math_sdp": [(None, _BOOL)],
}


def _snapshot() -> dict:
    return {name: get() for name, (get, _) in SWITCHES.items()}


@pytest.fixture(autouse=True)
def _restore_all_flags():
    saved = _snapshot()
    precision = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(precision)
    for name, value in saved.items():
        SWITCHES[name][1](value)
    assert _snapshot() == saved


def test_surface_covers_every_flags_keyword():
    known = set(ember_backends._PROPERTIES) | set(ember_backends._FLAG_KEYWORDS)
    assert set(SWITCHES) == known


def test_defaults_in_a_fresh_process(run_python):
    code = (
        "import json, torch, torch_ember; be = torch.backends.ember; print(json.dumps({"
        "'async_execution': be.async_execution, 'cpu_parity': be.cpu_parity, "
        "'fuse_elementwise': be.fuse_elementwise, 'deterministic': be.deterministic, 'benchmark': be.benchmark, "
        "'benchmark_limit': be.benchmark_limit, 'fallback': be.fallback, "
        "'matmul_fp32_precision': be.matmul.fp32_precision, "
        "'conv_fp32_precision': be.conv.fp32_precision, "
        "'blas_library': be.preferred_blas_library(), 'verbose': be.get_verbose(), "
        "'flash_sdp': be.flash_sdp_enabled(), 'math_sdp': be.math_sdp_enabled()}))"
    )
    env = {
        "EMBER_STRICT": None,
        "EMBER_FALLBACK": None,
        "EMBER_VERBOSE": None,
        "EMBER_CPU_PARITY": None,
        "EMBER_FUSE_ELEMENTWISE": None,
        "EMBER_ASYNC": None,
        "EMBER_LAUNCH_BLOCKING": None,
    }
    result = run_python(code, env=env)
    assert result.returncode == 0, result.stderr
    defaults = json.loads(result.stdout)
    limit = defaults.pop("benchmark_limit")  # the autotuner's choice; any bound > 0
    assert isinstance(limit, int) and limit > 0
    assert defaults == DEFAULTS


def test_switches_are_module_properties():
    import torch.backends.ember as imported

    assert imported is torch.backends.ember is ember_backends
    for name in ("deterministic", "benchmark", "benchmark_limit", "fallback"):
        assert name in dir(torch.backends.ember)
    torch.backends.ember.benchmark = True
    assert torch.backends.ember.benchmark is True
    torch.backends.ember.benchmark_limit = 0  # 0 = unbounded
    assert torch.backends.ember.benchmark_limit == 0


@pytest.mark.parametrize("name", list(SWITCHES))
def test_every_value_round_trips(name):
    get, set_ = SWITCHES[name]
    values = {
        "fallback": ["allow", "warn", "error"],
        "matmul_fp32_precision": ["ieee", "bf16", "bf16x3", "none"],
        "conv_fp32_precision": ["ieee", "bf16", "none"],
        "blas_library": list(be.available_blas_libraries()),
        "verbose": [0, 1, 2],
        "benchmark_limit": [0, 1, 64],
        "packed_weights_limit": [0, 1024, 4 << 30],
    }.get(name, [True, False])
    for value in values:
        set_(value)
        assert get() == value


# -- flags() -----------------------------------------------------------------------


def test_flags_sets_every_switch_and_restores_all():
    before = _snapshot()
    with be.flags(**CHANGED):
        assert _snapshot() == CHANGED
    assert _snapshot() == before


def test_flags_restores_when_the_body_raises():
    before = _snapshot()
    with pytest.raises(KeyError), be.flags(deterministic=True, fallback="error", verbose=2):
        assert be.deterministic and be.fallback == "error" and be.get_verbose() == 2
        raise KeyError("body")
    assert _snapshot() == before


def test_flags_restores_what_the_body_changed_too():
    with be.flags(benchmark=True):
        be.benchmark = False
        be.benchmark_limit = 99  # not a keyword of this flags(): stays
    assert be.benchmark is False
    assert be.benchmark_limit == 99


def test_nested_flags_restore_level_by_level():
    with be.flags(matmul_fp32_precision="bf16", benchmark=True):
        with be.flags(matmul_fp32_precision="ieee"):
            assert be.matmul.fp32_precision == "ieee" and be.benchmark
        assert be.matmul.fp32_precision == "bf16"
    assert be.matmul.fp32_precision == "none" and not be.benchmark


def test_flags_without_keywords_changes_nothing():
    before = _snapshot()
    with be.flags():
        assert _snapshot() == before


@pytest.mark.parametrize(
    ("keyword", "suggestion"),
    [
        ("determinstic", "deterministic"),
        ("benchmark_limt", "benchmark_limit"),
        ("matmul_precision", "matmul_fp32_precision"),
        ("fallbak", "fallback"),
        ("flash", "flash_sdp"),
    ],
)
def test_flags_bad_keyword_raises_with_closest_name_and_applies_nothing(keyword, suggestion):
    before = _snapshot()
    settings = {"deterministic": True, keyword: True, "fallback": "error", "verbose": 2}
    message = f"'{keyword}'; did you mean '{suggestion}'"
    with pytest.raises(AttributeError, match=message), be.flags(**settings):
        pytest.fail("body must not run")
    assert _snapshot() == before


@pytest.mark.parametrize(
    ("keyword", "value", "allowed"),
    [(k, v, a) for k, cases in INVALID.items() for v, a in cases],
)
def test_flags_bad_value_raises_and_applies_nothing(keyword, value, allowed):
    before = _snapshot()
    # Valid changes on both sides of the bad one: the ones before are rolled back.
    valid = {k: v for k, v in CHANGED.items() if k != keyword}
    names = list(valid)
    settings = {n: valid[n] for n in names[:4]} | {keyword: value}
    settings |= {n: valid[n] for n in names[4:]}
    with pytest.raises(ValueError, match=allowed), be.flags(**settings):
        pytest.fail("body must not run")
    assert _snapshot() == before


# -- attribute names and values ----------------------------------------------------


@pytest.mark.parametrize(
    ("owner", "name", "suggestion"),
    [
        ("torch.backends.ember", "determinstic", "deterministic"),
        ("torch.backends.ember", "benchmak", "benchmark"),
        ("torch.backends.ember", "benchmark_limt", "benchmark_limit"),
        ("torch.backends.ember", "falback", "fallback"),
        ("torch.backends.ember", "prefered_blas_library", "preferred_blas_library"),
        ("torch.backends.ember", "matmull", "matmul"),
        ("torch.backends.ember.matmul", "fp32_precison", "fp32_precision"),
        ("torch.backends.ember.conv", "fp32_precission", "fp32_precision"),
    ],
)
def test_misspelled_get_and_set_raise_with_closest_name(owner, name, suggestion):
    target = {
        "torch.backends.ember": torch.backends.ember,
        "torch.backends.ember.matmul": torch.backends.ember.matmul,
        "torch.backends.ember.conv": torch.backends.ember.conv,
    }[owner]
    before = _snapshot()
    message = f"{re.escape(owner)} has no attribute '{name}'; did you mean '{suggestion}'"
    with pytest.raises(AttributeError, match=message):
        getattr(target, name)
    with pytest.raises(AttributeError, match=message):
        setattr(target, name, True)
    assert not hasattr(target, name)  # the set did not create it
    assert _snapshot() == before


def test_effective_precision_is_read_only():
    with pytest.raises(AttributeError, match="read-only"):
        be.matmul.effective_fp32_precision = "ieee"
    assert be.matmul.fp32_precision == "none"


@pytest.mark.parametrize(
    ("keyword", "value", "allowed"),
    [(k, v, a) for k, cases in INVALID.items() for v, a in cases],
)
def test_invalid_value_of_each_switch_raises_naming_allowed_values(keyword, value, allowed):
    before = _snapshot()
    with pytest.raises(ValueError, match=allowed):
        SWITCHES[keyword][1](value)
    assert _snapshot() == before


def test_blas_error_names_exactly_the_libraries_of_this_build():
    present = be.available_blas_libraries()
    assert present[0] == "default"
    assert ("mkl" in present) == torch.backends.mkl.is_available()
    assert ("onednn" in present) == torch.backends.mkldnn.is_available()
    with pytest.raises(ValueError) as error:
        be.preferred_blas_library("cublas")
    assert str(error.value) == (
        f"BLAS library must be one of {', '.join(map(repr, present))}; got 'cublas'"
    )


def test_verbose_applies_at_once_and_restores_in_a_with():
    with be.verbose(2) as context:
        assert isinstance(context, be.verbose)
        assert be.get_verbose() == 2
        with be.verbose(1):
            assert be.get_verbose() == 1
        assert be.get_verbose() == 2
    assert be.get_verbose() == 0
    be.verbose(1)  # without `with`: stays on
    assert be.get_verbose() == 1


# -- fp32 precision "none" follows torch ------------------------------------------


def test_matmul_none_follows_torch_float32_matmul_precision():
    switch = be.matmul
    switch.fp32_precision = "none"
    # "high" is bf16x3 where that beats ieee on this CPU.
    # "medium" computes in bf16 only where the CPU has bf16 arithmetic.
    medium = {"bf16"} if NATIVE_BF16 else {"ieee"}
    expected = {"highest": {"ieee"}, "medium": medium, "high": {"bf16x3", "ieee"}}
    for torch_precision, allowed in expected.items():
        torch.set_float32_matmul_precision(torch_precision)
        assert switch.effective_fp32_precision in allowed, torch_precision
    # An explicit setting wins over torch's.
    for explicit in ("ieee", "bf16", "bf16x3"):
        switch.fp32_precision = explicit
        for torch_precision in expected:
            torch.set_float32_matmul_precision(torch_precision)
            assert switch.effective_fp32_precision == explicit


@pytest.fixture
def _torch_conv_precision():
    """torch's own fp32 precision settings, restored after the test."""
    saved = (
        torch.backends.fp32_precision,
        torch.backends.mkldnn.fp32_precision,
        torch.backends.mkldnn.conv.fp32_precision,
    )
    yield
    torch.backends.mkldnn.conv.fp32_precision = saved[2]
    torch.backends.mkldnn.fp32_precision = saved[1]
    torch.backends.fp32_precision = saved[0]


def test_conv_none_follows_what_cpu_convolutions_follow(_torch_conv_precision):
    be.conv.fp32_precision = "none"
    bf16 = "bf16" if NATIVE_BF16 else "ieee"
    # set_float32_matmul_precision leaves CPU's convolutions in fp32, and ember's.
    for torch_precision in ("highest", "high", "medium"):
        torch.set_float32_matmul_precision(torch_precision)
        assert be.conv.effective_fp32_precision == "ieee", torch_precision
    # CPU's convolutions follow torch.backends.mkldnn.conv, then mkldnn, then the
    # generic setting: so does ember's "none".
    torch.backends.mkldnn.conv.fp32_precision = "bf16"
    assert be.conv.effective_fp32_precision == bf16
    torch.backends.mkldnn.conv.fp32_precision = "none"
    torch.backends.mkldnn.fp32_precision = "bf16"
    assert be.conv.effective_fp32_precision == bf16
    torch.backends.mkldnn.fp32_precision = "none"
    torch.backends.fp32_precision = "bf16"
    assert be.conv.effective_fp32_precision == bf16
    torch.backends.fp32_precision = "ieee"
    assert be.conv.effective_fp32_precision == "ieee"
    # An explicit setting wins over torch's.
    for explicit in ("ieee", "bf16"):
        be.conv.fp32_precision = explicit
        for torch_conv in ("bf16", "ieee"):
            torch.backends.mkldnn.conv.fp32_precision = torch_conv
            assert be.conv.effective_fp32_precision == explicit


def test_conv_under_medium_matmul_precision_stays_fp32(_torch_conv_precision):
    # "medium" is a matmul permission (as on CUDA, where cuDNN's convolutions
    # have their own switch): ember's convolution keeps fp32 (bf16 operands
    # would be ~1e-3 off, not ~1e-7). CPU's oneDNN convolutions keep fp32 too;
    # the shapes CPU runs as im2col + GEMM take the GEMM's bf16, and so do
    # ember's convolutions delegated to CPU's kernel.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 256, 14, 14, generator=g)  # a 1x1 ResNet layer: ember's route
    w = torch.randn(64, 256, 1, 1, generator=g)
    reference = torch.nn.functional.conv2d(x.double(), w.double())
    torch.set_float32_matmul_precision("medium")
    xe, we = x.to("ember"), w.to("ember")
    for _ in range(2):  # the first call and the packed one
        out = torch.nn.functional.conv2d(xe, we).cpu()
        assert (out.double() - reference).abs().max() / reference.abs().max() < 1e-5


def test_matmul_and_conv_are_independent():
    be.matmul.fp32_precision = "bf16"
    assert be.conv.fp32_precision == "none"
    assert be.conv.effective_fp32_precision == "ieee"  # torch default "highest"
    assert be.matmul.effective_fp32_precision == "bf16"


# -- fallback policy ---------------------------------------------------------------

# A CPU kernel that returns a buffer made before the op ran: ember can only
# copy it (the case the fallback policy governs; see tests/test_ops.py).
_FOREIGN = torch.arange(8.0)
_LIB = torch.library.Library("ember_flags_test", "DEF")
_LIB.define("foreign_buffer(Tensor x) -> Tensor")
_LIB.impl("foreign_buffer", lambda x: _FOREIGN, "CPU")
OP = "ember_flags_test::foreign_buffer"


def _copying_op() -> torch.Tensor:
    return torch.ops.ember_flags_test.foreign_buffer(torch.ones(2, device="ember"))


def test_allow_copies_and_counts():
    torch_ember.reset_fallback_stats()
    be.fallback = "allow"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = _copying_op()
    assert result.device.type == "ember"
    assert torch.equal(result.cpu(), _FOREIGN)
    assert torch_ember.fallback_stats()[OP] == {"copies": 1, "bytes": 32}


def test_warn_warns_naming_the_op_and_still_copies(capfd):
    torch_ember.reset_fallback_stats()
    be.fallback = "warn"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = _copying_op()
    assert torch.equal(result.cpu(), _FOREIGN)
    assert torch_ember.fallback_stats()[OP]["copies"] == 1
    # A torch.ops call has no Python warning handler, so c10 prints the
    # warning to stderr; through a torch.* binding it is a UserWarning.
    message = f"ember: {OP} copied its result (32 bytes)"
    python_warnings = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert any(message in w for w in python_warnings) or message in capfd.readouterr().err


def test_error_raises_naming_the_op_and_the_switch():
    torch_ember.reset_fallback_stats()
    be.fallback = "error"
    with pytest.raises(RuntimeError, match=re.escape(OP)) as error:
        _copying_op()
    assert "torch.backends.ember.fallback" in str(error.value)
    assert OP not in torch_ember.fallback_stats()
    be.fallback = "allow"
    _copying_op()  # allowed again


def test_flags_fallback_error_applies_only_inside():
    with be.flags(fallback="error"), pytest.raises(RuntimeError, match=re.escape(OP)):
        _copying_op()
    assert torch.equal(_copying_op().cpu(), _FOREIGN)


def test_set_strict_is_the_error_policy():
    be.fallback = "allow"
    torch_ember.set_strict(True)
    assert be.fallback == "error" and torch_ember.is_strict()
    with pytest.raises(RuntimeError, match=re.escape(OP)):
        _copying_op()
    torch_ember.set_strict(False)
    assert be.fallback == "allow" and not torch_ember.is_strict()
    be.fallback = "error"
    assert torch_ember.is_strict()
    be.fallback = "warn"
    assert not torch_ember.is_strict()


def test_zero_copy_ops_run_under_the_error_policy():
    be.fallback = "error"
    x = torch.arange(12.0, device="ember").view(3, 4)
    assert torch.equal((x @ x.T + 1).softmax(1).cpu(), (x.cpu() @ x.cpu().T + 1).softmax(1))


@pytest.mark.parametrize(
    ("env", "policy"),
    [
        ({"EMBER_FALLBACK": "warn"}, "warn"),
        ({"EMBER_FALLBACK": "error"}, "error"),
        ({"EMBER_STRICT": "1"}, "error"),
        ({"EMBER_STRICT": "1", "EMBER_FALLBACK": "warn"}, "error"),
        ({"EMBER_STRICT": "0"}, "allow"),
    ],
)
def test_policy_from_environment(run_python, env, policy):
    code = "import torch, torch_ember; print(torch.backends.ember.fallback)"
    full_env = {"EMBER_STRICT": None, "EMBER_FALLBACK": None} | env
    result = run_python(code, env=full_env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == policy
