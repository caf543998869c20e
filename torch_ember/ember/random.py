"""Random number generation on ember devices (one generator per device)."""

from typing import Any

import torch

from torch_ember import _C
from torch_ember.ember._utils import _device_index

default_generators: tuple[torch.Generator, ...] = tuple(
    _C.default_generator(i) for i in range(_C.device_count())
)


def _generator(device: Any) -> torch.Generator:
    return default_generators[_device_index(device, optional=True)]


def get_rng_state(device: Any = "ember") -> torch.Tensor:
    return _generator(device).get_state()


def get_rng_state_all() -> list[torch.Tensor]:
    return [g.get_state() for g in default_generators]


def set_rng_state(new_state: torch.Tensor, device: Any = "ember") -> None:
    _generator(device).set_state(new_state.cpu())


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    for generator, state in zip(default_generators, new_states, strict=True):
        generator.set_state(state.cpu())


def manual_seed(seed: int) -> None:
    """Seeds the current ember device's generator."""
    _generator(None).manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for generator in default_generators:
        generator.manual_seed(int(seed))


def seed() -> None:
    """Seeds the current device's generator with a non-deterministic number."""
    _generator(None).seed()


def seed_all() -> None:
    for generator in default_generators:
        generator.seed()


def initial_seed() -> int:
    return _generator(None).initial_seed()
