"""The one road from device to host.

Every value trainguard reads from an accelerator passes through here, once per step, as a single
packed tensor. Keeping it in one place makes the cost visible and lets tests count it.

    to_host        a blocking copy: the host waits for the device to reach it (one sync)
    start_to_host  a copy started without waiting, into pinned memory on an accelerator; its
                   `HostCopy.result()` is read a step later, when the device is long past it

`blocking_transfer_count()` counts the first kind only: the host synchronisations that stall a
training loop on an accelerator.

The other way, `to_device` carries a few host values (bias corrections from CPU step counts, a
CPU tensor's finite flag) to the device without a wait: a plain copy from pageable host memory to
an accelerator synchronises with it.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

_lock = threading.Lock()
_transfers = 0
_blocking = 0


def _count(blocking: bool) -> None:
    global _transfers, _blocking
    with _lock:
        _transfers += 1
        if blocking:
            _blocking += 1


def _as_float64(host: torch.Tensor) -> np.ndarray:
    if host.dtype not in (torch.float32, torch.float64):
        host = host.float()
    return host.numpy().astype(np.float64)  # float64 on the host: a NumPy cast, no kernel


def to_host(packed: torch.Tensor) -> np.ndarray:
    """Copy one packed 1-D tensor to the host as float64 (NaN and inf kept as they are)."""
    _count(blocking=True)
    if packed.requires_grad:  # a pack's cat of detached parts is not: no operator call for it
        packed = packed.detach()
    return _as_float64(packed.cpu())  # the copy (and, on an accelerator, the sync)


class HostCopy:
    """One packed 1-D tensor on its way to the host, read with `result()`."""

    def __init__(self, packed: torch.Tensor) -> None:
        packed = packed.detach()
        self._event: torch.cuda.Event | None = None
        if packed.device.type == "cuda":
            self._host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
            self._host.copy_(packed, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        elif packed.device.type == "cpu":
            self._host = packed  # already on the host (a fresh tensor: the pack's cat)
        else:  # other accelerators: a plain copy, which may wait
            self._host = packed.cpu()

    def ready(self) -> bool:
        """Whether `result()` would return at once."""
        return self._event is None or self._event.query()

    def result(self) -> np.ndarray:
        """The values as float64 (NaN and inf kept). Waits for the copy alone, not for the work
        queued after it."""
        if self._event is not None:
            self._event.synchronize()
        return _as_float64(self._host)


def start_to_host(packed: torch.Tensor) -> HostCopy:
    """Start copying one packed 1-D tensor to the host without waiting for the device. The
    tensor must not change afterwards (the pack's own `torch.cat` result)."""
    _count(blocking=packed.device.type not in ("cpu", "cuda"))
    return HostCopy(packed)


def transfer_count() -> int:
    """How many device-to-host transfers trainguard has made in this process."""
    return _transfers


def blocking_transfer_count() -> int:
    """How many of them made the host wait for the device (`to_host`)."""
    return _blocking


def to_device(values: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`values` on `device` without a host synchronisation: from a CPU tensor to an accelerator
    through pinned memory, copied asynchronously (PyTorch's pinned-memory cache keeps the block
    until the copy is done); any other move as `.to(device)`."""
    if values.device == device:
        return values
    if values.device.type == "cpu" and device.type == "cuda":
        return values.pin_memory().to(device, non_blocking=True)
    return values.to(device)
