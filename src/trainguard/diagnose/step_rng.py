"""The RNG state each training forward starts from, so that a replay of the step draws the same
dropout masks as the step did.

A replay puts the RNG back before every forward it runs; without this, it would put back the RNG
as it stood when the proof began, after the step's own forward had drawn from it: the replay's
dropout masks would be other than the step's, and its loss not the loss the step had. A forward
pre-hook on the model takes the state (the CPU generator's and every initialised CUDA device's:
host-side copies, no device sync) before each training forward; the step keeps the last one
(`StepContext.forward_rng`), as the output probes keep the last forward of a step; a crash
snapshot stores it as its RNG. Kept only when the run can prove (a `replay_fn`, `prove` not "off")
or halts. Python's `random` is not taken: dropout and
the other random layers draw from torch's generators.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from trainguard.rng import TorchRNG, torch_state

log = logging.getLogger("trainguard")

class StepRNG:
    """A forward pre-hook on the model for the life of the run (`close` removes it)."""

    def __init__(self, model: nn.Module) -> None:
        self._state: TorchRNG | None = None
        self._handle: torch.utils.hooks.RemovableHandle | None = (
            model.register_forward_pre_hook(self._hook))

    def _hook(self, module: nn.Module, args: Any) -> None:
        if not module.training:
            return
        try:
            self._state = torch_state()
        except Exception as exc:  # never break the user's forward pass
            self._state = None
            log.debug("trainguard: the step's RNG state was not kept (%s)", exc)

    def take(self) -> TorchRNG | None:
        """The state the last training forward since the last call started from (None: none)."""
        state, self._state = self._state, None
        return state

    @contextmanager
    def kept(self) -> Iterator[None]:
        """The forwards inside (a proof's replays) leave the kept state as it was."""
        state = self._state
        try:
            yield
        finally:
            self._state = state

    def close(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self._state = None
