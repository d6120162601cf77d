"""A log that holds no loss, judged on its quality metrics: what an evaluation-only log says.

MLPerf results (`eval_accuracy` per epoch), validation tables of IoU or PSNR, FID and CLIP
scores per evaluation: such a log holds no training loss, and its quality metrics are all it
says of the run. They are read as the live `metric_collapse` reads evaluations
(`detect/metric_collapse.py`: its cliff, its words), metric by metric, in the log's order:

- a metric that fell off a cliff (a higher-is-better one below half its best so far, a
  lower-is-better one above three times it, that best a level held on `HELD` evaluations or
  more, not one noisy value) and is still off at its last value: degraded from
  the first value off (an explosion when the value before it was within `SUDDEN` of the best,
  a slow divergence when the metric had been sliding to it);
- one that is back within the cliff's bound of its best at its last value: recovered;
- every quality metric of the log the same, to each of at least `FROZEN_DIGITS` significant
  digits, at each of at least `FROZEN_EVALS` evaluations: stalled (the model scores the
  held-out data the same way each time: its outputs never changed; an accuracy of 1.0, a
  ratio of counts such as 29/30, or a score written to few digits repeats on a converged run
  and says nothing).

A metric's level is not judged (an accuracy near chance from the start may be a hard task), nor
are rewards, returns and KLs (an RL log's, `analyze/rl_log.py`), nor a training accuracy (named
so, or logged on the rows of the LR or the gradient norm: it swings with each batch). A log
with a loss under any name is the loss's to judge.
"""

from __future__ import annotations

import bisect
import math
import re
from fractions import Fraction

from trainguard.analyze.judge import EXPLOSION, SLOW, Judgement
from trainguard.analyze.log import CANONICAL, GRAD_NORM, LOSS, LR, Log, is_train_loss
from trainguard.analyze.stall import significant_digits
from trainguard.detect.metric_collapse import (
    QUALITY,
    QUALITY_PREFIXES,
    is_quality_metric,
    lower_is_better,
    within_cliff,
)
from trainguard.events import Event
from trainguard.vocabulary import DEGRADED, RECOVERED, STALLED

NOT_JUDGED = frozenset({"reward", "rewards", "return", "returns", "kl", "train", "training",
                        "batch"})
"""Words of metrics left to other rules: an RL trainer's rewards, returns and KLs move with the
policy's exploration; a training (or a batch's) accuracy swings with each batch."""
NOT_ENOUGH = frozenset({"score", "loss", "nll"})
"""Quality words that say nothing alone: a score of any kind (`f1_score` says F1), and a loss
(the loss's rules', `analyze/judge.py`)."""
SUDDEN = 0.8
"""A cliff whose value before it was at least this share of the best (or at most its inverse,
for a lower-is-better metric) came in one evaluation: an explosion, not a slide."""
FROZEN_EVALS = 5
"""Evaluations a metric must repeat its value on to say that the outputs never changed..."""
FROZEN_DIGITS = 6
"""...written with this many significant digits or more (a rounded score repeats on a plateau),
and no ratio of counts (`RATIO_OF_COUNTS`): 29 right of 30, 0.9666666666666667, repeats on a
small validation set whose predictions settled."""
RATIO_OF_COUNTS = 100_000
"""The largest denominator a value is tested against as a ratio of counts (or a percentage)."""
FEW_COUNTS = 1000
"""...and, to a float32's or six digits' precision, this one (a validation set of up to 1000)."""
EARLY = 0.1
"""A best before a cliff under this share of the metric's best over the log (over its inverse,
lower-is-better) is a model that had learned nothing yet: an mAP of 0.0005 before it reaches
0.3 swings by halves."""
HELD = 2
"""Evaluations within `SUDDEN` of the best before a cliff, the best among them (`_cliff` keeps
the best two): a level the metric held, not one noisy value (an mAP of 0.02 then 0.008 on a
model that has learned nothing yet is no fall)."""


