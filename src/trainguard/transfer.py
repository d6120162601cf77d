"""The one road from device to host.

Every value trainguard reads from an accelerator passes through `to_host`, once per step, as a
single packed tensor. Keeping it in one place makes the cost visible and lets tests count it.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

_lock = threading.Lock()
_transfers = 0


def to_host(packed: torch.Tensor) -> np.ndarray:
    """Copy one packed 1-D tensor to the host as float64 (NaN and inf kept as they are)."""
    global _transfers
    with _lock:
        _transfers += 1
    host = packed.detach().cpu()  # the one copy (and, on an accelerator, the one sync)
    if host.dtype not in (torch.float32, torch.float64):
        host = host.float()
    return host.numpy().astype(np.float64)  # float64 on the host: a NumPy cast, no kernel


def transfer_count() -> int:
    """How many device-to-host transfers trainguard has made in this process."""
    return _transfers
