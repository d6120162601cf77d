"""A chart's values as a tracker's web page exports them: one series a file, or a few runs'.

    tensorboard-csv   TensorBoard's "Download CSV" of one scalar: `Wall time,Step,Value`. The
                      value's name is the tag the file is named after (`run-version_0-tag-
                      train_loss.csv`: `train_loss`; a `/` in a tag is written `_`), else the
                      file's own name.
    wandb-csv         W&B's "Export panel data" CSV: `"Step","<run> - <metric>",...`, with the
                      lowest and highest of each sampled point (`__MIN`, `__MAX`) beside it;
                      an empty cell is a step the metric was not logged at. A file of several
                      runs' curves is read on the first run's, and says so.

Each value goes where its name says (a loss, an evaluation's `val_loss`, a gradient norm), as in
the trackers' own files. An export of evaluations alone is judged on the evaluation's loss (and
says so); one of evaluation metrics without a loss is refused with that reason.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from pathlib import Path

from trainguard.analyze.log import LOSS, Log, LogBuilder, LogError, is_eval_name, number
from trainguard.analyze.source import MAX_RECORD, Lines

TENSORBOARD = ("wall time", "step", "value")
_TAG = re.compile(r"-tag-(.+)$")
_RUN_METRIC = re.compile(r"^(.+?) - (.+)$")
ENVELOPE = ("__MIN", "__MAX")
"""The suffixes of a W&B export's columns of the lowest and highest value a point stands for."""


def kind_of(header: list[str]) -> str | None:
    """`tensorboard-csv` or `wandb-csv` for an export's header (its names as written), else
    None."""
    names = [name.strip() for name in header]
    if tuple(name.lower() for name in names) == TENSORBOARD:
        return "tensorboard-csv"
    if (len(names) >= 2 and names[0] == "Step"
            and all(_RUN_METRIC.match(name) for name in names[1:])):
        return "wandb-csv"
    return None


def sniff(first_line: str) -> str | None:
    """`kind_of` the header a file's first line is, if it is one."""
    if "," not in first_line:
        return None
    try:
        return kind_of(next(csv.reader([first_line.strip("\r\n")]), []))
    except csv.Error:
        return None


def read(path: str | Path) -> Log:
    path = Path(path)
    lines = Lines(path, errors="strict", skip_long=False, max_line=MAX_RECORD)
    records = csv.reader(lines)
    try:
        header = next(records, [])
        kind = kind_of(header)
        if kind is None:
            raise LogError(f"{path}: not a TensorBoard or W&B chart export (its header is "
                           f"{', '.join(header[:4])[:80]!r})")
        log = LogBuilder(path, kind)
        if kind == "tensorboard-csv":
            _tensorboard(path, records, log)
        else:
            _wandb([name.strip() for name in header], records, log)
    except UnicodeDecodeError:
        raise LogError(f"{path}: not a CSV file (not UTF-8 text)") from None
    except csv.Error as exc:
        raise LogError(f"{path}: not a valid CSV file ({exc})") from None
    return log.build(what="values")


def _tensorboard(path: Path, records: Iterator[list[str]], log: LogBuilder) -> None:
    tag = _TAG.search(path.stem)
    named = tag.group(1) if tag else path.stem
    log.notes.append(f"one scalar, {named!r} (from the file's name)")
    name = _as_judged([named], log)[0]
    for number_, fields in enumerate(records, start=2):
        if not fields:
            continue
        step, value = (number(fields[1]), number(fields[2])) if len(fields) == 3 else (None, None)
        if step is None or step != int(step) or value is None:
            raise LogError(f"{path}: line {number_} is not `wall time, step, value` "
                           f"({','.join(fields)[:60]!r})")
        log.add_values(int(step), [(name, value)])


def _as_judged(names: list[str], log: LogBuilder) -> list[str]:
    """The names the values are read under: as they are, but in an export of evaluations alone
    (a chart of `val_loss`) the evaluation's loss is the log's loss, and the log says so."""
    if any(not is_eval_name(name) for name in names):
        return names
    losses = [name for name in names if "loss" in name.lower()]
    if not losses:
        raise LogError(f"{log.path}: the export holds evaluation values only "
                       f"({', '.join(names)[:80]}): nothing of the training to judge")
    log.notes.append(f"the export holds no training loss: its evaluation loss {losses[0]!r} "
                     "is judged")
    log.loss_is_evaluation = True
    return [LOSS if name == losses[0] else name for name in names]


def _wandb(header: list[str], records: Iterator[list[str]], log: LogBuilder) -> None:
    parts = [_RUN_METRIC.match(name) for name in header[1:]]
    runs = list(dict.fromkeys(part.group(1) for part in parts if part))
    first = runs[0]
    keep = {i + 1: part.group(2) for i, part in enumerate(parts)
            if part and part.group(1) == first and not part.group(2).endswith(ENVELOPE)}
    keep = dict(zip(keep, _as_judged(list(keep.values()), log), strict=True))
    if len(runs) > 1:
        log.notes.append(f"{len(runs)} runs' curves in the file: the first, {first!r}, is read")
    for number_, fields in enumerate(records, start=2):
        if not fields:
            continue
        step = number(fields[0]) if len(fields) == len(header) else None
        if step is None or step != int(step):
            raise LogError(f"{log.path}: line {number_} is not a step and its values "
                           f"({','.join(fields)[:60]!r})")
        values = [(name, fields[i]) for i, name in keep.items() if fields[i].strip()]
        if values:
            log.add_values(int(step), values)
