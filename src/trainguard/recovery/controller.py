"""The `recover` policy's judgement: when skipping is enough, and when the run must roll back.

    non-finite loss/gradients   skip the update (as `protect`); `rollback_after_skips` in a row
    (or trainer metrics)        (from batches that hold no NaN/inf themselves) mean the state
                                itself is broken: roll back
    loss spike, grad explosion  skip that update (its batch is the suspect) and watch: later steps
                                whose loss is still a spike are skipped too; if the loss is not
                                back near its earlier level within `settle_steps`, the run has
                                taken off: roll back to before the spike
    divergence, non-finite or   the state is already bad: roll back at once
    extreme weights/moments
    trouble just after the LR   a spike, an explosion, a non-finite step or an instability
    was raised >= `jump_ratio`  warning within `jump_steps` of the loop raising the LR that far
                                in one step (`lr_change`): the update at the raised LR did the
                                damage, which waiting only compounds: roll back at once, to a
                                state from before the raise
    a trainer-metric            roll back at once, the LR cut: skipping keeps the LR that did it
    instability its detector
    blames on the LR
    replicas out of sync        roll back to a state from when the ranks last agreed
    more than `max_rollbacks`   halt with a crash snapshot and a diagnosis

Which kinds are watched and which roll back at once, and when their trouble began, is each kind's
entry in `trainguard.registry` (`Reaction`, `Onset`). Everything here runs on host floats already
fetched: no device work.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from trainguard.config import DetectorConfig, RecoveryConfig
from trainguard.detect import DETECTOR_TYPES
from trainguard.events import Event
from trainguard.probes.sample_cadence import SampleCadence
from trainguard.registry import (
    Onset,
    Reaction,
    Tag,
    event_kind,
    is_trouble,
    kinds_reacting,
    kinds_tagged,
)
from trainguard.signals import StepSignals

TRAINER_METRIC_INSTABILITIES = frozenset(
    t.kind for t in DETECTOR_TYPES if "trainer_metrics" in t.idle_without
) & kinds_tagged(Tag.INSTABILITY)
"""The instabilities read from a trainer's own metrics (the KL to the reference: detectors
idle without them): the ones whose cause, when the detector names it, is acted on under
`recover`; the loss's and the gradients' instabilities (a bad start, which reads the metrics
only to tell a preference loss) keep the reactions the registry gives them."""

REFERENCE_LOSSES = 10
"""Calm losses kept as the reference level of the run before any trouble."""
SETTLED_WINDOW = 3
"""The loss is back when the median of this many latest losses is near the reference."""


@dataclass(slots=True)
class Verdict:
    action: Literal["skip", "rollback", "halt"]
    reason: str
    onset: int = 0
    """The step where the trouble began: a rollback goes to a good state from no later than it."""
    bad_steps: list[int] = field(default_factory=list)
    """Steps whose batches are suspects, to be skipped by the data pipeline from now on."""
    after_lr_raise: bool = False
    """The trouble followed the loop raising the LR far: the LR is the cause, which the backoff's
    ceiling bounds, so the rollback leaves the clipping as it was."""


@dataclass(slots=True)
class _Trouble:
    start: int
    reference: float
    losses: list[float] = field(default_factory=list)
    applied: int = 0
    """Updates applied since the trouble began: with none, the state is still the one from
    before it, and rolling back would change nothing."""


def troubling(events: list[Event]) -> list[Event]:
    """The events the recover policy acts on (`registry.is_trouble`: a jump told as an outlier
    batch, `info` until the steps after it show harm, is watched all the same)."""
    return [e for e in events if is_trouble(e.kind, e.severity)]


class RecoveryController:
    def __init__(self, config: RecoveryConfig, detectors: DetectorConfig,
                 sample_every: int, sampling: SampleCadence | None = None) -> None:
        self.config = config
        self.detectors = detectors
        self.sample_every = sample_every
        self.sampling = sampling
        """The heavy probes' cadence in force (None: every `sample_every` steps)."""
        self.rollbacks = 0
        self.calm_losses: deque[float] = deque(maxlen=REFERENCE_LOSSES)
        self.trouble: _Trouble | None = None
        self.skip_streak: list[int] = []
        self.jump: tuple[int, float] | None = None
        """The last step at which the loop raised the LR `jump_ratio`-fold or more, and by how
        much."""

    def review(self, signals: StepSignals, events: list[Event], applies_update: bool = True,
               *, bad_input: bool = False) -> Verdict | None:
        """Judge one step; None leaves the policy's decision (apply, clip or skip) as it is.
        `bad_input`: the step's batch itself holds NaN/inf (its skip says nothing about the
        state, so it does not count towards a rollback)."""
        step = signals.step
        self._note_jump(events, step)
        serious = troubling(events)
        verdict = self._judge(signals, step, serious, bad_input)
        if verdict is None and applies_update and self.trouble is not None:
            self.trouble.applied += 1
        if verdict is not None and verdict.action == "rollback" \
                and self.rollbacks >= self.config.max_rollbacks:
            return Verdict("halt", f"{verdict.reason}, and the run was already rolled back "
                                   f"{self.rollbacks} times", onset=verdict.onset)
        finite_loss = signals.loss is not None and math.isfinite(signals.loss)
        if verdict is None and not serious and self.trouble is None and finite_loss:
            self.calm_losses.append(float(signals.loss))  # type: ignore[arg-type]
        return verdict

    def _judge(self, signals: StepSignals, step: int, serious: list[Event],
               bad_input: bool) -> Verdict | None:
        cfg = self.config
        kinds = {e.kind for e in serious}
        # the weights or optimizer state are already bad: skipping cannot help
        at_once = [k for k in kinds_reacting(Reaction.ROLL_BACK) if k in kinds]
        jump = self._jump_behind(step)
        if at_once:
            first = next(e for e in serious if e.kind == at_once[0])
            onset = self._onset(first, step)
            return Verdict("rollback", f"{at_once[0]} at step {step}",
                           onset=onset if jump is None else min(onset, jump[0]))
        # a NaN the step computed elsewhere (a reward, a log-probability, the KL under a finite
        # loss) makes its gradients as suspect as a NaN loss would
        computed_nan = any(e.kind in kinds_tagged(Tag.NONFINITE) for e in serious)
        # an instability of the trainer's own metrics whose detector measured the LR as its
        # cause (a KL that left its reference in the first updates): skipping keeps the LR that
        # did it, a rollback cuts it
        lr_blamed = [e for e in serious if e.kind in TRAINER_METRIC_INSTABILITIES
                     and e.details.get("cause") == "lr_too_high"]
        if lr_blamed:
            first = lr_blamed[0]
            return Verdict("rollback", f"{first.kind} at step {step}, from updates too large for "
                                       "the run: rolled back with the LR cut",
                           onset=self._onset(first, step))
        finite = signals.loss_finite and signals.grads_finite and not computed_nan
        if not finite and signals.amp_overflow:
            return None  # routine GradScaler overflow: the scaler handles it
        if not finite and bad_input:
            return Verdict("skip", f"non-finite values in the batch of step {step}",
                           onset=step, bad_steps=[step])
        trouble_kinds = kinds_tagged(Tag.INSTABILITY) | kinds_tagged(Tag.NONFINITE)
        unstable = [e.kind for e in serious if e.kind in trouble_kinds]
        if jump is not None and (unstable or not finite):
            return self._after_jump(step, jump, unstable[0] if unstable else "non-finite loss")
        if not finite:
            what = ("non-finite loss or gradients" if not computed_nan
                    or not (signals.loss_finite and signals.grads_finite)
                    else "non-finite trainer metrics")
            self.skip_streak.append(step)
            if len(self.skip_streak) >= cfg.rollback_after_skips:
                streak = self.skip_streak
                return Verdict("rollback", f"{len(streak)} consecutive steps had {what}",
                               onset=streak[0], bad_steps=list(streak))
            return Verdict("skip", f"{what} at step {step}", onset=step, bad_steps=[step])
        self.skip_streak = []
        # the update is skipped; the aftermath decides between settling and rollback
        watched = [k for k in kinds_reacting(Reaction.WATCH) if k in kinds]
        if watched:
            if self.trouble is None:
                reference = (statistics.median(self.calm_losses) if self.calm_losses
                             else math.nan)
                self.trouble = _Trouble(start=step, reference=reference)
            return Verdict("skip", f"{watched[0]} at step {step}: its update is skipped",
                           onset=self.trouble.start, bad_steps=[step])
        if self.trouble is not None:
            return self._follow_trouble(signals, step)
        return None

    def _note_jump(self, events: list[Event], step: int) -> None:
        """Remember a raise of the LR by `jump_ratio` or more (an event of the LR family, with
        the rise in `details["ratio"]`; agreed by every rank, read from the group LRs)."""
        lr_kinds = kinds_tagged(Tag.LR)
        for event in events:
            ratio = event.details.get("ratio") if event.kind in lr_kinds else None
            if (isinstance(ratio, (int, float)) and math.isfinite(ratio)
                    and ratio >= self.config.jump_ratio):
                self.jump = (step, float(ratio))

    def _jump_behind(self, step: int) -> tuple[int, float] | None:
        """The LR raise this step's trouble would follow from: one at most `jump_steps` before
        it (the update at the raised LR shows in the next step's loss and gradients, and in
        the instability signals within a few steps)."""
        jump = self.jump
        if jump is None or not jump[0] < step <= jump[0] + self.config.jump_steps:
            return None
        return jump

    def _after_jump(self, step: int, jump: tuple[int, float], what: str) -> Verdict:
        """Roll back to a state from before the raise (and before any trouble already open)."""
        at, ratio = jump
        onset = at
        if self.trouble is not None:
            onset = min(onset, self.trouble.start - 1)
        if self.skip_streak:
            onset = min(onset, self.skip_streak[0])
        times = f"{ratio:.0f}" if ratio < 1e6 else f"{ratio:.3g}"
        return Verdict("rollback", f"{what} at step {step}, {step - at} step(s) after the LR was "
                                   f"raised x{times} at step {at}", onset=onset,
                       after_lr_raise=True)

    def _follow_trouble(self, signals: StepSignals, step: int) -> Verdict | None:
        trouble = self.trouble
        assert trouble is not None
        if signals.loss is not None:
            trouble.losses.append(signals.loss)
        recent = trouble.losses[-SETTLED_WINDOW:]
        if not math.isfinite(trouble.reference) or (
                len(recent) == SETTLED_WINDOW
                and statistics.median(recent) <= trouble.reference * self.config.settle_ratio):
            self.trouble = None  # settled: skipping the spike was enough
            return None
        if step - trouble.start >= self.config.settle_steps:
            # Even with every update since kept out, the state may be bad: the update that did the
            # damage is often the one *before* the spike (its own loss looked normal).
            latest = statistics.median(recent) if recent else math.nan
            return Verdict("rollback", f"the loss has not come back since step {trouble.start} "
                                       f"({latest:.4g} against {trouble.reference:.4g} before)",
                           onset=trouble.start - 1, bad_steps=[trouble.start])
        loss = signals.loss
        if loss is not None and loss >= trouble.reference * self.detectors.loss_spike.ratio:
            # still spiking (the detector reports an episode once): keep these updates out too,
            # so a burst of bad batches does no harm and a healthy state can settle by itself
            return Verdict("skip", f"loss {loss:.4g} still {loss / trouble.reference:.3g}x its "
                                   f"level from before step {trouble.start}: update skipped",
                           onset=trouble.start, bad_steps=[step])
        return None

    def _onset(self, event: Event, step: int) -> int:
        """Estimate when a late-detected fault began, to roll back to a state from before it."""
        det = self.detectors
        rule = event_kind(event.kind).onset
        if rule is Onset.SMOOTHED_LOSS:
            # the level crossed the ratio `patience` steps (and half its window) ago, and a
            # climb starts well before it crosses: back by the best level's half-span more
            return (step - det.loss_divergence.patience - det.loss_divergence.window // 2
                    - det.loss_divergence.span // 2)
        if rule is Onset.SAMPLED:  # seen on a sampled step: went bad since the last one
            return (step - self.sample_every if self.sampling is None
                    else self.sampling.before(step))
        if rule is Onset.LAST_AGREED:  # the replicas were last seen equal then
            return int(event.details.get("last_agreed_step", 0))
        return step

    def rolled_back(self) -> None:
        self.rollbacks += 1
        self.trouble = None
        self.skip_streak = []
        self.jump = None  # its updates are undone

    def state_dict(self) -> dict[str, Any]:
        trouble = self.trouble
        return {"rollbacks": self.rollbacks, "calm_losses": list(self.calm_losses),
                "skip_streak": list(self.skip_streak),
                "jump": None if self.jump is None else list(self.jump),
                "trouble": None if trouble is None else {
                    "start": trouble.start, "reference": trouble.reference,
                    "losses": list(trouble.losses), "applied": trouble.applied}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rollbacks = int(state["rollbacks"])
        self.calm_losses = deque((float(v) for v in state["calm_losses"]),
                                 maxlen=REFERENCE_LOSSES)
        self.skip_streak = [int(s) for s in state["skip_streak"]]
        jump = state.get("jump")  # saved before jumps were followed: none
        self.jump = None if jump is None else (int(jump[0]), float(jump[1]))
        trouble = state.get("trouble")
        self.trouble = None if trouble is None else _Trouble(
            start=int(trouble["start"]), reference=float(trouble["reference"]),
            losses=[float(v) for v in trouble["losses"]], applied=int(trouble["applied"]))
