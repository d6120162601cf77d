"""Random number generator states, taken and put back: the one place that knows which
generators there are.

Two scopes. `torch_state` is torch's own generators (the CPU one and every initialised CUDA
device's, host-side copies, no device sync): what dropout and the other random layers draw from,
all a replayed forward needs to draw the masks its step drew. `process_state` adds Python's
`random` and NumPy's global generator, in plain tensors and numbers (a crash snapshot loads it
with `weights_only=True`): what a rollback or a snapshot puts back when it restores the whole
process's randomness.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

TorchRNG = tuple[torch.Tensor, list[torch.Tensor] | None]
"""The CPU generator's state and each CUDA device's (None when CUDA is not initialised)."""


def _cuda_ready() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def torch_state() -> TorchRNG:
    return torch.get_rng_state(), torch.cuda.get_rng_state_all() if _cuda_ready() else None


def put_torch_state(state: TorchRNG) -> None:
    cpu, cuda = state
    torch.set_rng_state(cpu)
    if cuda is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)


def process_state() -> dict[str, Any]:
    cpu, cuda = torch_state()
    version, internal, gauss = random.getstate()
    np_state: Any = np.random.get_state()
    state: dict[str, Any] = {
        "torch": cpu,
        "python": (version, tuple(internal), gauss),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
    }
    if cuda is not None:
        state["cuda"] = cuda
    return state


def put_process_state(state: Mapping[str, Any]) -> None:
    put_torch_state((state["torch"], state.get("cuda")))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_state = state["numpy"]
    np.random.set_state(("MT19937", np_state["keys"].numpy().astype(np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["cached_gaussian"]))
