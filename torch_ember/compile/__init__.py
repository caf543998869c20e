"""torch.compile for ember: Dynamo's device interface, Inductor's backend, ``backend="ember"``.

ember memory is host memory, so Inductor's C++/OpenMP CPU kernels run on
ember tensors' pointers unchanged. What ember adds is the glue: a Dynamo
device interface (``device_interface.py``), an Inductor backend for the
device type ``"ember"`` -- C++ scheduling, a Python wrapper that allocates
on ember, device op overrides (``inductor_backend.py``) -- the few places
where Inductor hard-codes ``device.type == "cpu"`` (``cpu_parity.py``), and
the named backend with ember's graph passes (``backend.py``, ``passes/``).

``import torch_ember`` calls :func:`register` with ``lazy=True``: nothing of
Dynamo or Inductor is imported then (importing Dynamo alone costs ~0.7 s);
an import hook registers each part when PyTorch first loads the module that
owns its registry::

    model = torch.compile(model.to("ember"))            # default Inductor
    model = torch.compile(model, backend="ember")       # ember's passes
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading
import warnings
from collections.abc import Callable

__all__ = ["is_registered", "register"]

# module whose loading creates the registry -> what registers ember in it
_DYNAMO_MODULE = "torch._dynamo.device_interface"
_INDUCTOR_MODULE = "torch._inductor.compile_fx"

_lock = threading.Lock()
_done: set[str] = set()


def _register_device_interface() -> None:
    from torch_ember.compile.device_interface import register_device_interface

    register_device_interface()


def _register_inductor_backend() -> None:
    from torch_ember.compile.inductor_backend import register_inductor_backend

    register_inductor_backend()


_REGISTRARS: dict[str, Callable[[], None]] = {
    _DYNAMO_MODULE: _register_device_interface,
    _INDUCTOR_MODULE: _register_inductor_backend,
}


def _run(module: str) -> None:
    with _lock:
        if module in _done:
            return
        _done.add(module)
    try:
        _REGISTRARS[module]()
    except BaseException:
        _done.discard(module)  # register() retries, and raises
        raise


class _AfterImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs ember's registration right after PyTorch executes a watched module.

    Finds the module's real spec, swaps in itself as the loader, executes the
    module with the real loader, then registers. Removes itself once every
    watched module has loaded.
    """

    def __init__(self, modules: set[str]):
        self.pending = set(modules)
        self.loaders: dict[str, importlib.abc.Loader] = {}

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.pending:
            return None
        self.pending.discard(fullname)  # the nested find_spec below must not find us
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        self.loaders[fullname] = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self.loaders[spec.name].create_module(spec)

    def exec_module(self, module) -> None:
        name = module.__spec__.name
        loader = self.loaders.pop(name)
        module.__spec__.loader = module.__loader__ = loader
        loader.exec_module(module)
        if not self.pending and self in sys.meta_path:
            sys.meta_path.remove(self)
        try:
            _run(name)
        except Exception as e:  # noqa: BLE001 - never break PyTorch's own import
            warnings.warn(
                f"torch_ember: registering ember with {name} failed ({type(e).__name__}: {e}); "
                "torch.compile on ember is unavailable, torch_ember.compile.register() "
                "shows the error",
                stacklevel=2,
            )


def register(lazy: bool = False) -> None:
    """Registers ember with Dynamo and Inductor (idempotent).

    ``lazy=True`` (what ``import torch_ember`` does) registers each part when
    PyTorch first imports its module, or now if it already has. ``lazy=False``
    imports Dynamo and Inductor and registers now.
    """
    if not lazy:
        for module in _REGISTRARS:
            _run(module)
        return
    waiting = set()
    for module in _REGISTRARS:
        if module in sys.modules:
            _run(module)
        else:
            waiting.add(module)
    if waiting and not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(waiting))


def is_registered() -> dict[str, bool]:
    """Which parts are registered: ``{"dynamo": bool, "inductor": bool}``."""
    return {"dynamo": _DYNAMO_MODULE in _done, "inductor": _INDUCTOR_MODULE in _done}
