"""What trainguard tells an experiment tracker (Weights & Biases, MLflow), in the trackers' own
terms: key names, the step axis the trainer logs on, the rows of a step, the events table and
the run's verdict. `WandbSink` and `MlflowSink` share it; only how they send differs.

Keys are `trainguard/<name>`, made of the characters MLflow allows in a metric or tag name
(letters, digits, `_ - . / :` and spaces; no empty, `.` or `..` segment), which W&B takes as
they are and groups by their `trainguard/` prefix.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainguard.events import Event, StepReport, at_least

if TYPE_CHECKING:
    from trainguard.ranked_cause import RankedCause
    from trainguard.run_verdict import RunVerdict
    from trainguard.signals import SampledStats

log = logging.getLogger("trainguard")

PREFIX = "trainguard"
NOT_APPLIED = ("skipped", "halted", "rolled_back")
EVENT_COLUMNS = ["step", "severity", "kind", "param", "value", "message"]
TABLE_ROWS = 10_000
"""Rows of the events table a tracker is sent: the first ones (a NaN left in the weights under
observe raises events at every step); the summary's `trainguard/events_count` counts them all."""
_UNSAFE = re.compile(r"[^\w.\-/ :]")
FLAGGED_KEYS = ("weight_nonfinite", "act_nonfinite")
"""Sampled keys that flag a layer holding NaN/inf: sent as a count, not per layer."""
UNPLOTTED_KEYS = ("act_fp16",)
"""Sampled keys with nothing to plot (a 0/1 flag of the output's dtype)."""


def tracker_key(*parts: str) -> str:
    """`trainguard/<parts>` with every character MLflow refuses replaced by `_`, and no segment
    that a path would resolve away (empty, `.`, `..`)."""
    segments: list[str] = [PREFIX]
    for part in parts:
        for segment in str(part).split("/"):
            segment = _UNSAFE.sub("_", segment).strip()
            if segment in ("", ".", ".."):
                segment = segment.replace(".", "_") or "_"
            segments.append(segment)
    return "/".join(segments)


@dataclass(frozen=True, slots=True)
class StepAxis:
    """The step a tracker's charts are drawn against, as the trainer logs it: the key that
    holds it (None: the tracker's own step argument) and what it adds to trainguard's 0-based
    optimizer step."""

    key: str
    offset: int = 0

    def value(self, step: int) -> int:
        return step + self.offset


TRAINER_AXES: dict[str, StepAxis] = {
    # the Trainer logs a step's loss at its global_step after the update: step + 1
    "transformers.Trainer": StepAxis("train/global_step", 1),
    # Lightning logs a batch's metrics at the global step before its update
    "lightning.pytorch.Trainer": StepAxis("trainer/global_step", 0),
    "pytorch_lightning.Trainer": StepAxis("trainer/global_step", 0),
}
OWN_AXIS = StepAxis(tracker_key("step"), 0)
"""A plain loop: trainguard's optimizer step, under its own key."""


def step_axis(integration: str) -> StepAxis:
    """The axis of the trainer the run is guarded in (`RunInfo.integration`)."""
    return TRAINER_AXES.get(integration, OWN_AXIS)


def step_values(report: StepReport) -> dict[str, float]:
    """The step's health, NaN and inf kept as they are, with counts of what is not finite (a
    tracker that drops a non-finite point still shows it there)."""
    values = {tracker_key("grad_norm"): report.grad_norm,
              tracker_key("clip_coef"): report.clip_coef,
              tracker_key("skipped"): float(report.action in NOT_APPLIED),
              tracker_key("nonfinite", "grad_norm"): float(not math.isfinite(report.grad_norm))}
    if report.loss is not None:
        values[tracker_key("loss")] = report.loss
        values[tracker_key("nonfinite", "loss")] = float(not math.isfinite(report.loss))
    if report.lr is not None:
        values[tracker_key("lr")] = report.lr
    if report.loss_scale is not None:
        values[tracker_key("loss_scale")] = report.loss_scale
    signals = report.signals
    if signals is not None:
        norms = np.asarray(signals.param_grad_norm, dtype=np.float64)
        values[tracker_key("nonfinite", "grads")] = float((~np.isfinite(norms)).sum())
        if report.sampled:  # per-layer gradient norms with the sampled statistics
            values.update((tracker_key("layers", "grad_norm", name), float(norm))
                          for name, norm in zip(signals.param_names, norms.tolist(),
                                                strict=False))
    for severity, count in _severities(report.events).items():
        values[tracker_key("events", severity)] = float(count)
    return values


