"""This rank's part of a sharded (DTensor) parameter, for probes that read tensors directly."""

from __future__ import annotations

import torch


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor (sharing its storage); any other tensor as it is."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if to_local is not None else tensor
