"""Loading PyTorch's OpInfo and ModuleInfo databases (and user-supplied extra ops).

``torch.testing._internal.common_utils`` imports ``expecttest`` only to use
``expecttest.TestCase`` as a base class; the conformance kit never runs those
test cases, so when the package is absent a stand-in module is installed.
"""

from __future__ import annotations

import importlib.util
import sys
import types
import unittest


def _ensure_expecttest() -> None:
    try:
        import expecttest  # noqa: F401
    except ModuleNotFoundError:
        stub = types.ModuleType("expecttest")
        stub.TestCase = unittest.TestCase
        stub.ACCEPT = False
        sys.modules["expecttest"] = stub


def op_db() -> list:
    _ensure_expecttest()
    from torch.testing._internal.common_methods_invocations import op_db as database

    return list(database)


def module_db() -> list:
    _ensure_expecttest()
    from torch.testing._internal.common_modules import module_db as database

    return list(database)


def load_extra_ops(path: str) -> list:
    """OpInfos defined by a Python file as a module-level list ``op_db``."""
    _ensure_expecttest()
    spec = importlib.util.spec_from_file_location("_conformance_extra_ops", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot load extra ops from {path!r}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.op_db)


def module_name(info) -> str:
    return info.name
