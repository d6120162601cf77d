"""`BatchWatch`: the batch inspector run along training, with its memory of earlier batches.

Cheap checks (the batch size, from shapes alone) run every step. The full inspection runs on the
first step, on sampled steps (its statistics then travel inside the step's one transfer), on any
step with an event, and on every step while the last inspected batch had a finding (`following`:
the statistics again ride the step's transfer), so that a fault that lasts is seen batch by
batch. Each finding is reported once, until it goes away; consecutive batches with the same
finding make a run (`data_runs`): a bad shard, or a data source that changed for good.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from torch import nn

from trainguard.diagnose.batch import (
    CHANCE_FACTOR,
    BatchHistory,
    BatchStatsOnDevice,
    FieldStats,
    batch_size_of,
    check_loss_above_chance,
    describe_batch,
    inspect_batch,
    labels_follow_mask,
)
from trainguard.diagnose.batch_label_order import LabelOrder
from trainguard.diagnose.batch_repeat import BatchRepeat
from trainguard.diagnose.data_runs import RunTracker
from trainguard.events import Event
from trainguard.finding import Finding

log = logging.getLogger("trainguard")

ONCE_PER_RUN = frozenset({"batch_padding_labels"})
"""Batch findings of a fault that every batch shows (a collator's): told once per run, kept
out of the inspector's following (which would inspect every batch and shut the calm lane), of
the runs of bad batches and of what keeps a batch out of the outlier history."""

@dataclass(slots=True)
class BatchLook:
    """What one step's batch was: its events, whether it was inspected in full, and whether it
    holds NaN/inf (true as long as batches do; the event is raised once)."""

    events: list[Event]
    inspected: bool = False
    nonfinite: bool = False


class BatchWatch:
    def __init__(self, model: nn.Module, expected_batch_size: int | None) -> None:
        self.model = model
        self.expected_batch_size = expected_batch_size
        self._reference_batch_size: int | None = None
        self._short_steps = 0
        self._history = BatchHistory()
        self._active: set[str] = set()
        self._runs = RunTracker()
        self._order = LabelOrder()
        self._repeat = BatchRepeat()
        self._told: set[str] = set()
        """The `ONCE_PER_RUN` findings told."""
        self.labels_follow_mask = labels_follow_mask(model)
        """The batch's `labels` and `attention_mask` are of one sequence: not an
        encoder-decoder's, whose mask is the source's (`batch_padding_labels`)."""

    @property
    def following(self) -> bool:
        """The last inspected batch had a finding: inspect the next one too, to see whether the
        fault lasts (its statistics ride the next step's transfer); and the first steps' batches,
        compared for one batch repeated (`batch_repeat`)."""
        return bool(self._active) or self._repeat.watching

    def run_findings(self) -> list[Finding]:
        """The runs of consecutive batches with the same finding (`data_runs`), as findings."""
        return self._runs.findings()

    def stats_on_device(self, batch: Any) -> BatchStatsOnDevice | None:
        """Per-field statistics computed on the device, to travel with the step's transfer."""
        try:
            stats = BatchStatsOnDevice(batch, self.labels_follow_mask)
        except Exception as exc:  # inspection is advisory
            log.error("trainguard: batch statistics failed (%s: %s)", type(exc).__name__, exc)
            return None
        return stats if stats.tensor is not None else None

    def events(self, batch: Any, step: int, fired: bool, stats: list[FieldStats] | None,
               loss: float | None = None, level: float | None = None,
               data_ids: Any = None, ceiling: float | None = None) -> list[Event]:
        """The batch events of one step (`look`'s events)."""
        return self.look(batch, step, fired, stats, loss=loss, level=level,
                         data_ids=data_ids, ceiling=ceiling).events

    def look(self, batch: Any, step: int, fired: bool, stats: list[FieldStats] | None,
             loss: float | None = None, level: float | None = None,
             data_ids: Any = None, ceiling: float | None = None) -> BatchLook:
        """The batch events of one step and what was seen (never raises). `level`: on a loss
        spike, the typical loss before it. A language model that was well below chance level (it
        understood the data) and jumps far above it on this batch is one too: the batch means
        nothing to the model. A fresh model sits at chance and a damaged one above it: neither
        is reported, nor is a loss beyond what the model's class scores allow (`ceiling`, when
        measured: `check_loss_above_chance`)."""
        events: list[Event] = []
        seen = BatchLook(events)
        try:
            truncated = self._size_event(batch, step)
            if truncated is not None:
                events.append(truncated)
            if stats is None:
                self._repeat.watching = False  # nothing to compare: the lane is not held shut
                if not fired:
                    return seen
                # an anomalous step: one more transfer is worth it
                stats = describe_batch(batch, self.labels_follow_mask)
            findings = inspect_batch(batch, model=self.model, history=self._history,
                                     stats=stats)
            # a fault of every batch, told once per run: it holds the inspector on no batch
            once = [f for f in findings if f.check in ONCE_PER_RUN]
            findings = [f for f in findings if f.check not in ONCE_PER_RUN]
            above = (check_loss_above_chance(loss, batch, self.model, when=f"step {step}",
                                             ceiling=ceiling)
                     if level is not None else None)
            # the model understood this data (well below chance) until this batch
            if (above is not None and level is not None
                    and level * CHANCE_FACTOR < above.evidence["chance"]):
                findings.append(above)
            current = {f.check for f in findings}
            seen.inspected = True
            seen.nonfinite = "batch_nonfinite" in current
            events.extend(finding_event(f, step) for f in findings if f.check not in self._active)
            events.extend(finding_event(f, step) for f in once if f.check not in self._told)
            self._told.update(f.check for f in once)
            ordered = self._order.observe(stats, step, fired)
            if ordered is not None:  # about the batches so far, not this one: told apart
                events.append(finding_event(ordered, step))
            repeated = self._repeat.observe(stats, step)
            if repeated is not None:
                events.append(finding_event(repeated, step))
            self._active = current
            self._runs.observe(findings, step, data_ids)
            if not findings:
                self._history.update(stats)
        except Exception as exc:  # inspection is advisory; never stop training for it
            log.error("trainguard: batch inspection failed at step %d (%s: %s)", step,
                      type(exc).__name__, exc)
        return seen

    def fatal(self, batch: Any, step: int) -> tuple[list[Finding], Event | None]:
        """Inspect a batch before the forward pass: its findings, and the event of a fault the
        model cannot take (token ids beyond the embedding table), if any."""
        findings = inspect_batch(batch, model=self.model,
                                 expected_batch_size=self.expected_batch_size)
        fatal = [f for f in findings if f.check == "batch_token_ids"]
        return findings, (finding_event(fatal[0], step, severity="error") if fatal else None)

    # -- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """What the next batches are judged against: the reference batch size, the run of short
        batches, the fields' typical magnitudes, the findings still on and the runs of bad
        batches (what one step's batch was is the step's, in its `BatchLook`)."""
        return {"reference_batch_size": self._reference_batch_size,
                "short_steps": self._short_steps,
                "history": {"typical": dict(self._history.typical),
                            "seen": dict(self._history.seen)},
                "active": sorted(self._active), "runs": self._runs.state_dict(),
                "label_order": self._order.state_dict(), "told": sorted(self._told),
                "repeat": self._repeat.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        reference = state.get("reference_batch_size")
        self._reference_batch_size = None if reference is None else int(reference)
        self._short_steps = int(state.get("short_steps", 0))
        history = state.get("history", {})
        self._history = BatchHistory(
            typical={str(k): float(v) for k, v in history.get("typical", {}).items()},
            seen={str(k): int(v) for k, v in history.get("seen", {}).items()})
        self._active = {str(c) for c in state.get("active", [])}
        self._runs = RunTracker()
        self._runs.load_state_dict(state.get("runs", {}))
        self._order = LabelOrder()
        self._order.load_state_dict(state.get("label_order", {}))
        self._told = {str(c) for c in state.get("told", [])}
        self._repeat = BatchRepeat()
        self._repeat.load_state_dict(state.get("repeat", {}))

    def usual_size(self, batch: Any) -> bool:
        """Whether `batch` holds as many samples as the batches before (or no size is read from
        it): a step the calm lane may take, on which `look` would raise nothing."""
        size = batch_size_of(batch)
        return size is None or (self._reference_batch_size is not None
                                and size >= self._reference_batch_size)

    def saw_usual(self, batch: Any) -> None:
        """What `look` leaves after a batch of the usual size, on a calm step."""
        if batch_size_of(batch) is not None:
            self._short_steps = 0

    def _size_event(self, batch: Any, step: int) -> Event | None:
        size = batch_size_of(batch)
        if size is None:
            return None
        if self._reference_batch_size is None:
            self._reference_batch_size = self.expected_batch_size or size
        short = size < self._reference_batch_size
        self._short_steps = self._short_steps + 1 if short else 0
        if self._short_steps != 2:  # one short batch is an epoch's tail; two are not
            return None
        return Event(kind="batch_size", step=step, severity="warning",
                     message=f"batches hold {size} samples where {self._reference_batch_size} "
                             "were configured: they are being silently truncated",
                     value=float(size), details={"cause": "batch_truncated",
                                                 "expected": self._reference_batch_size})


def finding_event(finding: Finding, step: int, severity: str | None = None) -> Event:
    return Event(kind=finding.check, step=step,
                 severity=severity or finding.severity,  # type: ignore[arg-type]
                 message=f"{finding.message} Fix: {finding.fix}",
                 param=finding.evidence.get("field"),
                 details={"cause": finding.cause, **finding.evidence})
