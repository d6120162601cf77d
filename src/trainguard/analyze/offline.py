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

Most rows are calm. Each detector runs over all its rows in turn, `check` on the rows its fast
path (`Detector.skip_calm`, `trainguard.detect.calm`) does not skip, and the events are then put
in the order a row-by-row replay raises them: what it decides is what `check` on every row
decides, in a fraction of the time on a long log.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from trainguard.analyze.log import (
    GRAD_NORM,
    LOSS,
    LOSS_SCALE,
    LR,
    Log,
    is_eval_name,
    is_train_loss,
)
from trainguard.analyze.quirks import whole_interval_skips
from trainguard.config import DetectorConfig
from trainguard.detect import DETECTOR_TYPES, Detector
from trainguard.detect.base import what_jumped
from trainguard.detect.calm import SignalColumns, run_rows
from trainguard.detect.fp16_overflow import Fp16Overflow
from trainguard.detect.metric_collapse import MetricCollapse
from trainguard.detect.nonfinite_loss import NonFiniteLoss
from trainguard.detect.trainer_metrics import is_trainer_metric
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
    "trainer_metrics": lambda log: any(_trainer_metric(name) for name in log.series),
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
    untrained: tuple[int, str, str] | None = None
    """The first row of the earliest streak lasting to the log's end over which a detector saw
    nothing learned (`Detector.untrained`: a dead reward signal...), the detector's kind, and
    what it was."""



# the order of a row's events, as the live run raises them: the evaluations handed over before
# the step, its other losses, then the detectors in their order
_EVALS, _AUX, _DETECTORS = 0, 1, 2


def replay(log: Log, config: DetectorConfig, *, num_classes: int | None = None) -> Replay:
    """Run the detectors over the rows of a (prepared) log.

    Each detector runs over all its rows in turn, `check` on each row but those its fast path
    (`Detector.skip_calm`) skips as calm, with its state brought past them; the events are then
    put in the order a row-by-row run raises them (`fast=False`: `check` on every row)."""
    return _replay(log, config, num_classes=num_classes, fast=True)


def _replay(log: Log, config: DetectorConfig, *, num_classes: int | None,
            fast: bool) -> Replay:
    # the detectors that read only heavy-probe statistics have nothing to read in a log, and
    # two others nothing in most logs (see `_silent`)
    detectors = [t(config) for t in DETECTOR_TYPES
                 if not t.reads_sampled_only and not _silent(t, log, config)]
    overflow = next((d for d in detectors if isinstance(d, Fp16Overflow)), None)
    aux = _aux_losses(log)
    aux_rows = {row for at, _ in aux.values() for row in at}
    losses = log.values(LOSS)
    grads = log.values(GRAD_NORM)
    lrs = log.values(LR)
    rows = [row for row, (loss, grad, lr) in enumerate(zip(losses, grads, lrs, strict=True))
            if loss is not None or grad is not None or lr is not None or row in aux_rows]
    table = _Table(log, rows)
    keyed: list[tuple[tuple[int, ...], int, Event]] = []  # (order, row, event)
    untrained: tuple[int, str, str] | None = None
    keyed.extend(_evaluations(log, config, rows, num_classes))
    if aux:
        index_of = {row: index for index, row in enumerate(rows)}
        for order, (name, (at, values)) in enumerate(aux.items()):
            for row, event in _watch_aux(name, at, values, index_of, config, fast=fast):
                keyed.append(((row, _AUX, order), row, event))
    for order, detector in enumerate(detectors):
        # a row without a gradient norm is not a row whose norm is 0
        handed = table.with_grad if "grad_norm" in detector.reads else table.every
        whole_skips = detector is overflow  # it counts steps: one row, one step?
        columns = table.columns(handed, whole_skips=whole_skips)
        # one StepSignals refilled row by row: no detector keeps the object it is handed
        signals = StepSignals(step=0, loss=None, grad_norm=0.0, param_grad_norm=_EMPTY,
                              param_names=table.names)

        def fill(position: int, handed: list[int] = handed, signals: StepSignals = signals,
                 whole_skips: bool = whole_skips) -> tuple[int, StepSignals]:
            index = handed[position]
            table.fill(signals, index, whole_skips=whole_skips)
            return table.rows[index], signals

        for row, event in run_rows(detector, columns, fill, fast=fast):
            keyed.append(((row, _DETECTORS, order), row, event))
        if (said := _untrained(detector, table, handed)) is not None:
            untrained = min(said, untrained or said)
    keyed.sort(key=lambda item: item[0])  # stable: a detector's events keep their order
    raw = [(row, event) for _, row, event in keyed]
    events = [_in_log_units(event, log, rows, row) for row, event in _at_full_size(raw, config)]
    return Replay(events=events, rows=rows, untrained=untrained)


