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
        self._sizes: list[int] = []
        """The number of values of each name, in the order of `_names`."""
        self._tensors: list[torch.Tensor] = []

    def add(self, name: str, tensor: torch.Tensor) -> None:
        self._names.append(name)
        flat = _flat(tensor)
        self._sizes.append(flat.numel())
        self._tensors.append(flat)

    def __bool__(self) -> bool:
        return bool(self._tensors)

    def fetch(self) -> dict[str, np.ndarray]:
        """One device-to-host transfer for everything added; returns float64 arrays by name."""
        if not self._tensors:
            return {}
        return _split(to_host(self._packed()), self._names, self._sizes)

    def start_fetch(self, finish: Finish | None = None) -> PendingPack:
        """The same transfer, started without waiting for the device; read it with
        `PendingPack.result()` (a step later, when the copy is long done), which hands the
        arrays by name to `finish` when given."""
        if not self._tensors:
            return PendingPack(None, [], [], finish)
        return PendingPack(start_to_host(self._packed()), list(self._names),
                           list(self._sizes), finish)

    def _packed(self) -> torch.Tensor:
        device = self.device if self.device is not None else self._tensors[0].device
        parts = [t if t.dtype == torch.float32 and t.device == device
                 else t.to(device=device, dtype=torch.float32) for t in self._tensors]
        return torch.cat(parts)


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` as a 1-D tensor outside autograd; the common case (already so) is returned as
    it is, as detach and reshape would each cost an operator call (microseconds on the host,
    every step, for every segment) to make an alias of it."""
    if tensor.requires_grad:
        tensor = tensor.detach()
    return tensor if tensor.dim() == 1 else tensor.reshape(-1)


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
