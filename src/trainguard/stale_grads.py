"""Gradients never cleared between steps: the loop that forgot `optimizer.zero_grad()`.

Autograd adds each backward's gradients to what `.grad` already holds. A loop that never clears
them steps, at step N, on the sum of every gradient since the first: nothing fails, the updates
grow step after step until the run degrades (the gradient norm climbs like a sum, not like
noise). Norms alone cannot tell that from a run whose gradients grow; the gradient's own tensor
can. When `Guard.step` returns, the Guard notes one trained parameter's `.grad` (the smallest
with a gradient: a weak reference, and its version counter, which every in-place change bumps);
hooks on that parameter see each backward before and after its gradient is added. The gradients
were cleared when one of them finds `.grad` set to None, another tensor, or a version that moved
other than by autograd's own additions (`zero_grad()` in either form; `torch.autograd.grad`
adds nothing, and only an addition autograd confirms counts). When none did, and the gradient
the first addition found was not all zeros (`p.grad.data.zero_()` moves no version), the next
`Guard.step` tells it: the step applied the last step's gradients again. A backward before the
loop clears (a second loss, a logging pass) is no fault when a clearing follows it.

Cheap: the hook is in place for the first `FIRST` steps, then one step in `EVERY` (a loop that
stops clearing mid-run is told within `EVERY` steps); 5-10 microseconds each, about one a
step. The one device value (the largest magnitude of the gradient found) is
computed, and read by the next step, only when no clearing was seen.

Only the plain-loop Guard watches: under a trainer (the HF and Lightning callbacks) the trainer
clears the gradients. Under FSDP a step's gradients are new tensors, and nothing is told.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence

import torch
from torch.utils.hooks import RemovableHandle

from trainguard.events import Event

log = logging.getLogger("trainguard")

FIRST = 10
"""The first steps each checked: a loop that never clears is told at step 1."""
EVERY = 10
"""Then one step in this many is checked."""


class StaleGrads:
    """Tells, once per run, a step that applied the step before's gradients again."""

    def __init__(self, trained: Sequence[tuple[str, torch.nn.Parameter]]) -> None:
        self.trained = [(name, p) for name, p in trained if p.requires_grad]
        self.name = ""
        self.param: torch.nn.Parameter | None = None
        """The parameter watched: chosen at the first checked step it has a gradient."""
        self.seen: weakref.ref[torch.Tensor] | None = None
        """The parameter's `.grad` when the last checked `Guard.step` returned (None: not
        checking, or a clearing was seen since)."""
        self.version = -1
        """The version `.grad` has if nothing but autograd's additions touched it since."""
        self.found: torch.Tensor | None = None
        """The largest magnitude of the gradient the first backward that added to it found
        (on the device)."""
        self.pending: torch.Tensor | None = None
        """The same, measured before the add, until autograd confirms it added."""
        self.stale_at: int | None = None
        self.steps = 0
        self._handles: list[RemovableHandle] = []
        """The hooks (before and after the add), in place from a checked step's end to the
        next step's end."""

    def _before_added(self, grad: torch.Tensor) -> None:
        """A backward (or `torch.autograd.grad`, which adds nothing) reached the watched
        parameter: was `.grad` cleared since the step?"""
        seen = self.seen
        if seen is None or self.param is None:
            return
        try:
            held = self.param.grad
            if held is None or held is not seen() or held._version != self.version:
                self.seen = None  # cleared: nothing to tell for this step
                return
            if self.found is None and self.pending is None:
                self.pending = held.detach().abs().amax()
        except Exception as exc:  # a hook in the loop's backward must never fail it
            log.debug("trainguard: the gradient check failed (%s)", exc)
            self.seen = None

    def _added(self, param: torch.Tensor) -> None:
        """Autograd added to the watched `.grad`: in place, on the tensor the step left, it
        is that gradient plus this one."""
        seen = self.seen
        if seen is None:
            return
        try:
            held = param.grad
            if held is None or held is not seen() or held._version != self.version + 1:
                self.seen = None  # added out of place, or touched besides: not followed
                return
            self.version = held._version
            if self.found is None:
                self.found = self.pending
        except Exception as exc:
            log.debug("trainguard: the gradient check failed (%s)", exc)
            self.seen = None

    def check(self) -> Event | None:
        """Before a step: the error, the first time the gradients it is about to apply hold
        the last step's (once per run)."""
        found, self.found, self.pending = self.found, None, None
        if self.stale_at is not None or found is None or self.seen is None:
            return None
        if not float(found) > 0:  # zeroed through `.data`: cleared
            return None
        step = self.stale_at = self.steps
        return Event(
            kind="grads_not_cleared", step=step, severity="error",
            message=(f"the gradients of step {step - 1} were still in .grad ({self.name}'s, "
                     f"neither set to None nor zeroed) when the backward of step {step} added "
                     "to them: the loop does not clear them, so each update applies the sum of "
                     "every gradient so far and the steps grow until the run degrades. Fix: "
                     "call optimizer.zero_grad(set_to_none=True) after guard.step (or before "
                     "loss.backward())"),
            param=self.name, details={"cause": "grads_not_cleared"})

    def step_ended(self, steps: int) -> None:
        """`Guard.step` returned; `steps`, the index of the next step, whose backward passes
        are watched when it is due (`FIRST`, `EVERY`)."""
        self.steps, self.seen, self.found, self.pending = steps, None, None, None
        due = self.stale_at is None and (steps <= FIRST or steps % EVERY == 0)
        if not due:
            self._unhook()
            return
        if self.param is None or self.param.grad is None:
            self._watch()
        param = self.param
        grad = param.grad if param is not None else None
        if param is None or grad is None:
            return
        if not self._handles:
            try:
                self._handles = [param.register_hook(self._before_added),
                                 param.register_post_accumulate_grad_hook(self._added)]
            except RuntimeError:  # a parameter that takes no hooks: nothing is watched
                self._unhook()
                self.trained = [(n, p) for n, p in self.trained if p is not param]
                self.param = None
                return
        self.seen, self.version = weakref.ref(grad), grad._version

    def _watch(self) -> None:
        """Watch the smallest trained parameter that has a gradient (a hook moves with it)."""
        with_grad = [(p.numel(), i) for i, (_, p) in enumerate(self.trained)
                     if p.grad is not None and p.numel() > 0 and not p.grad.is_sparse]
        if not with_grad:
            return
        self._unhook()
        self.name, self.param = self.trained[min(with_grad)[1]]

    def pause(self) -> None:
        """Backward passes of trainguard's own (a proof's replays) until `step_ended`."""
        self.seen, self.found, self.pending = None, None, None

    def _unhook(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def close(self) -> None:
        self._unhook()
        self.seen, self.found, self.pending = None, None, None
