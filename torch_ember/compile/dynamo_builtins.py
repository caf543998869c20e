"""Builtins for the helpers Dynamo's compiled code calls on every call.

Each call of a compiled frame (torch 2.13) runs some pre-graph bytecode
before its graph. Where an accelerator is registered, that bytecode records
the current stream: ``store_user_object_weakrefs(get_current_stream(
torch.device("ember", 0)))``; and with ``torch._dynamo.config.
record_runtime_overhead`` (on by default) it brackets itself with
``record_pregraph_bytecode_enter()`` / ``record_pregraph_bytecode_exit(cm)``
(a profiler range while the profiler is on). Each helper is a Python
function, entered through Dynamo's frame hook at every call. On the 2-core
Zen 3 host a compiled ``x + 0`` on CPU tensors cost 37.9 us a call with
ember registered and 25.8 us with no accelerator; of a no-work backend's
call of the batch-1 MLP module (38.0 us), the weakref store took 4.8 us, the
stream lookup 1.0 and the two profiler hooks 4.9 (rounds no-op'ing each in
turn, 2026-12-07).

``install()`` puts builtins (``csrc/python/DynamoBuiltins.cpp``,
``_current_stream_of`` in ``csrc/python/CompiledKernelBindings.cpp``) where
the generated code looks these helpers up, each doing what torch's does:

* ``get_current_stream``: ``torch.accelerator.current_stream(device)`` for
  ember devices (the ones Dynamo asks about); another device raises the
  ValueError torch's raises where ember is the accelerator;
* ``store_user_object_weakrefs``: the same weak references in the same
  registry dict;
* ``record_pregraph_bytecode_enter`` / ``_exit``: torch's own functions
  while ``torch.autograd.profiler._is_profiler_enabled`` (the "Pregraph
  bytecode" range is recorded as before), nothing otherwise.

The profiler hooks cost every compiled frame, ember's or not; the two
others exist because an accelerator is registered.
"""

from __future__ import annotations

import sys

import torch

import torch_ember._C

# (module, name) -> the builtin installed there
_installed: dict[tuple[str, str], object] = {}


def _builtins() -> list[tuple[object, str, object, tuple[str, ...]]]:
    """(module, name, builtin maker taking torch's function, modules that
    imported the name) for each helper."""
    from torch._dynamo import graph_bytecode_inputs, utils

    registry = graph_bytecode_inputs.index_to_external_object_weakref
    profiler = torch.autograd.profiler
    return [
        (
            utils,
            "get_current_stream",
            lambda original: torch_ember._C._current_stream_of,
            ("torch._dynamo.guards",),
        ),
        (
            graph_bytecode_inputs,
            "store_user_object_weakrefs",
            lambda original: torch_ember._C._dynamo_weakref_store(registry),
            (),
        ),
        (
            utils,
            "record_pregraph_bytecode_enter",
            lambda original: torch_ember._C._dynamo_pregraph_enter(profiler, original),
            (),
        ),
        (
            utils,
            "record_pregraph_bytecode_exit",
            torch_ember._C._dynamo_pregraph_exit,
            (),
        ),
    ]


def installed() -> bool:
    """Whether every builtin is where Dynamo's generated code looks it up."""
    return all(
        getattr(module, name) is _installed.get((module.__name__, name))
        for module, name, _, _ in _builtins()
    )


def install() -> None:
    """Installs the builtins, where ember is the accelerator. Idempotent."""
    accelerator = torch.accelerator.current_accelerator()
    if accelerator is None or accelerator.type != "ember":
        return
    for module, name, make, also in _builtins():
        original = getattr(module, name)
        if original is _installed.get((module.__name__, name)):
            continue
        builtin = make(original)
        setattr(module, name, builtin)
        _installed[(module.__name__, name)] = builtin
        # Modules that imported the name; a module loaded later imports ours.
        for other in also:
            loaded = sys.modules.get(other)
            if loaded is not None and getattr(loaded, name, None) is original:
                setattr(loaded, name, builtin)
