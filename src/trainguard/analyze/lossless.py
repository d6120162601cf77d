"""A log that holds no loss: what its other values say, when they stop being numbers.

Some trainers print no loss at all (baselines ACKTR's table: explained variance, episode
rewards, the KL of the policy update). The detectors then have nothing to read, and a NaN in
such a log would go unseen; nothing hides a NaN. A value that was a number on every row before
and is NaN or inf from some row to the end of the log went non-finite for good: the run broke
there (a model that computes NaN keeps computing it). Not read as such:

- a value non-finite from its first row: it may be undefined in this run (a mean over no
  finished episode yet), as it was before anything could break;
- a value that comes back to a number: a NaN update leaves NaN weights, which never give a
  number again, so that row was skipped or undefined, not a broken run.

The gradient norm (its own detectors and `quirks.amp_skips`), the LR and the loss scale are left
to the rules that read them. In a log that holds a loss, the same rule reads a trainer's metrics
of the model's outputs (`metric_went_nonfinite`): its logged loss is a mean with the NaNs
dropped, and may keep a number while its log-probabilities do not; and the evaluations' losses
(`evaluation_went_nonfinite`), NaN from an evaluation to the last while the HF Trainer writes a
training loss of 0.0 over its NaN window.
"""

from __future__ import annotations

import math

from trainguard.analyze.log import CANONICAL, LOSS, Log, is_train_loss
from trainguard.detect.trainer_metrics import is_judged
from trainguard.events import Event


def went_nonfinite(log: Log) -> list[Event]:
    """The first row from which a value of a log without a loss is non-finite to the end, after
    it was finite on every row before (one event, at the earliest such row; none in a log that
    holds a loss: there, only the trainer's metrics, `metric_went_nonfinite`)."""
    if log.has(LOSS):
        return []
    return _broken(log, [name for name in log.series if name not in CANONICAL],
                   "; the log holds no loss")


def metric_went_nonfinite(log: Log) -> list[Event]:
    """The same rule, in a log that holds a loss, over a trainer's metrics of the model's
    outputs (rewards, log-probabilities, the KL: `detect.trainer_metrics.is_judged`): a
    preference trainer's log-probabilities NaN to the end broke the run while its logged loss,
    a mean with the NaNs dropped, kept a number."""
    if not log.has(LOSS):
        return []
    return _broken(log, [name for name in log.series if name not in CANONICAL
                         and not is_train_loss(name) and is_judged(name)], "")


def evaluation_went_nonfinite(log: Log) -> list[Event]:
    """The same rule over the evaluations' losses: an evaluation loss that was a number at
    every evaluation before and is NaN or inf from one to the last, at or after the log's last
    row, broke with the weights (the held-out data scored by a model that computes NaN), whatever
    the training loss logged beside it (the HF Trainer writes 0.0 for a NaN window). Unlike a
    mean over episodes, an evaluation's loss is defined once it runs: NaN at every one of two
    evaluations or more is a model that never computed a number on held-out data."""
    if not log.evals or not log.steps:
        return []
    names = {name for _, metrics in log.evals for name in metrics if "loss" in name.lower()}
    found: tuple[int, str, float] | None = None
    for name in sorted(names):
        points = [(step, metrics[name]) for step, metrics in log.evals if name in metrics]
        k = _nonfinite_tail([value for _, value in points])
        if k is None or (k == 0 and len(points) < 2) or points[-1][0] < log.steps[-1]:
            continue
        step, value = points[k]
        if found is None or step < found[0]:
            found = (step, name, value)
    if found is None:
        return []
    step, name, value = found
    row = max((i for i, s in enumerate(log.steps) if s <= step), default=0)
    return [Event(kind="nonfinite_value", step=log.steps[row], severity="error",
                  message=f"{name} is {value} from the evaluation at {log.label(row)} to the "
                          "last, a number at every evaluation before",
                  param=name, value=value, details={"row": row})]


def _nonfinite_tail(values: list[float]) -> int | None:
    """Where the non-finite values that end `values` begin, when every value before them is
    finite (0: none is); None when the last value is finite, or one came back to a number."""
    k = len(values)
    while k > 0 and not math.isfinite(values[k - 1]):
        k -= 1
    if k == len(values) or not all(math.isfinite(v) for v in values[:k]):
        return None
    return k


def _broken(log: Log, names: list[str], said: str) -> list[Event]:
    if not log.steps:
        return []
    last = len(log.steps) - 1
    found: tuple[int, str, float] | None = None
    for name in names:
        rows, values = log.series.points(name)
        if not rows or rows[-1] != last:
            continue
        k = _nonfinite_tail(values)
        if not k:  # never finite: undefined, not broken
            continue
        if found is None or rows[k] < found[0]:
            found = (rows[k], name, values[k])
    if found is None:
        return []
    row, name, value = found
    return [Event(kind="nonfinite_value", step=log.steps[row], severity="error",
                  message=f"{name} is {value} from {log.label(row)} to the end of the log, a "
                          f"number on every row before{said}",
                  param=name, value=value, details={"row": row})]
