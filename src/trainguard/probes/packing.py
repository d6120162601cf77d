"""Gather named device tensors into one buffer, cross to the host once, and split them again."""

from __future__ import annotations

import numpy as np
import torch

from trainguard.transfer import to_host


class DevicePack:
    """Named 1-D float segments that travel to the host together in a single transfer."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device
        """Where the segments are gathered (the model's device): one copy from there to the host."""
        self._names: list[str] = []
        self._tensors: list[torch.Tensor] = []

    def add(self, name: str, tensor: torch.Tensor) -> None:
        self._names.append(name)
        self._tensors.append(tensor.detach().reshape(-1))

    def __bool__(self) -> bool:
        return bool(self._tensors)

    def fetch(self) -> dict[str, np.ndarray]:
        """One device-to-host transfer for everything added; returns float64 arrays by name."""
        if not self._tensors:
            return {}
        device = self.device if self.device is not None else self._tensors[0].device
        parts = [t if t.dtype == torch.float32 and t.device == device
                 else t.to(device=device, dtype=torch.float32) for t in self._tensors]
        host = to_host(torch.cat(parts))
        out: dict[str, np.ndarray] = {}
        offset = 0
        for name, part in zip(self._names, parts, strict=True):
            size = part.numel()
            out[name] = host[offset:offset + size]
            offset += size
        return out
