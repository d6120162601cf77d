"""Keras `CSVLogger` output: one line per epoch, `epoch,loss,...` (`training.log`, `history.csv`).

The header's first column is `epoch` (counted from 0, as Keras writes it) and there is no
`step` column: each line is the epoch's mean of the training metrics, `val_*` columns are the
evaluation at its end. Rows are named as Keras prints them, `epoch N`.
"""

from __future__ import annotations

import csv
from pathlib import Path

from trainguard.analyze.log import Log, LogBuilder, LogError, number
from trainguard.analyze.source import MAX_RECORD, Lines

FORMAT = "keras"


def is_header(line: str) -> bool:
    """A CSVLogger header: names separated by commas (or the separator Keras was given), the
    first `epoch`, none of them `step`."""
    names = [name.strip() for name in _split(line)]
    return len(names) >= 2 and names[0] == "epoch" and "step" not in names and all(names)


def _split(line: str) -> list[str]:
    for separator in (",", ";", "\t"):
        if separator in line:
            return line.split(separator)
    return [line]


def read(path: str | Path) -> Log:
    path = Path(path)
    lines = Lines(path, errors="strict", skip_long=False, max_line=MAX_RECORD)
    each = iter(lines)
    try:
        first = next(each, "")
    except UnicodeDecodeError:
        raise LogError(f"{path}: not a CSV file (not UTF-8 text)") from None
    if not is_header(first):
        raise LogError(f"{path}: not a Keras CSVLogger file (its header does not begin with "
                       f"'epoch': {first.strip()[:60]!r})")
    separator = next((s for s in (",", ";", "\t") if s in first), ",")
    header = [name.strip() for name in first.split(separator)]
    records = csv.reader(each, delimiter=separator)
    log = LogBuilder(path, FORMAT, step_unit="epoch")
    number_ = 1
    try:
        for fields in records:
            number_ += 1
            if not fields:
                continue
            if len(fields) != len(header):
                log.notes.append(f"line {number_} has {len(fields)} fields, the header "
                                 f"{len(header)}; it is left out")
                continue
            epoch = number(fields[0])
            if epoch is None or epoch != int(epoch):
                raise LogError(f"{path}: line {number_}: the epoch {fields[0]!r} is not a "
                               "whole number")
            log.add_values(int(epoch), ((header[i], fields[i]) for i in range(1, len(header))
                                        if fields[i].strip()))
    except UnicodeDecodeError:
        raise LogError(f"{path}: not a CSV file (not UTF-8 text)") from None
    except csv.Error as exc:
        raise LogError(f"{path}: not a valid CSV file ({exc})") from None
    return log.build(what="training values (no row with a training metric)")
