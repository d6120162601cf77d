"""A log that holds no loss, judged on its quality metrics: what an evaluation-only log says.

MLPerf results (`eval_accuracy` per epoch), validation tables of IoU or PSNR, FID and CLIP
scores per evaluation: such a log holds no training loss, and its quality metrics are all it
says of the run. They are read as the live `metric_collapse` reads evaluations
(`detect/metric_collapse.py`: its cliff, its words), metric by metric, in the log's order:

- a metric that fell off a cliff (a higher-is-better one below half its best so far, a
  lower-is-better one above three times it) and is still off at its last value: degraded from
  the first value off (an explosion when the value before it was within `SUDDEN` of the best,
  a slow divergence when the metric had been sliding to it);
- one that is back within the cliff's bound of its best at its last value: recovered;
- every quality metric of the log the same, to each of at least `FROZEN_DIGITS` significant
  digits, at each of at least `FROZEN_EVALS` evaluations: stalled (the model scores the
  held-out data the same way each time: its outputs never changed; an accuracy of 1.0 or a
  score written to few digits repeats on a converged run and says nothing).

A metric's level is not judged (an accuracy near chance from the start may be a hard task), nor
are rewards, scores and KLs (an RL log's, `analyze/rl_log.py`).
"""

from __future__ import annotations

import math

from trainguard.analyze.judge import EXPLOSION, SLOW, Judgement
from trainguard.analyze.log import CANONICAL, LOSS, Log
from trainguard.analyze.stall import _significant_digits
from trainguard.detect.metric_collapse import (
    CLIFF_DROP,
    CLIFF_RISE,
    is_quality_metric,
    lower_is_better,
)
from trainguard.events import Event
from trainguard.vocabulary import DEGRADED, RECOVERED, STALLED

NOT_JUDGED = ("reward", "score", "kl", "return", "loss", "nll")
"""Words of quality metrics left to other rules: an RL trainer's rewards, scores and KLs move
with the policy's exploration, and a loss is the loss's rules' (`analyze/judge.py`)."""
SUDDEN = 0.8
"""A cliff whose value before it was at least this share of the best (or at most its inverse,
for a lower-is-better metric) came in one evaluation: an explosion, not a slide."""
FROZEN_EVALS = 5
"""Evaluations a metric must repeat its value on to say that the outputs never changed..."""
FROZEN_DIGITS = 6
"""...written with this many significant digits or more (a rounded score repeats on a plateau)."""


def judged_metrics(log: Log) -> dict[str, tuple[list[int], list[float]]]:
    """The quality metrics of a log without a loss, by name: (rows, finite values), in order of
    rows (the evaluations' own, at the row of their step or the one before)."""
    if log.has(LOSS):
        return {}
    found: dict[str, tuple[list[int], list[float]]] = {}
    for name in log.series:
        if name in CANONICAL or not _judged(name):
            continue
        rows, values = log.series.points(name)
        kept = [(r, v) for r, v in zip(rows, values, strict=True)
                if v is not None and math.isfinite(v)]
        if kept:
            found[name] = ([r for r, _ in kept], [v for _, v in kept])
    for step, metrics in log.evals:
        row = max((i for i, s in enumerate(log.steps) if s <= step), default=0)
        for name, value in metrics.items():
            if _judged(name) and math.isfinite(value) and name not in log.series:
                rows, values = found.setdefault(name, ([], []))
                rows.append(row)
                values.append(value)
    return found


def _judged(name: str) -> bool:
    words = name.lower()
    return is_quality_metric(name) and not any(word in words for word in NOT_JUDGED)


def judge_scores(log: Log) -> Judgement | None:
    """The verdict of a log without a loss from its quality metrics, or None when they say
    nothing (no cliff, no frozen evaluation, no such metric)."""
    metrics = judged_metrics(log)
    if not metrics:
        return None
    frozen = _frozen(metrics)
    if frozen is not None:
        return frozen
    cliffs = [(rows[at], name, at, best) for name, (rows, values) in metrics.items()
              if (found := _cliff(name, values)) is not None for at, best in [found]]
    if not cliffs:
        return None
    row, name, at, best = min(cliffs, key=lambda c: c[0])
    values = metrics[name][1]
    value = values[at]
    off = "rose to" if lower_is_better(name) else "fell to"
    event = Event(kind="metric_collapse", step=log.steps[row], severity="warning",
                  message=f"{name} {off} {value:.4g} from its best {best:.4g}: it fell off a "
                          "cliff", param=name, value=value,
                  details={"metric": name, "rule": "cliff", "best": best, "row": row})
    kind = _kind(name, values, at, best)
    lasting = [(n, b) for _, n, _, b in cliffs if not _back(n, metrics[n][1][-1], b)]
    if not lasting:
        last = values[-1]
        ending = (f"{name} ends at {last:.4g}, back within the cliff's bound of its best "
                  f"{best:.4g}; the log holds no loss")
        return Judgement(RECOVERED, kind, row, [event], ending=ending)
    still, its_best = lasting[0]
    ending = (f"{still} is still off its best {its_best:.4g} at its last value "
              f"{metrics[still][1][-1]:.4g}: the log holds no loss, and its quality metric "
              "shows no recovery")
    return Judgement(DEGRADED, kind, row, [event], ending=ending)


def _cliff(name: str, values: list[float]) -> tuple[int, float] | None:
    """The first value of a metric off a cliff from its best so far: (its index, the best)."""
    best = values[0]
    for k, value in enumerate(values[1:], start=1):
        if best > 0 and not _back(name, value, best):
            return k, best
        best = min(best, value) if lower_is_better(name) else max(best, value)
    return None


def _back(name: str, value: float, best: float) -> bool:
    """Within the cliff's bound of the best."""
    if lower_is_better(name):
        return value <= CLIFF_RISE * best
    return value >= CLIFF_DROP * best


def _kind(name: str, values: list[float], at: int, best: float) -> str:
    """An explosion when the value before the cliff stood near the best, else a slow slide."""
    before = values[at - 1]
    near = (before <= best / SUDDEN) if lower_is_better(name) else (before >= SUDDEN * best)
    return EXPLOSION if near else SLOW


def _frozen(metrics: dict[str, tuple[list[int], list[float]]]) -> Judgement | None:
    """Every quality metric the same to every digit, written finely, at every evaluation."""
    said = []
    for name, (_, values) in metrics.items():
        if (len(values) < FROZEN_EVALS or len(set(values)) != 1
                or _significant_digits(values[0]) < FROZEN_DIGITS):
            return None
        said.append(f"{name} {values[0]:.10g}")
    rows = next(iter(metrics.values()))[0]
    count = len(rows)
    return Judgement(STALLED, None, rows[0], ending=(
        f"{' and '.join(said)} at each of {count} evaluations, to every digit written: the "
        "model scores the held-out data the same way each time, its outputs never changed"))