def judged_metrics(log: Log) -> dict[str, tuple[list[int], list[float]]]:
    """The quality metrics of a log without a loss, by name: (rows, finite values), in order of
    rows (the evaluations' own, at the row of their step or the one before)."""
    if not log.steps or log.has(LOSS) or any(is_train_loss(name) for name in log.series):
        return {}
    found: dict[str, tuple[list[int], list[float]]] = {}
    training = {row for name in (LR, GRAD_NORM) if log.series.holds(name)
                for row in log.series.points(name)[0]}
    for name in log.series:
        if name in CANONICAL or not judges(name):
            continue
        rows, values = log.series.points(name)
        if 2 * sum(row in training for row in rows) > len(rows):
            continue  # a training row's metric (its LR beside it): a batch's, which swings
        kept = [(r, v) for r, v in zip(rows, values, strict=True)
                if v is not None and math.isfinite(v)]
        if kept:
            found[name] = ([r for r, _ in kept], [v for _, v in kept])
    for step, metrics in log.evals:
        row = max(bisect.bisect_right(log.steps, step) - 1, 0)  # (steps never go back)
        for name, value in metrics.items():
            if judges(name) and math.isfinite(value) and name not in log.series:
                rows, values = found.setdefault(name, ([], []))
                rows.append(row)
                values.append(value)
    return found


def judges(name: str) -> bool:
    """A quality metric by a word that says which (an accuracy, an IoU, an error rate, FID),
    none of `NOT_JUDGED`'s."""
    words = set(re.split(r"[^a-z0-9]+", name.lower()))
    quality = {w for w in words if w in QUALITY or w.startswith(QUALITY_PREFIXES)}
    return (is_quality_metric(name) and bool(quality - NOT_ENOUGH)
            and NOT_JUDGED.isdisjoint(words))


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
    lasting = [(n, b) for _, n, _, b in cliffs if not within_cliff(n, metrics[n][1][-1], b)]
    if not lasting:
        last = values[-1]
        ending = (f"{name} ends at {last:.4g}, back within the cliff's bound of its best "
                  f"{best:.4g}; the log holds no loss")
        return Judgement(RECOVERED, kind, row, [event], ending=ending)
    still, its_best = lasting[0]
    ending = (f"{still} is still off its best {its_best:.4g} at its last value "
              f"{metrics[still][1][-1]:.4g}: the log holds no loss, and its quality metric "
              "shows no recovery (with no training value beside it, no cause is ranked)")
    return Judgement(DEGRADED, kind, row, [event], ending=ending)


def _cliff(name: str, values: list[float]) -> tuple[int, float] | None:
    """The first value of a metric off a cliff from its best so far: (its index, the best).
    That best is a level the metric held (`HELD` = 2: the runner-up so far within `SUDDEN` of
    it) or the cliff lasts (the next value is off too), and it stood within `EARLY` of the
    metric's best over the log (values before the model learned anything are noise). One pass,
    the best two values kept."""
    lower = lower_is_better(name)
    sign = -1.0 if lower else 1.0  # the two largest of sign x value are the best two
    overall = sign * max(sign * v for v in values)
    best, second = sign * values[0], -math.inf
    for k, value in enumerate(values[1:], start=1):
        top = sign * best
        if top > 0 and not within_cliff(name, value, top) and _early_enough(lower, top, overall):
            held = (second >= sign * top / SUDDEN) if lower else (second >= SUDDEN * top)
            lasts = k + 1 < len(values) and not within_cliff(name, values[k + 1], top)
            if held or lasts:
                return k, top
        signed = sign * value
        if signed > best:
            best, second = signed, best
        elif signed > second:
            second = signed
    return None


def _early_enough(lower: bool, top: float, overall: float) -> bool:
    """Whether the best before a cliff stood within `EARLY` of the metric's best over the log."""
    return top <= overall / EARLY if lower else top >= EARLY * overall


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
                or significant_digits(values[0]) < FROZEN_DIGITS
                or _ratio_of_counts(values[0])):
            return None
        said.append(f"{name} {values[0]:.10g}")
    rows = next(iter(metrics.values()))[0]
    count = len(rows)
    return Judgement(STALLED, None, rows[0], ending=(
        f"{' and '.join(said)} at each of {count} evaluations, to every digit written: the "
        "model scores the held-out data the same way each time, its outputs never changed"))


def _ratio_of_counts(value: float) -> bool:
    """Whether `value` is a share of whole counts (or a percentage of one): up to
    `RATIO_OF_COUNTS` to two units of the float's last place (0.9666666666666667 is 29/30; a
    value that is no such ratio is some 1e-10 from the nearest one), or up to
    `FEW_COUNTS` to the precision a float32 or six printed digits keep (0.9666666388511658,
    0.966667)."""
    for scaled in (value, value / 100):
        if not 0.0 <= scaled <= 1.0:  # a share of counts, or a percentage of one
            continue
        near = Fraction(scaled).limit_denominator(RATIO_OF_COUNTS)
        if abs(float(near) - scaled) <= 2 * math.ulp(scaled):
            return True
        few = Fraction(scaled).limit_denominator(FEW_COUNTS)
        if abs(float(few) - scaled) <= 6e-7:
            return True
    return False
