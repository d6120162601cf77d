"""R's printed numeric vectors: a name (`> history$metrics$loss`, `$loss`), then its values.

R prints a numeric vector over lines that each start with the position of their first value in
brackets, `[1] 0.69 0.52 0.47 ...`, then `[9] ...` on the next line. Keras for R keeps one such
vector per metric (`history$metrics$loss`, `$val_loss`), mxnet's `mx.metric.logger` two
(`log$train`, the training metric of each epoch, and `log$eval`), and a loop may keep its own
(`losses`). Each vector is named by the line before its first value, an R prompt's expression
(`> log$train`: the last `$` name) or a list element's heading (`$loss`); its k-th value is epoch
k. A vector named as a training loss is the loss; evaluations (`val_*`, `eval`, `valid`, `test`)
are each epoch's evaluation. With no loss among the names, mxnet's logger's `train` vector (its
training metric: the loss or an error the run minimises) is read as the loss when it ends no
higher than it began (an accuracy, the other metric such a logger keeps, rises), said in a note.
`NA` is a value missing. Printing the same vector again (from `[1]`) restarts it: the last print
is read.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from trainguard.analyze.log import LOSS, LogBuilder, is_eval_name, is_train_loss, number
from trainguard.analyze.pasted import DIGITS

_NAME = re.compile(r"^\s*(?:>\s*)?([A-Za-z.][\w.]*(?:\$[A-Za-z.][\w.]*)*|(?:\$[A-Za-z.][\w.]*)+)"
                   r"\s*`*\s*$")
"""`> log$train`, `> losses`, `$val_loss`, `$metrics$loss` (a list element's heading)."""
_VALUE = rf"(?:{DIGITS}|NA|NaN|-?Inf)"
"""One value as R prints it: `NA` is a missing one, `NaN` and `Inf` are kept as such."""
_VALUES = re.compile(rf"^\s*\[(\d+)\]((?:[ \t]+{_VALUE})+)[ \t]*`*\s*$", re.IGNORECASE)
"""`[17] 0.0009034858 0.0009034850` (a markdown backtick left at its end is no value)."""
EVALUATIONS = frozenset({"eval", "evaluation", "val", "valid", "validation", "test"})
TRAIN = "train"
"""mxnet's `mx.metric.logger`'s vector of the training metric."""


def read_rows(lines: Iterable[str], log: LogBuilder) -> int:
    """Add one row per epoch of the printed vectors to `log`; the epochs with a training
    value (0 when the lines hold no named vector of a loss, or of `train`)."""
    vectors: dict[str, list[str]] = {}
    name: str | None = None
    for line in lines:
        values = _VALUES.match(line)
        if values is None:
            heading = _NAME.match(line)
            if heading is not None:
                name = heading.group(1).rsplit("$", 1)[-1]
            elif line.strip():
                name = None  # anything else between a name and its values: not its vector
            continue
        if name is None:
            continue
        at, found = int(values.group(1)), values.group(2).split()
        kept = vectors.setdefault(name, [])
        if at == 1:
            kept.clear()  # printed again: the last print
        if at != len(kept) + 1:  # a gap: the lines are not one vector's, none of it is read
            del vectors[name]
            name = None
            continue
        kept.extend(found)
    losses = [n for n in vectors if (n == LOSS or is_train_loss(n)) and len(vectors[n]) >= 2]
    if not losses and _falls(vectors.get(TRAIN, [])):
        losses = [TRAIN]
        log.notes.append("the vector `train` (mxnet's metric logger: the training metric, which "
                         "falls here as a loss or an error does) is read as the training loss")
    if not losses:
        return 0
    evaluations = [n for n in vectors
                   if n not in losses and (n.lower() in EVALUATIONS or is_eval_name(n))]
    epochs = max(len(vectors[n]) for n in losses)
    for epoch in range(epochs):
        row = {LOSS if n == TRAIN else n: value for n in losses
               if epoch < len(vectors[n]) and (value := _number(vectors[n][epoch])) is not None}
        if row:
            log.add_values(epoch + 1, row.items())
        log.add_eval(epoch + 1, {n: value for n in evaluations if epoch < len(vectors[n])
                                 and (value := _number(vectors[n][epoch])) is not None})
    return epochs


def _falls(values: list[str]) -> bool:
    """Whether a metric ends no higher than it began (two numbers at least): a loss or an
    error the run minimises, not an accuracy."""
    found = [v for v in (_number(value) for value in values) if v is not None]
    return len(found) >= 2 and found[-1] <= found[0]


def _number(value: str) -> float | None:
    """A value as R prints it (`NA`: None; `Inf`, `-Inf` and `NaN` as such)."""
    return None if value.upper() == "NA" else number(value)
