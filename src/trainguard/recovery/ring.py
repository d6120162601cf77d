"""The good-state ring: the last K training states known to be healthy.

A state enters as a *candidate* right after the update of every `ring_every`-th step. It becomes
*good* only when (1) its weights and optimizer moments are all finite (a device flag read with
the next step's regular transfer: no extra sync) and (2) the `confirm_steps` steps that follow
it raise no event and skip nothing. A candidate that fails either test is dropped, so a poisoned
state is never kept as good.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import torch

from trainguard.recovery.state import SavedState


class GoodStateRing:
    def __init__(self, size: int, confirm_steps: int) -> None:
        self.size = size
        self.confirm_steps = confirm_steps
        self.good: deque[SavedState] = deque()
        self.candidate: SavedState | None = None
        self._spare: SavedState | None = None
        """A state that left the ring: its host buffers are reused by the next capture."""

    def __len__(self) -> int:
        return len(self.good)

    @property
    def spare(self) -> SavedState | None:
        return self._spare

    def offer(self, state: SavedState) -> None:
        """A new candidate replaces an unconfirmed one."""
        if self.candidate is not None:
            self._spare = self.candidate
        self.candidate = state

    def pending_flag(self) -> torch.Tensor | None:
        """The candidate's finite flag, to travel with the next step's transfer."""
        if self.candidate is not None and not self.candidate.verified:
            return self.candidate.finite
        return None

    def observe(self, *, flag: np.ndarray | None, calm: bool) -> SavedState | None:
        """Advance the candidate by one step; returns it when it has just become good."""
        state = self.candidate
        if state is None:
            return None
        if flag is not None and not state.verified:
            if not bool(np.all(flag == 1.0)):  # NaN-safe: NaN != 1
                self._drop_candidate()
                return None
            state.verified = True
        if state.finite is None:
            state.verified = True  # nothing floating to check
        if not calm:
            self._drop_candidate()
            return None
        state.calm_steps += 1
        if state.verified and state.calm_steps >= self.confirm_steps:
            self._promote(state)
            return state
        return None

    def promote_now(self, state: SavedState, *, finite: bool) -> bool:
        """Admit a state checked directly (the initial state); refuses a non-finite one."""
        if not finite:
            return False
        state.verified = True
        self._promote(state)
        return True

    def latest_before(self, step: int) -> SavedState | None:
        """The newest good state taken at or before `step`, else the oldest good state."""
        for state in reversed(self.good):
            if state.step <= step:
                return state
        return self.good[0] if self.good else None

    def discard_after(self, step: int) -> None:
        """Forget states newer than `step` (they belong to the trajectory being abandoned)."""
        while self.good and self.good[-1].step > step:
            self._spare = self.good.pop()
        if self.candidate is not None:
            self._drop_candidate()

    def _promote(self, state: SavedState) -> None:
        self.candidate = None
        state.finite = None  # the device flag is no longer needed
        self.good.append(state)
        while len(self.good) > self.size:
            self._spare = self.good.popleft()

    def _drop_candidate(self) -> None:
        self._spare = self.candidate
        self.candidate = None