class _Table:
    """The replayed rows' signals: row by row for `check`, as columns for the fast paths."""

    def __init__(self, log: Log, rows: list[int]) -> None:
        self.rows = rows
        every_row = len(rows) == len(log.steps)  # the usual log: no row to leave out
        picked = (lambda values: values) if every_row else (lambda values: _at(values, rows))
        self.loss = picked(log.values(LOSS))
        self.grad = picked(log.values(GRAD_NORM))
        self.lr = picked(log.values(LR))
        self.scale = picked(log.values(LOSS_SCALE))
        skipped = log.skipped or [False] * len(log.steps)
        self.skipped = picked(skipped)
        self.whole = picked(whole_interval_skips(log, skipped)) if log.skipped else self.skipped
        self.groups = [picked(log.series[name]) for name in log.series
                       if name.startswith("lr_group")]
        if log.loss_curvature is not None:
            self.curvature = _at(log.loss_curvature, rows)
        else:
            curvature = LossCurvature(span=max(3, math.ceil(10 / max(log.interval(), 1.0))))
            self.curvature = curvature.observe_all(self.loss)
        self.metrics = [(name, picked(log.series[name])) for name in log.series
                        if _trainer_metric(name)]
        """A trainer's own metrics (a TRL log's rewards, KL...), by their names."""
        self.per_param = log.param_grad_norms
        self.names = list(log.param_names) if self.per_param is not None else []
        self.every = list(range(len(rows)))
        self.with_grad = [i for i, grad in enumerate(self.grad) if grad is not None]
        self._columns: dict[tuple[int, bool], SignalColumns] = {}
        self._arrays: dict[str, np.ndarray] = {}

    def group_lrs(self, index: int) -> tuple[float, ...]:
        lr = self.lr[index]
        if lr is None:
            return ()
        return (lr, *(math.nan if (v := g[index]) is None else v for g in self.groups))

    def columns(self, handed: list[int], *, whole_skips: bool) -> SignalColumns:
        """The columns of the rows `handed` (all rows, or those with a gradient norm)."""
        key = (len(handed), whole_skips)
        if key not in self._columns:
            at = np.asarray(handed, dtype=np.int64)
            lrs = np.column_stack([self._array("lr", self.lr)[at],
                                   *(self._array(f"lr{k}", g)[at]
                                     for k, g in enumerate(self.groups))])
            self._columns[key] = SignalColumns(
                step=at, loss=self._array("loss", self.loss)[at],
                has_loss=self._array("has_loss", self.loss, given=True)[at],
                grad_norm=self._array("grad", self.grad, missing=0.0)[at],
                amp_overflow=np.array(self.whole if whole_skips else self.skipped,
                                      dtype=bool)[at],
                group_lrs=lrs, has_lr=self._array("has_lr", self.lr, given=True)[at],
                loss_curvature=self._array("curvature", self.curvature)[at],
                has_curvature=self._array("has_curvature", self.curvature, given=True)[at])
        return self._columns[key]

    def _array(self, name: str, values: list[Any], *, given: bool = False,
               missing: float = math.nan) -> np.ndarray:
        """`values` as floats (`missing` where None), or where they are not None (`given`);
        made once for every column set."""
        if name not in self._arrays:
            self._arrays[name] = (np.fromiter((v is not None for v in values), dtype=bool,
                                              count=len(values)) if given
                                  else _floats(values, missing))
        return self._arrays[name]

    def fill(self, signals: StepSignals, index: int, *, whole_skips: bool) -> None:
        """`signals` as the Guard would have measured them at replayed row `index`."""
        grad = self.grad[index]
        signals.step = index
        signals.loss = self.loss[index]
        signals.grad_norm = grad if grad is not None else 0.0
        signals.lr = self.lr[index]
        signals.group_lrs = self.group_lrs(index)
        signals.loss_scale = self.scale[index]
        signals.amp_overflow = (self.whole if whole_skips else self.skipped)[index]
        signals.loss_curvature = self.curvature[index]
        signals.trainer_metrics = {name: value for name, values in self.metrics
                                   if (value := values[index]) is not None}
        if self.per_param is not None:
            signals.param_grad_norm = self.per_param[self.rows[index]]


