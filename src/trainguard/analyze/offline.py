"""The live detectors, run over a log's rows: one `StepSignals` per row, the same classes.

Each row becomes the `StepSignals` the Guard would have measured at that step, holding what the
log holds: the loss, the global gradient norm, the learning rate, the fp16 loss scale, whether the
optimizer skipped the step (a GradScaler overflow; `Fp16Overflow`, which counts skipped steps, is
shown only rows that stand for every step of their interval: in a log written every 10 steps,
a NaN grad norm on one row is one skipped step of 10), and in a trainguard store the per-parameter
gradient norms. What a log cannot hold (sampled weight and activation statistics, the batches)
is absent, so the detectors that read only those stay silent. A detector is handed a row only
when the row holds what it reads (a row without a gradient norm is not a row whose gradient norm
is NaN), and the detectors that read only the heavy probes' sampled statistics are not run at
all. Every further training-loss series of the log (a custom `loss_total`) is watched for
non-finite values by a `NonFiniteLoss` of its own, and the evaluations go through
`MetricCollapse`, interleaved with the rows at their steps.

Detectors count rows as steps (`StepSignals.step` is the row's index, so their windows are the
row counts of `trainguard.analyze.sparse`); the events come back in the log's own step units,
their messages naming rows as the log does ("iteration 7010").
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from trainguard.analyze.log import GRAD_NORM, LOSS, LOSS_SCALE, LR, Log, is_train_loss
from trainguard.analyze.quirks import whole_interval_skips
from trainguard.config import DetectorConfig
from trainguard.detect import DETECTOR_TYPES, Detector
from trainguard.detect.base import what_jumped
from trainguard.detect.fp16_overflow import Fp16Overflow
from trainguard.detect.metric_collapse import MetricCollapse
from trainguard.detect.nonfinite_loss import NonFiniteLoss
from trainguard.events import Event, Severity
from trainguard.registry import Kind
from trainguard.signals import LossCurvature, StepSignals

LOG_HOLDS: dict[str, Callable[[Log], bool]] = {
    "loss": lambda log: log.has(LOSS),
    "loss_curvature": lambda log: log.has(LOSS),  # computed from the loss when not logged
    "grad_norm": lambda log: log.has(GRAD_NORM),
    "param_grad_norm": lambda log: log.param_grad_norms is not None,
    "param_names": lambda log: log.param_grad_norms is not None,
    "lr": lambda log: log.has(LR),
    "group_lrs": lambda log: log.has(LR),
    "loss_scale": lambda log: log.has(LOSS_SCALE),
    "amp_overflow": lambda log: bool(log.skipped),
}
"""`StepSignals` field -> whether a log holds it. Fields a log never holds (heavy-probe results,
the recover policy's LR, the ranks) are missing: a detector that reads only those is left out."""

_EMPTY = np.zeros(0)
_STEP_IN_MESSAGE = re.compile(r"\bstep (\d+)\b")


@dataclass(slots=True)
class Replay:
    events: list[Event]
    """In the log's step units; `details["row"]` is the row the event was raised at."""
    rows: list[int]
    """The rows that were replayed (those holding a loss, a gradient norm or an LR)."""


def replay(log: Log, config: DetectorConfig, *, num_classes: int | None = None) -> Replay:
    """Run the detectors over the rows of a (prepared) log."""
    # the detectors that read only heavy-probe statistics have nothing to read in a log, and
    # two others nothing in most logs (see `_silent`)
    detectors = [t(config) for t in DETECTOR_TYPES
                 if not t.reads_sampled_only and not _silent(t, log, config)]
    with_grad = detectors  # a row without a gradient norm is not a row whose norm is 0
    overflow = next((d for d in detectors if isinstance(d, Fp16Overflow)), None)
    without_grad = [d for d in detectors if "grad_norm" not in d.reads]
    aux = _aux_losses(log)
    aux_watch: dict[str, NonFiniteLoss] = {}
    evals = MetricCollapse(config)
    eval_queue = list(log.evals)
    curvature = LossCurvature(span=max(3, math.ceil(10 / max(log.interval(), 1.0))))
    losses = log.values(LOSS)
    grads = log.values(GRAD_NORM)
    lrs = log.values(LR)
    scales = log.values(LOSS_SCALE)
    groups = [log.series[name] for name in log.series if name.startswith("lr_group")]
    skipped = log.skipped or [False] * len(log.steps)
    whole = whole_interval_skips(log, skipped)
    per_param = log.param_grad_norms
    names = list(log.param_names) if per_param is not None else []
    live_curvature = log.loss_curvature
    rows: list[int] = []
    train_loss: float | None = None
    raw: list[tuple[int, Event]] = []
    # one StepSignals refilled row by row: no detector keeps the object it is handed
    signals = StepSignals(step=0, loss=None, grad_norm=0.0, param_grad_norm=_EMPTY,
                          param_names=names)
    aux_signals = StepSignals(step=0, loss=None, grad_norm=0.0, param_grad_norm=_EMPTY,
                              param_names=[])
    for row, step in enumerate(log.steps):
        if eval_queue and rows and eval_queue[0][0] < step:
            while eval_queue and eval_queue[0][0] < step:
                _, metrics = eval_queue.pop(0)
                for event in evals.observe(metrics, len(rows) - 1, classes=num_classes,
                                           train_loss=train_loss):
                    raw.append((rows[-1], event))
        loss, grad, lr = losses[row], grads[row], lrs[row]
        if loss is None and grad is None and lr is None and row not in aux:
            continue
        index = len(rows)
        rows.append(row)
        if row in aux:
            raw.extend((row, event) for event in _check_aux(aux[row], index, aux_watch,
                                                            aux_signals, config))
        if loss is not None and math.isfinite(loss):
            train_loss = loss
        signals.step = index
        signals.loss = loss
        signals.grad_norm = grad if grad is not None else 0.0
        signals.lr = lr
        signals.group_lrs = () if lr is None else (
            (lr,) if not groups else (lr, *(math.nan if (v := g[row]) is None else v
                                            for g in groups)))
        signals.loss_scale = scales[row]
        signals.amp_overflow = skipped[row]
        signals.loss_curvature = (live_curvature[row] if live_curvature is not None
                                  else curvature.observe(loss))
        if per_param is not None:
            signals.param_grad_norm = per_param[row]
        for detector in (with_grad if grad is not None else without_grad):
            if detector is overflow:  # it counts steps: one row, one step?
                signals.amp_overflow = whole[row]
            found = detector.check(signals)
            signals.amp_overflow = skipped[row]
            if found:
                raw.extend((row, event) for event in found)
    for _, metrics in eval_queue:  # evaluations after the last row
        if rows:
            for event in evals.observe(metrics, len(rows) - 1, classes=num_classes,
                                       train_loss=train_loss):
                raw.append((rows[-1], event))
    events = [_in_log_units(event, log, rows, row) for row, event in _at_full_size(raw, config)]
    return Replay(events=events, rows=rows)


def _at_full_size(raw: list[tuple[int, Event]],
                  config: DetectorConfig) -> list[tuple[int, Event]]:
    """The jumps the live detectors tell as outlier batches, at the severity of their size.

    Live, a one-step jump is `info` until the next step shows harm, and told again there if it
    did not come back. With the whole log in view, the judgement (`judge.py`) decides for
    itself which jumps were transient, by its own rules (a jump of orders of magnitude never
    is): each jump is one event at its row, a warning or, from the detector's error ratio, an
    error, and its telling again is folded into it."""
    stayed = {(e.kind, e.details["jump_step"]): e for _, e in raw if "jump_step" in e.details}
    out: list[tuple[int, Event]] = []
    for row, event in raw:
        if "jump_step" in event.details:
            continue
        if event.details.get("outlier"):
            later = stayed.get((event.kind, event.step))
            details = {k: v for k, v in event.details.items() if k != "outlier"}
            event = Event(kind=event.kind, step=event.step,
                          severity=later.severity if later is not None else _size(event, config),
                          message=what_jumped(event.message), param=event.param,
                          value=event.value, details=details)
        out.append((row, event))
    return out


def _size(event: Event, config: DetectorConfig) -> Severity:
    """The severity of a jump by its size alone."""
    ratio = event.details.get("ratio")
    limit = (config.loss_spike.error_ratio if event.kind == Kind.LOSS_SPIKE
             else config.grad_explosion.error_ratio)
    return "error" if isinstance(ratio, (int, float)) and ratio >= limit else "warning"


def _aux_losses(log: Log) -> dict[int, list[tuple[str, float]]]:
    """The other training losses, by row: read from their points, as a log may hold
    thousands."""
    aux: dict[int, list[tuple[str, float]]] = {}
    for name in log.series:
        if is_train_loss(name):
            for at, value in zip(*log.series.points(name), strict=True):
                aux.setdefault(at, []).append((name, value))
    return aux


def _check_aux(values: list[tuple[str, float]], index: int, watches: dict[str, NonFiniteLoss],
               signals: StepSignals, config: DetectorConfig) -> list[Event]:
    """A row's other training losses, each watched for non-finite values by its own
    detector (made at its first value), the event naming the loss."""
    found: list[Event] = []
    for name, value in values:
        watch = watches.get(name)
        if watch is None:
            watch = watches[name] = NonFiniteLoss(config)
        signals.step, signals.loss = index, value
        for event in watch.check(signals):
            event.param, event.message = name, f"{name} is {value}"
            found.append(event)
    return found


def _silent(kind: type[Detector], log: Log, config: DetectorConfig) -> bool:
    """Whether a detector cannot raise anything on this log, whatever its rows hold: it judges
    a live run only (`live_only`), or the run's first steps which the log does not begin with
    (`judges_start`), or it reads only what the log does not hold (`reads`)."""
    del config
    if kind.live_only:
        return True
    if kind.judges_start and not log.starts_at_start():
        return True
    return not any(LOG_HOLDS.get(name, _never)(log) for name in kind.reads)


def _never(log: Log) -> bool:
    del log
    return False


def _in_log_units(event: Event, log: Log, rows: list[int], row: int) -> Event:
    """The event with its step (and the steps its message and details name) as the log's."""

    def at(index: int) -> int:
        return rows[min(max(index, 0), len(rows) - 1)]

    details = dict(event.details)
    for key in ("crossed", "since"):
        if isinstance(details.get(key), int):
            details[key] = log.steps[at(details[key])]
            details[f"{key}_row"] = at(event.details[key])
    details["row"] = row
    message = _STEP_IN_MESSAGE.sub(lambda m: log.label(at(int(m.group(1)))), event.message)
    return Event(kind=event.kind, step=log.steps[row], severity=event.severity, message=message,
                 param=event.param, value=event.value, details=details)