def sampled_values(sample: SampledStats, param_names: list[str]) -> dict[str, float]:
    """A sampled step's per-layer statistics as keys grouped by statistic
    (`trainguard/layers/<statistic>/<layer>`), flags as counts."""
    values: dict[str, float] = {}
    for per_layer, names in ((sample.per_param, param_names),
                             (sample.per_module, sample.module_names)):
        for key, array in per_layer.items():
            numbers = np.asarray(array, dtype=np.float64)
            if key in FLAGGED_KEYS:
                flagged = (numbers != 0) | ~np.isfinite(numbers)
                values[tracker_key("nonfinite", key)] = float(flagged.sum())
            elif key not in UNPLOTTED_KEYS:
                values.update((tracker_key("layers", key, name), float(v))
                              for name, v in zip(names, numbers.tolist(), strict=False))
    values.update((tracker_key("output", key), float(value))
                  for key, value in sample.output.items()
                  if isinstance(value, (int, float)) and not isinstance(value, bool))
    return values


def eval_values(metrics: Mapping[str, Any]) -> dict[str, float]:
    numbers = {name: float(v) for name, v in metrics.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    values = {tracker_key("eval", name): v for name, v in numbers.items()}
    values[tracker_key("nonfinite", "eval")] = float(sum(not math.isfinite(v)
                                                         for v in numbers.values()))
    return values


def nonfinite_count(values: Mapping[str, float]) -> int:
    return sum(not math.isfinite(v) for v in values.values())


def event_row(event: Event, axis: StepAxis) -> list[Any]:
    """One row of the events table, at the tracker's step; the value as text ("" when the event
    has none), so that a NaN or inf reads as itself in a column of one type."""
    value = "" if event.value is None else format(event.value, ".6g")
    return [axis.value(event.step), event.severity, event.kind, event.param or "", value,
            event.message]


def _severities(events: Iterable[Event]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for event in events:
        counts[event.severity] = counts.get(event.severity, 0) + 1
    return counts


def verdict_values(verdict: RunVerdict) -> dict[str, str]:
    """The verdict as summary entries (a run too short to judge says so, as its message)."""
    return {tracker_key("verdict"): verdict.verdict or "not judged",
            tracker_key("verdict_message"): verdict.message}


def cause_values(causes: list[RankedCause]) -> dict[str, str]:
    """The ranked causes, best first: `trainguard/cause/1` = `code (confidence)`, and its
    evidence and fix under `trainguard/cause/1/...`."""
    values: dict[str, str] = {tracker_key("causes"): ", ".join(c.code for c in causes)}
    for rank, cause in enumerate(causes, start=1):
        proof = " confirmed by replay" if cause.proof else ""
        values[tracker_key("cause", str(rank))] = f"{cause.code} ({cause.confidence:.0%}){proof}"
        values[tracker_key("cause", str(rank), "evidence")] = "; ".join(cause.evidence)
        if cause.fix:
            values[tracker_key("cause", str(rank), "fix")] = cause.fix
    return values


class AlertGate:
    """Whether an event is worth a tracker's alert: warnings and worse, at most one per kind
    every `per_kind_s` seconds and `most` in a run (an alert is an e-mail or a Slack message:
    a NaN on every step must not become one each)."""

    def __init__(self, *, per_kind_s: float = 300.0, most: int = 20) -> None:
        self.per_kind_s = per_kind_s
        self.most = most
        self.sent = 0
        self.held = 0
        """Events of alert severity that were not sent (rate-limited); still in the table."""
        self._last: dict[str, float] = {}

    def admits(self, event: Event, now: float | None = None) -> bool:
        if not at_least(event.severity, "warning"):
            return False
        now = time.monotonic() if now is None else now
        last = self._last.get(event.kind)
        if self.sent >= self.most or (last is not None and now - last < self.per_kind_s):
            self.held += 1
            return False
        self._last[event.kind] = now
        self.sent += 1
        return True


def html_report(run_dir: str | None, out: Path) -> Path | None:
    """The run's HTML report (`trainguard report`), when the run has a store; None without
    one. A report that cannot be made is said, and the rest is still sent."""
    if run_dir is None or not Path(run_dir).is_dir():
        return None
    try:
        from trainguard.report import write_report

        write_report(run_dir, out)
    except Exception as exc:  # the report is a courtesy: the tracker has the rest
        log.warning("trainguard: no HTML report for the tracker (%s: %s)",
                    type(exc).__name__, exc)
        return None
    return out