def _untrained(detector: Detector, table: _Table,
               handed: list[int]) -> tuple[int, str, str] | None:
    """The detector's streak lasting to the log's end (`Detector.untrained`), as the first log
    row of it: the streak counts the rows that hold the trainer's metrics it reads."""
    said = detector.untrained()
    if said is None:
        return None
    streak, what = said
    counted = [i for i in handed if any(values[i] is not None for _, values in table.metrics)]
    if not counted:
        return None
    return table.rows[counted[max(len(counted) - streak, 0)]], detector.kind, what


def _trainer_metric(name: str) -> bool:
    """A column of a trainer's own metrics: not one the other signals are read from, not an
    evaluation's, not a training loss (watched on its own)."""
    return (name not in (LOSS, GRAD_NORM, LR, LOSS_SCALE) and not is_train_loss(name)
            and not is_eval_name(name) and is_trainer_metric(name))


def _at(values: list[Any], rows: list[int]) -> list[Any]:
    return [values[row] for row in rows]


def _floats(values: list[float | None], missing: float = math.nan) -> np.ndarray:
    if math.isnan(missing):
        return np.array(values, dtype=np.float64)  # numpy reads None as NaN
    return np.array([missing if v is None else v for v in values], dtype=np.float64)


def _given(values: list[Any]) -> np.ndarray:
    return np.array([v is not None for v in values], dtype=bool)


def _evaluations(log: Log, config: DetectorConfig, rows: list[int],
                 num_classes: int | None) -> list[tuple[tuple[int, ...], int, Event]]:
    """The evaluations through `MetricCollapse`, each handed over before the first row past
    its step (after the rows replayed before it), with the last finite training loss then."""
    queue = list(log.evals)
    if not queue:
        return []
    evals = MetricCollapse(config)
    losses = log.values(LOSS)
    replayed = set(rows)
    keyed: list[tuple[tuple[int, ...], int, Event]] = []
    done = 0  # rows replayed so far
    train_loss: float | None = None
    for row, step in enumerate(log.steps):
        if not queue:
            break
        if done and queue[0][0] < step:
            while queue and queue[0][0] < step:
                _, metrics = queue.pop(0)
                for event in evals.observe(metrics, done - 1, classes=num_classes,
                                           train_loss=train_loss):
                    keyed.append(((row, _EVALS, len(keyed)), rows[done - 1], event))
        if row in replayed:
            done += 1
            loss = losses[row]
            if loss is not None and math.isfinite(loss):
                train_loss = loss
    for _, metrics in queue:  # evaluations after the last row
        if rows:
            for event in evals.observe(metrics, len(rows) - 1, classes=num_classes,
                                       train_loss=train_loss):
                keyed.append(((len(log.steps), _EVALS, len(keyed)), rows[-1], event))
    return keyed


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


def _aux_losses(log: Log) -> dict[str, tuple[list[int], list[float]]]:
    """The other training losses: the rows holding each and its values there, read from
    their points, as a log may hold thousands."""
    return {name: log.series.points(name) for name in log.series if is_train_loss(name)}


def _watch_aux(name: str, at: list[int], values: list[float], index_of: dict[int, int],
               config: DetectorConfig, *, fast: bool) -> list[tuple[int, Event]]:
    """Another training loss, watched for non-finite values by a detector of its own, the
    events naming the loss."""
    steps = [index_of[row] for row in at]
    loss = np.asarray(values, dtype=np.float64)
    none = np.zeros(len(at), dtype=bool)
    columns = SignalColumns(step=np.asarray(steps, dtype=np.int64), loss=loss,
                            has_loss=~none, grad_norm=np.zeros(len(at)), amp_overflow=none,
                            group_lrs=np.zeros((len(at), 0)), has_lr=none,
                            loss_curvature=np.full(len(at), math.nan), has_curvature=none)
    signals = StepSignals(step=0, loss=None, grad_norm=0.0, param_grad_norm=_EMPTY,
                          param_names=[])

    def fill(position: int) -> tuple[int, StepSignals]:
        signals.step, signals.loss = steps[position], values[position]
        return at[position], signals

    found = run_rows(NonFiniteLoss(config), columns, fill, fast=fast)
    for _, event in found:
        event.param, event.message = name, f"{name} is {event.value}"
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
    needs = kind.reads if kind.raises_from is None else kind.raises_from
    return not any(LOG_HOLDS.get(name, _never)(log) for name in needs)


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
