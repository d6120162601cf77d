"""The loss against chance: a classifier that forgot everything sits at ln(num_classes).

A model that predicts the same distribution for every input scores a cross-entropy of ln(k) on k
balanced classes (0.693 for 2, 1.386 for 4, 10.37 for a 32k vocabulary guessed uniformly). Two
readings of the logged loss use it:

- **back to chance**: the loss settled at ln(k) (within `TOLERANCE`, over the last quarter of
  the rows, and without falling there) after it had been clearly below that level: the model
  learned and then collapsed to a constant prediction. k is `num_classes` when given, else, for
  a log whose metrics show a classifier (an accuracy, an F1: `is_classifier`), the k in
  2..`MAX_GUESSED_CLASSES` nearest the plateau (beyond a handful of classes every loss is near
  the log of some whole number, so that says nothing). A language model's loss is never read
  this way: its chance level is ln(vocabulary). The trouble began at the first row after the
  last one clearly below the plateau.
- **above any chance level**: a cross-entropy (the log reports a perplexity, so it is one) above
  ln(`MAX_CLASSES`) is worse than a uniform guess over any vocabulary in use: the weights blew up.
  So is a classification loss the log names as one (`loss_cls`, `CELoss`, `loss_ce`, `xent`:
  `is_classification_loss`) that is above it on every row the log holds of it, two at least:
  worse than chance from the first row to the last, it never came down to where any classifier
  starts (a start that high that then comes down below it is left to the other rules).
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass

from trainguard.analyze.log import LOSS, Log, is_bookkeeping, is_eval_name, is_train_loss
from trainguard.chance_level import chance_loss

TOLERANCE = 0.05
"""How near ln(k) the plateau's median must be, and how far below it a row is "clearly below"."""
LEARNED = 0.9
"""The run had learned when its loss was once below this share of the plateau."""
MAX_GUESSED_CLASSES = 8
MAX_CLASSES = 2 ** 20
"""More classes than any tokenizer in common use has (the largest have about 256k)."""


@dataclass(frozen=True, slots=True)
class AtChance:
    row: int
    """The first row of the plateau at chance."""
    level: float
    """The plateau's median loss."""
    classes: int
    chance: float
    """ln(classes)."""
    guessed: bool
    """Whether `classes` was guessed from the plateau (no num_classes given)."""
    best: float
    """The lowest loss before the collapse."""

    def describe(self) -> str:
        source = "" if not self.guessed else " (the class count guessed from the plateau)"
        return (f"the loss went back to {self.level:.4g} = ln {self.classes} = chance level for "
                f"{self.classes} classes{source} after it had reached {self.best:.4g}: the model "
                "collapsed to a constant prediction")


def is_classifier(log: Log) -> bool:
    """The log reports a classifier's metrics (an accuracy, an F1): its loss may be compared
    with ln(k) for a guessed k. A language model's chance level is ln(vocabulary), so a loss
    that happens to sit near ln 2, ln 3 or ln 4 says nothing there."""
    names = list(log.series) + [name for _, metrics in log.evals for name in metrics]
    return any(_CLASSIFIER_METRIC.search(name) for name in names)


ACCURACY = re.compile(r"(?<![a-z])(acc|accuracy)(?![a-z])", re.IGNORECASE)
"""A metric that counts right predictions by name (`acc`, `val_accuracy`, `test accuracy`)."""
_CLASSIFIER_METRIC = re.compile(r"(?<![a-z])(acc|accuracy|f1|auroc|auc|precision|recall|mcc)"
                                r"(?![a-z])", re.IGNORECASE)


