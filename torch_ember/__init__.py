"""ember: a PyTorch accelerator backend whose device runtime is ours.

Importing this package (which ``import torch`` does through the
``torch.backends`` entry point) loads the C++ core, renames PyTorch's
PrivateUse1 backend to ``ember`` and registers ``torch.ember``::

    import torch
    model = model.to("ember")
"""


def _autoload() -> None:
    """Entry point of the ``torch.backends`` group; importing did the work.

    Defined before ``import torch``: when this package is imported first,
    torch's own import calls this hook while the package is still loading.
    """


import atexit

import torch

from torch_ember import _C

_C._initialize()  # an invalid EMBER_* value is raised at first use, not here


def _drain_autograd_at_exit() -> None:
    """Lets autograd's ember device threads finish releasing a last backward
    before the interpreter finalizes (see csrc/python/Module.cpp)."""
    try:
        _C._drain_autograd_device_threads()
    except RuntimeError:
        pass  # e.g. a forked child, where autograd refuses to start threads


atexit.register(_drain_autograd_at_exit)

if torch._C._get_privateuse1_backend_name() != "ember":
    torch.utils.rename_privateuse1_backend("ember")

from torch_ember import ember as _device_module

torch._register_device_module("ember", _device_module)
torch.utils.generate_methods_for_privateuse1_backend(
    for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
)

__version__ = "0.1.0"

# torch.backends.ember: the configuration surface (torch_ember/backends).
import sys as _sys

from torch_ember import backends as _backends

torch.backends.ember = _backends
_sys.modules["torch.backends.ember"] = _backends


def fallback_stats() -> dict[str, dict[str, int]]:
    """Ops whose results had to be copied rather than used in place.

    Returns ``{op_name: {"copies": n, "bytes": b}}``. Empty when every op ran
    zero-copy. ``EMBER_STRICT=1`` (or :func:`set_strict`) turns such a copy
    into an error naming the op.
    """
    return _C.fallback_stats()


def reset_fallback_stats() -> None:
    _C.reset_fallback_stats()


def launch_stats() -> dict[str, dict[str, int]]:
    """What the execution engine did per op since the last reset.

    Returns ``{op_name: {"launched": n, "waited": w}}``: ``launched`` counts
    calls queued on their stream and returned at once (asynchronous
    execution); ``waited`` counts synchronous calls that found work queued
    on their stream and waited for it first -- the places where the engine
    still drains its queue. See docs/engine.md.
    """
    return _C.launch_stats()


def reset_launch_stats() -> None:
    _C.reset_launch_stats()


def chain_stats() -> dict[str, int]:
    """What elementwise chains did since the last reset.

    ``torch.backends.ember.fuse_elementwise`` (on by default) holds ember's
    fp32 elementwise ops over the same elements on their stream and runs
    them as one pass when the stream is next used. Returns ``{"chains": c,
    "steps": s, "written": w, "skipped": k, ...}``: chains run, steps
    computed, step results written to memory (someone still held them), and
    steps skipped (no one held the result and no later step read it). The
    same switch holds a 1x1 convolution for the batch norm, residual add and
    ReLU that follow it (applied to each output block while in cache):
    ``"convolutions"`` run with such steps, ``"epilogue_steps"`` applied and
    ``"epilogue_written"`` results written to memory (the product's
    included). See docs/engine.md, "Held work and elementwise chains".
    """
    return _C.chain_stats()


def reset_chain_stats() -> None:
    _C.reset_chain_stats()


def set_strict(strict: bool) -> None:
    """Make a copying fallback an error (same as ``EMBER_STRICT=1``)."""
    _C.set_strict_mode(bool(strict))


def is_strict() -> bool:
    return _C.strict_mode()


__all__ = [
    "chain_stats",
    "fallback_stats",
    "is_strict",
    "launch_stats",
    "reset_chain_stats",
    "reset_fallback_stats",
    "reset_launch_stats",
    "set_strict",
]

# --------------------------------------------------------------------------- torch.compile
# Registers ember with Dynamo (device interface) and Inductor (C++ kernels on ember
# memory) when PyTorch first imports them; costs nothing until then. See
# torch_ember/compile/__init__.py and docs/compile.md.
from torch_ember import compile as _compile

_compile.register(lazy=True)

# Defaults PyTorch keys by device type: ember takes CPU's (torch_ember/cpu_defaults.py).
from torch_ember import cpu_defaults as _cpu_defaults

_cpu_defaults.register()

# torch.distributed: the "ember" c10d backend (gloo on zero-copy CPU aliases).
from torch_ember import distributed as _distributed

_distributed.register()
