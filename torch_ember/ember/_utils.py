from typing import Any

import torch

from torch_ember import _C


def _device_index(device: Any, optional: bool = False) -> int:
    """Index of an ember device given as int, "ember:N", torch.device or None."""
    if device is None:
        if optional:
            return _C.current_device()
        raise ValueError("Expected an ember device, got None")
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        if device.type != "ember":
            raise ValueError(f"Expected an ember device, got {device}")
        if device.index is None:
            return _C.current_device() if optional else 0
        return device.index
    raise TypeError(f"Expected an ember device (int, str or torch.device), got {device!r}")
