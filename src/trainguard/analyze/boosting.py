"""The training consoles of gradient-boosting libraries: one line per boosting iteration.

    CatBoost   `0:	learn: 0.6820	test: 0.6825	best: 0.6825 (0)	total: 52ms	remaining: 52s`
               (`test:` and `best:` only with an evaluation set); the line names no metric
    XGBoost    `[0]	train-rmse:17.12	eval-rmse:17.20` (`<set>-<metric>:<value>`, a pair per
               evaluation set and metric)
    LightGBM   `[10]	training's l2: 0.23	valid_1's l2: 0.25` (`<set>'s <metric>: <value>`)

The training set's value (CatBoost's `learn`, the set XGBoost or LightGBM names `train` or
`training`) is the training row; the other sets are evaluations. A metric that is a loss (RMSE,
log loss, an error rate) is the loss; one where higher is better (AUC, NDCG, MAP, accuracy) is
kept under its name, never read as a loss. XGBoost and LightGBM name the metric; CatBoost does
not, and its `best:` column says which way it goes: the best evaluation so far is the running
minimum of a loss and the running maximum of a score. A line whose iteration is not after the
last one read (the best iteration repeated after early stopping) is passed over. A console with
evaluation sets only (XGBoost's scikit-learn API names them `validation_0`, `validation_1`) is
judged on the first one, as a note says.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from trainguard.analyze.log import LOSS, LogBuilder, number
from trainguard.analyze.pasted import NUM

_CATBOOST = re.compile(rf"^\s*(\d+):\s+learn:\s*({NUM})((?:\s+test\d*:\s*{NUM})*)"
                       rf"(?:\s+best:\s*({NUM})\s*\(\d+\))?\s+total:", re.IGNORECASE)
_CATBOOST_TEST = re.compile(rf"test(\d*):\s*({NUM})", re.IGNORECASE)
_ITERATION = re.compile(r"^\s*\[(\d+)\]\s+(.*)$")
_XGBOOST_PAIR = re.compile(rf"(?<![\w.])([\w.]+)-([\w@.+-]+?):({NUM})(?=\s|$)", re.IGNORECASE)
_LIGHTGBM_PAIR = re.compile(rf"(?<![\w.])([\w.]+)'s\s+([\w@.+-]+):\s*({NUM})(?=\s|$)",
                            re.IGNORECASE)
"""(A name starts where no word character is before it: a long run of them is tried once, not
from each of its characters.)"""
_TRAINING_SETS = frozenset({"train", "training", "learn"})
_HIGHER = re.compile(r"^(auc|aucpr|average_precision|ndcg|map|accuracy|pre|"
                     r"interval-regression-accuracy)(@|$)", re.IGNORECASE)
"""Metrics of the three libraries where higher is better; the others are losses and errors."""


def read_rows(lines: Iterable[str], log: LogBuilder) -> int:
    """Add one row per boosting iteration to `log`; the number of rows."""
    rows: list[tuple[int, list[tuple[str, float]], list[tuple[str, float]]]] = []
    best: list[tuple[float, float]] = []  # CatBoost: (the test value, the best so far)
    for line in lines:
        parsed = _catboost(line, best) or _paired(line)
        if parsed is not None and (not rows or parsed[0] > rows[-1][0]):
            rows.append(parsed)
    if len(rows) < 2:
        return 0
    score = _catboost_score(best)
    judged = None if any(train for _, train, _ in rows) else _first_set(rows)
    has_loss = False
    for step, train, evals in rows:
        if judged is not None:  # no training set: the first evaluation set is what is judged
            train = [(metric.rpartition("/")[2], value) for metric, value in evals
                     if metric.rpartition("/")[0] == judged]
            evals = [(metric, value) for metric, value in evals
                     if metric.rpartition("/")[0] != judged]
        named = _named(train, score) + [
            (f"eval_{name}", value) for name, value in _named(evals, score)]
        has_loss = has_loss or any(name == LOSS for name, _ in named)
        log.add_values(step, named, label=f"iteration {step}")
    if judged is not None:
        log.loss_is_evaluation = has_loss
        log.notes.append("the console logs evaluation sets only: the first one's values are "
                         "judged" + (", its loss read as the loss" if has_loss else
                                     " (no loss among them)"))
    else:
        log.notes.append(_note(rows, score))
    return len(rows)


def _first_set(rows: list[tuple[int, list[tuple[str, float]], list[tuple[str, float]]]]
               ) -> str:
    """The name prefix of the first evaluation set of the first row (`valid_0`, or empty where
    there is one set)."""
    first = rows[0][2]
    return first[0][0].rpartition("/")[0] if first else ""


def _catboost(line: str, best: list[tuple[float, float]]
              ) -> tuple[int, list[tuple[str, float]], list[tuple[str, float]]] | None:
    found = _CATBOOST.match(line)
    if found is None:
        return None
    learn = number(found.group(2))
    if learn is None:
        return None
    evals = []
    for test in _CATBOOST_TEST.finditer(found.group(3)):
        value = number(test.group(2))
        if value is not None:
            evals.append((f"test{test.group(1)}/:" if test.group(1) else ":", value))
    kept = number(found.group(4)) if found.group(4) is not None else None
    if kept is not None and evals:
        best.append((evals[0][1], kept))
    return int(found.group(1)), [(":", learn)], evals


def _paired(line: str) -> tuple[int, list[tuple[str, float]], list[tuple[str, float]]] | None:
    """An XGBoost or LightGBM line: the iteration, the training set's metrics, the others'."""
    found = _ITERATION.match(line)
    if found is None:
        return None
    rest = found.group(2)
    pairs = _LIGHTGBM_PAIR.findall(rest) or _XGBOOST_PAIR.findall(rest)
    if not pairs:
        return None
    train, evals = [], []
    sets = {name for name, _, _ in pairs}
    for name, metric, raw in pairs:
        value = number(raw)
        if value is None:
            return None
        if name.lower() in _TRAINING_SETS:
            train.append((metric, value))
        else:
            # several evaluation sets: each value under its set's name too
            prefix = f"{name}/" if len(sets - _TRAINING_SETS) > 1 else ""
            evals.append((prefix + metric, value))
    return int(found.group(1)), train, evals


def _catboost_score(best: list[tuple[float, float]]) -> bool:
    """Whether CatBoost's `best:` column followed the running maximum of its test values and
    not their running minimum: a score, not a loss."""
    low = high = None
    follows_min = follows_max = True
    for test, kept in best:
        low = test if low is None else min(low, test)
        high = test if high is None else max(high, test)
        follows_min = follows_min and kept == low
        follows_max = follows_max and kept == high
    return follows_max and not follows_min


def _named(values: list[tuple[str, float]], catboost_score: bool) -> list[tuple[str, float]]:
    """The names one side's values are kept under: each set's first loss metric (CatBoost's
    unnamed one, unless it is a score) as `loss`, the others under their own names (`mae`,
    `auc`, `score`); a set's name before its values where the side has several
    (`valid_1_loss`)."""
    named: list[tuple[str, float]] = []
    with_loss: set[str] = set()
    for metric, value in values:
        prefix, _, bare = metric.rpartition("/")
        if bare == ":":  # CatBoost's unnamed metric
            bare = "score" if catboost_score else LOSS
        if prefix not in with_loss and (bare == LOSS or (
                bare != "score" and _HIGHER.match(bare) is None)):
            with_loss.add(prefix)
            bare = LOSS
        named.append((f"{prefix}_{bare}" if prefix else bare, value))
    return named


def _note(rows: list[tuple[int, list[tuple[str, float]], list[tuple[str, float]]]],
          score: bool) -> str:
    """What the training set's values were read as, from the first row that has them."""
    train = next(train for _, train, _ in rows if train)
    if train[0][0] == ":":
        return ("CatBoost's learn value is read as a score (its best evaluation is the running "
                "maximum), not a loss" if score else "CatBoost's learn value is the training loss")
    names = [name for name, _ in _named(train, score)]
    if LOSS not in names:
        return "the training set logs scores only (higher is better): no training loss"
    return f"the training set's {train[names.index(LOSS)][0]} is read as the training loss"
