"""Gradients never cleared between steps: the loop that forgot `optimizer.zero_grad()`.

Autograd adds each backward's gradients to what `.grad` already holds. A loop that never clears
them steps, at step N, on the sum of every gradient since the first: nothing fails, the updates
grow step after step until the run degrades (the gradient norm climbs like a sum, not like
noise). Norms alone cannot tell that from a run whose gradients grow; the gradient's own tensor
can. When `Guard.step` returns, the Guard notes one trained parameter's `.grad` (a weak
reference, and its version counter, which every in-place change bumps); a hook on that parameter
looks at the first backward after it, before its gradient is added: the same tensor at the same
version is the last step's gradient, neither set to None nor zeroed. No device work: the hook
is in place for the first `FIRST` steps, then one step in `EVERY` (a loop that stops clearing
mid-run is told within `EVERY` steps), a few microseconds each: under a microsecond a step.

Only the plain-loop Guard watches: under a trainer (the HF and Lightning callbacks) the trainer
clears the gradients.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterable

import torch
from torch.utils.hooks import RemovableHandle

from trainguard.events import Event

log = logging.getLogger("trainguard")

FIRST = 10
"""The first steps each checked: a loop that never clears is told at step 1."""
EVERY = 10
"""Then one step in this many is checked."""


class StaleGrads:
    """Tells, once per run, a step whose backward added to the step before's gradients."""

    def __init__(self, named: Iterable[tuple[str, torch.nn.Parameter]]) -> None:
        first = next(((n, p) for n, p in named if p.requires_grad), None)
        self.name = first[0] if first is not None else ""
        self.param: torch.nn.Parameter | None = first[1] if first is not None else None
        self.seen: weakref.ref[torch.Tensor] | None = None
        """The parameter's `.grad` when the last `Guard.step` returned (None: none, or not
        watching until the next one returns)."""
        self.version = -1
        self.stale_at: int | None = None
        """The step whose backward found the gradients not cleared (None: none did)."""
        self.reported = False
        self.steps = 0
        self._handle: RemovableHandle | None = None
        """The hook, in place from a checked step's end to the next step's end."""

    def _before_added(self, grad: torch.Tensor) -> None:
        """The first backward after a step: is `.grad` still that step's?"""
        seen, self.seen = self.seen, None
        if seen is None or self.param is None:
            return
        try:
            held = self.param.grad
            if held is not None and held is seen() and held._version == self.version:
                self.stale_at = self.steps if self.stale_at is None else self.stale_at
        except Exception as exc:  # a hook in the loop's backward must never fail it
            log.debug("trainguard: the gradient check failed (%s)", exc)

    def step_ended(self, steps: int) -> None:
        """`Guard.step` returned; `steps`, the index of the next step, whose first backward is
        checked when it is due (`FIRST`, `EVERY`)."""
        self.steps, self.seen = steps, None
        param = self.param
        due = param is not None and not self.reported and (steps <= FIRST or steps % EVERY == 0)
        if not due:
            if self._handle is not None:
                self._handle.remove()
                self._handle = None
            return
        assert param is not None
        grad = param.grad
        if grad is None:
            return
        if self._handle is None:
            try:
                self._handle = param.register_hook(self._before_added)
            except RuntimeError:  # a parameter that takes no hooks: nothing is watched
                self.param = None
                return
        self.seen, self.version = weakref.ref(grad), grad._version

    def pause(self) -> None:
        """Backward passes of trainguard's own (a proof's replays) until `step_ended`."""
        self.seen = None

    def check(self) -> Event | None:
        """The warning, the first time a step's backward found the gradients not cleared."""
        step = self.stale_at
        if step is None or self.reported:
            return None
        self.reported = True
        return Event(
            kind="grads_not_cleared", step=step, severity="error",
            message=(f"the gradients of step {step - 1} were still in .grad ({self.name}'s, "
                     f"neither set to None nor zeroed) when the backward of step {step} added "
                     "to them: the loop never clears them, so each update applies the sum of "
                     "every gradient so far and the steps grow until the run degrades. Fix: "
                     "call optimizer.zero_grad(set_to_none=True) after guard.step (or before "
                     "loss.backward())"),
            param=self.name, details={"cause": "grads_not_cleared"})

    def close(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self.seen = None
