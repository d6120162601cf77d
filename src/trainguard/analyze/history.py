"""Keras's `History.history` printed: `{'loss': [0.69, 0.52, ...], 'val_loss': [...], ...}`.

`model.fit` returns a `History` whose `history` dict holds one list per metric, one value per
epoch; people print it (`print(history.history)`) and paste the dict, on one line or spread over
several, often cut off at the end of what they copied. Each list is read up to where it ends,
its first value epoch 1 as Keras's console counts them (`Epoch 1/10`): the metrics named
`val_*` are the evaluation at each epoch's end, the others the epoch's training means (`loss`
the loss). The dict must name a loss with at least two values; a list cut off inside a number
keeps the values before it; a history printed again as it grew is read at its last print. It
competes with the generic grammar on rows read (a console with one such dict at its top is the
console's).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from trainguard.analyze.log import LogBuilder, number
from trainguard.analyze.pasted import NUM

MAX_CHARS = 1 << 21
"""At most this much of a file is read for the dict: a history print is a few lists of one
number per epoch, far smaller."""
_LIST = re.compile(rf"""(['"])([^'"\n]{{1,120}})\1\s*:\s*\[\s*({NUM}(?:\s*,\s*{NUM})*)(\s*,)?""",
                   re.IGNORECASE)
"""A key and its list of numbers, up to its `]` (or up to where a copy cut off inside it)."""
_VALUE = re.compile(NUM, re.IGNORECASE)
_CLOSE = re.compile(r"\s*\]")
"""A list's closing bracket (read where its numbers end, without copying the text after)."""
_LOSS = re.compile(r"(^|_)loss$", re.IGNORECASE)


def read_rows(lines: Iterable[str], log: LogBuilder) -> int:
    """Add one row per epoch of a printed `History.history` to `log`; the number of epochs
    with a training value (0 when the lines hold no such dict)."""
    text = _text(lines)
    if text is None:
        return 0
    columns: dict[str, list[str]] = {}
    repeated = False
    for match in _LIST.finditer(text):
        values = _VALUE.findall(match.group(3))
        if not match.group(4) and not _CLOSE.match(text, match.end()):
            values = values[:-1]  # the copy ends inside this list: its last number may be cut
        if len(values) >= 2:
            name = match.group(2).strip()
            repeated = repeated or name in columns
            columns[name] = values  # a history printed again as it grew: the last print
    if not any(_LOSS.search(name) and not name.startswith("val_") for name in columns):
        return 0
    if repeated:
        log.notes.append("the history is printed more than once: its last print of each "
                         "metric is read")
    epochs = max(len(values) for values in columns.values())
    found = 0
    for epoch in range(epochs):
        pairs = [(name, values[epoch]) for name, values in columns.items()
                 if epoch < len(values) and not name.startswith("val_")]
        evals = {name: value for name, values in columns.items()
                 if epoch < len(values) and name.startswith("val_")
                 and (value := number(values[epoch])) is not None}
        if pairs:
            found += 1
            log.add_values(epoch + 1, pairs)
        log.add_eval(epoch + 1, evals)
    return found


def _text(lines: Iterable[str]) -> str | None:
    """The lines joined, from the first one that opens a dict, up to `MAX_CHARS`; None when
    no line opens one with a list."""
    parts: list[str] = []
    size = 0
    for line in lines:
        if not parts:
            start = line.find("{")
            opened = line[start:]
            if start < 0 or not ("[" in opened or opened.rstrip().endswith("{")):
                continue
            line = opened
        parts.append(line.rstrip("\n"))
        size += len(line)
        if size >= MAX_CHARS:
            break
    return " ".join(parts) if parts else None
