"""Random number generation on ember devices (one generator per device)."""

from typing import Any

import torch

from torch_ember import _C
from torch_ember.ember._utils import _device_index

_default_generators: tuple[torch.Generator, ...] | None = None


def _generators() -> tuple[torch.Generator, ...]:
    """One generator per device, made on first use: an invalid EMBER_*
    setting raises here, at the first use of ember, never at import."""
    global _default_generators
    if _default_generators is None:
        _default_generators = tuple(_C.default_generator(i) for i in range(_C.device_count()))
    return _default_generators


def __getattr__(name: str) -> Any:
    if name == "default_generators":
        return _generators()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _generator(device: Any) -> torch.Generator:
    return _generators()[_device_index(device, optional=True)]


def get_rng_state(device: Any = "ember") -> torch.Tensor:
    return _generator(device).get_state()


def get_rng_state_all() -> list[torch.Tensor]:
    return [g.get_state() for g in _generators()]


def set_rng_state(new_state: torch.Tensor, device: Any = "ember") -> None:
    _generator(device).set_state(new_state.cpu())


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    for generator, state in zip(_generators(), new_states, strict=True):
        generator.set_state(state.cpu())


def manual_seed(seed: int) -> None:
    """Seeds the current ember device's generator."""
    _generator(None).manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    # torch.manual_seed and torch.seed call this for every program: with an
    # invalid EMBER_* setting no ember device can ever run, so there is
    # nothing to seed and a CPU-only program must not fail here.
    if _C._configuration_error() is not None:
        return
    for generator in _generators():
        generator.manual_seed(int(seed))


def seed() -> None:
    """Seeds the current device's generator with a non-deterministic number."""
    _generator(None).seed()


def seed_all() -> None:
    if _C._configuration_error() is not None:
        return  # as manual_seed_all
    for generator in _generators():
        generator.seed()


def initial_seed() -> int:
    return _generator(None).initial_seed()