def back_to_chance(losses: list[float | None], num_classes: int | None = None, *,
                   guess: bool = True) -> AtChance | None:
    """`guess`: whether k may be guessed from the plateau when `num_classes` is not given (only
    for a classifier, `is_classifier`)."""
    if num_classes is None and not guess:
        return None
    rows = [(i, v) for i, v in enumerate(losses) if v is not None and math.isfinite(v) and v > 0]
    if len(rows) < 8:
        return None
    tail = [v for _, v in rows[-max(3, len(rows) // 4):]]
    level = statistics.median(tail)
    if num_classes is not None:
        classes, guessed = num_classes, False
    else:
        classes = min(range(2, MAX_GUESSED_CLASSES + 1), key=lambda k: abs(chance_loss(k) - level))
        guessed = True
    chance = chance_loss(classes)
    if abs(level - chance) > TOLERANCE * chance:
        return None
    half = len(tail) // 2
    if statistics.median(tail[half:]) < (1 - TOLERANCE) * statistics.median(tail[:half] or tail):
        return None  # still falling: learning, not sitting at chance
    below = [k for k, (_, v) in enumerate(rows) if v < (1 - TOLERANCE) * level]
    if not below or below[-1] + 1 >= len(rows):
        return None
    best = min(v for _, v in rows[:below[-1] + 1])
    if best > LEARNED * level:
        return None
    return AtChance(row=rows[below[-1] + 1][0], level=level, classes=classes, chance=chance,
                    guessed=guessed, best=best)


def above_any_chance(losses: list[float | None]) -> int | None:
    """The first row of a cross-entropy above ln(MAX_CLASSES), if the loss starts there."""
    ceiling = chance_loss(MAX_CLASSES)
    for i, value in enumerate(losses):
        if value is None or not math.isfinite(value):
            continue
        return i if value > ceiling else None
    return None


_SAYS_CROSS_ENTROPY = re.compile(r"(?<![a-z])(?:ce|xent|cross_?entropy)(?![a-z])|celoss",
                                 re.IGNORECASE)
_SAYS_CLASSIFICATION = re.compile(r"(?<![a-z])cls(?![a-z])", re.IGNORECASE)


def is_classification_loss(name: str) -> bool:
    """A training series the log names as a cross-entropy (`CELoss`, `loss_ce`, `xent`,
    `categorical_cross_entropy`) or a classification loss (`loss_cls`, `s0.loss_cls`,
    `loss_rpn_cls`): a loss whose chance level is ln(classes), whatever the classes are."""
    lowered = name.lower()
    if ("ce" not in lowered and "cls" not in lowered and "xent" not in lowered
            and "cross" not in lowered):
        return False  # the common case, at a substring's cost: logs may hold 100k names
    says = _SAYS_CROSS_ENTROPY.search(name) is not None or (
        _SAYS_CLASSIFICATION.search(name) is not None and "loss" in lowered)
    return says and not is_eval_name(name) and not is_bookkeeping(name)


def always_above_any_chance(values: list[float]) -> bool:
    """Every value (two at least) finite and above ln(MAX_CLASSES): a classifier worse than a
    uniform guess over any number of classes on every row."""
    ceiling = chance_loss(MAX_CLASSES)
    return len(values) >= 2 and all(math.isfinite(v) and v > ceiling for v in values)


SATURATED = -math.log(1.1754943508222875e-38)
"""-ln of float32's smallest normal number (87.3365): the loss of a softmax whose true class's
probability underflowed, where Caffe's `SoftmaxWithLoss` and any log of a probability clamped
at that floor stop; a loss term that sits there has logits that blew up."""
SATURATED_ROWS = 2
SATURATED_TOLERANCE = 5e-5
"""Printed to six significant digits (Caffe's `87.3365`), float32's value is within this."""


def saturated(log: Log) -> tuple[int, str] | None:
    """The first row of the run of rows at `SATURATED` that ends a loss series of the log (the
    loss or a term: `loss_aux`), when the run holds `SATURATED_ROWS` rows or more, and the
    series' name; None otherwise. A saturated softmax stays saturated: a loss that passes
    87.34 on its way down is no such run. (A weighted sum of terms passes 87.34 without any
    term saturated: the term's own rows say when.)"""
    for name in log.series:
        if name != LOSS and not is_train_loss(name):
            continue
        rows, values = log.series.points(name)
        run = 0
        while run < len(values) and abs(values[-1 - run] - SATURATED) < SATURATED_TOLERANCE:
            run += 1
        if run >= SATURATED_ROWS:
            return rows[-run], name
    return None
