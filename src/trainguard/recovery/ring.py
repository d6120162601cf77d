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
        self.pinned: SavedState | None = None
        """A good state kept past its turn (`pin`): it does not count against `size`."""

    def __len__(self) -> int:
        return len(self.good)

    def take_spare(self) -> SavedState | None:
        """A state whose host buffers the next capture may overwrite, handed out once: the
        capture that reuses them becomes a candidate, and must not be written over again."""
        spare, self._spare = self._spare, None
        return spare

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

    def pin(self, state: SavedState | None) -> None:
        """Keep `state` (one of the good states) when newer states would push it out; the state
        pinned before goes back to its turn. None: nothing is pinned."""
        self.pinned = state
        self._evict()

    def latest_before(self, step: int) -> SavedState | None:
        """The newest good state taken at or before `step`, else the oldest good state."""
        for state in reversed(self.good):
            if state.step <= step:
                return state
        return self.good[0] if self.good else None

    def discard_after(self, step: int) -> None:
        """Forget states newer than `step` (they belong to the trajectory being abandoned)."""
        while self.good and self.good[-1].step > step:
            if self.good[-1] is self.pinned:
                self.pinned = None
            self._spare = self.good.pop()
        if self.candidate is not None:
            self._drop_candidate()

    def _promote(self, state: SavedState) -> None:
        self.candidate = None
        state.finite = None  # the device flag is no longer needed
        self.good.append(state)
        self._evict()

    def _evict(self) -> None:
        """The oldest states past `size`, the pinned one aside, leave (their buffers are spare)."""
        pinned = any(s is self.pinned for s in self.good)
        while len(self.good) > self.size + pinned:
            at = 1 if self.good[0] is self.pinned else 0
            self._spare = self.good[at]
            del self.good[at]  # by place: states compare by their tensors

    def _drop_candidate(self) -> None:
        self._spare = self.candidate
        self.candidate = None
