"""Gather named device tensors into one buffer, cross to the host once, and split them again."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from trainguard.transfer import HostCopy, start_to_host, to_host


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
        packed, sizes = self._packed()
        return _split(to_host(packed), self._names, sizes)

    def start_fetch(self, finish: Finish | None = None) -> PendingPack:
        """The same transfer, started without waiting for the device; read it with
        `PendingPack.result()` (a step later, when the copy is long done), which hands the
        arrays by name to `finish` when given."""
        if not self._tensors:
            return PendingPack(None, [], [], finish)
        packed, sizes = self._packed()
        return PendingPack(start_to_host(packed), list(self._names), sizes, finish)

    def _packed(self) -> tuple[torch.Tensor, list[int]]:
        device = self.device if self.device is not None else self._tensors[0].device
        parts = [t if t.dtype == torch.float32 and t.device == device
                 else t.to(device=device, dtype=torch.float32) for t in self._tensors]
        return torch.cat(parts), [part.numel() for part in parts]


Finish = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


class PendingPack:
    """A pack's values on their way to the host."""

    def __init__(self, copy: HostCopy | None, names: list[str], sizes: list[int],
                 finish: Finish | None = None) -> None:
        self._copy, self._names, self._sizes, self._finish = copy, names, sizes, finish

    def result(self) -> dict[str, np.ndarray]:
        """Float64 arrays by name, as `DevicePack.fetch` returns them."""
        host = {} if self._copy is None else _split(self._copy.result(), self._names,
                                                    self._sizes)
        return host if self._finish is None else self._finish(host)


def _split(host: np.ndarray, names: list[str], sizes: list[int]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    offset = 0
    for name, size in zip(names, sizes, strict=True):
        out[name] = host[offset:offset + size]
        offset += size
    return out
