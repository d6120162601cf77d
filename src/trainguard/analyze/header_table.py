"""A table of named columns pasted as text: a header line of names, then rows of numbers.

Chainer's `PrintReport` (`epoch  main/loss  validation/main/loss  main/accuracy ...`, then the
numbers aligned under them), a CSV file's lines pasted under a line of prose (`epoch,loss,ppl,
accuracy`, then `0, 9.15762, 9486.43847,0.014`) and other printed tables read alike:

- fields are split at commas, tabs, or runs of two or more spaces;
- a header is a line of at least two fields, none of them a number, one naming a loss (of the
  training or of an evaluation: `main/loss`, `validation/main/loss`);
- its rows are the lines after it with as many fields, every one a number (`nan` and `inf`
  included) or a duration or a timestamp (fastai's `time` column, `00:05`; a `created_at`
  column's `2020-02-03 16:53:44.934109`: passed over), and after them a row may print an
  elapsed time the header does not name (`0.004 | 100 | 6.25 | 2 days, 12:04:16.416641`,
  a `timedelta`); a line of another shape between them is passed over, and a header printed
  again starts the table again under its names;
- a column named as a counter (`epoch`, `iteration`, `step`...) whose whole numbers go up numbers
  the rows, named as it is (the first such, in that order: an HF model card's `Epoch` of
  fractions leaves its `Step`); otherwise they are numbered from 1;
- a markdown table (`| Training Loss | Epoch | Step | Validation Loss |`, the Trainer's table in
  a model card) is split at its bars, its rule line passed over, `**bold**` cells read, and a
  cell of `No log` holds no value;
- an HTML table (a notebook's saved output: the HF Trainer's progress table, a DataFrame) is
  read as the markdown one, a row (`<tr>`) of `<th>` and `<td>` cells at a time;
- a logger's prefix before the fields (`2024-08-19 13:28:48,101 INFO [name] logger : `, up to
  the line's last ` : ` or `] `) is not part of them;
- a column of phase words (fastai's miniai `MetricsCB`: `train` and `eval` under `train`)
  says which rows are evaluations: each is the evaluation at its own count (the epoch it
  names), or of the training row before it where it names none;
- columns that take turns (never both a number on one row: a training row and a validation
  row, each writing `nan` in the other's column) write `nan` as a placeholder: a `nan` in one of
  them on a row where the other holds a number is no value. A `nan` on a row where no such
  partner holds one is read as the `nan` it is.

Values go where their names say (`validation/...` and `val_...` are evaluations), as in the
trackers' files.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable, Iterator

from trainguard.analyze.log import LOSS, LogBuilder, is_eval_name, is_train_loss, number

SPLIT = re.compile(r"[ \t]*[,|][ \t]*|\t+|[ \t]{2,}")
RULE = re.compile(r"^\s*\|?(?:\s*:?-{3,}:?\s*\|)+\s*:?-*:?\s*$")
"""A markdown table's rule under its header (`|:---:|:---:|`): no row."""
NO_VALUE = frozenset({"no log", "-", ""})
"""A cell that holds no value: the HF Trainer's `No log` (a training loss not logged yet when
the evaluation ran), a dash."""
PREFIX = re.compile(r"^.*(?:\s:\s|\]\s)")
"""A logger's prefix before the fields: everything up to the line's last ` : ` or `] `."""
CLOCK = re.compile(r"(?:\d{4}-\d{2}-\d{2}[ T])?\d+:\d{2}(?::\d{2})?(?:\.\d+)?"
                   r"(?:Z|[+-]\d{2}:?\d{2})?")
"""A duration, a time of day or a date and time (fastai's `time` column, `00:05`; a logger's
`created_at`, `2020-02-03 16:53:44.934109`): a field with no value, passed over."""
DURATION = re.compile(r"\d+(?:\.\d+)?\s?(?:ms|s|sec|min|h|days?)", re.IGNORECASE)
"""A duration with its unit (nolearn's `dur` column, `0.6s`; a `timedelta`'s `2 days`): passed
over like a clock."""
FEWEST_ROWS = 5
"""Rows of numbers under a header for the lines to be read as a table."""
HTML_ROW = re.compile(r"<tr[\s>]", re.IGNORECASE)
HTML_ROW_END = re.compile(r"</tr\s*>", re.IGNORECASE)
HTML_CELL = re.compile(r"<t([hd])\b[^>]*>(.*?)</t\1\s*>", re.IGNORECASE | re.DOTALL)
TAG = re.compile(r"<[^>]*>")
HTML_ROW_CHARS = 20_000
"""An HTML row still open after this many characters is no table row."""
PHASES = {"train": False, "training": False, "eval": True, "evaluation": True, "valid": True,
          "validation": True, "val": True, "test": True}
"""A cell that names the phase its row was measured in (fastai's miniai `MetricsCB` prints a
`train` column of `train` and `eval`): True for an evaluation's row, which is no training row
but the evaluation of the training row before it."""
COUNTER_NAMES = ("epoch", "iteration", "iter", "step", "global_step", "batch", "update",
                 "updates", "num_updates")
"""Column names that number the rows (the first one present is used)."""


def _fields(line: str) -> list[str]:
    text = line.strip()
    if text.startswith("|"):  # a markdown table's row: its cells, empty ones kept
        return [cell.strip().strip("*").strip() for cell in text.strip("|").split("|")]
    return [field for field in SPLIT.split(PREFIX.sub("", line).strip()) if field]


def _is_header(fields: list[str]) -> bool:
    if len(fields) < 2 or any(number(field) is not None for field in fields):
        return False
    return any(field == LOSS or is_train_loss(field)
               or (is_eval_name(field) and "loss" in field.lower()) for field in fields)


def read_rows(lines: Iterable[str], log: LogBuilder) -> int:
    """Add the rows of the tables among `lines` to `log`; the number of rows read (0 when there
    are fewer than `FEWEST_ROWS`)."""
    header: list[str] | None = None
    read: list[tuple[list[str], list[float]]] = []
    evaluations: list[tuple[int, list[str], list[float]]] = []  # (training row before, ...)
    for line in _html_rows(lines):
        fields = _fields(line)
        if _is_header(fields):
            header = fields
            continue
        if header is None:
            continue
        if len(fields) > len(header) and all(CLOCK.fullmatch(field) or DURATION.fullmatch(field)
                                             for field in fields[len(header):]):
            fields = fields[:len(header)]  # an elapsed time printed after the values, unnamed
        if len(fields) != len(header):
            continue
        if RULE.match(line):
            continue
        kept = [(name, number(field)) for name, field in zip(header, fields, strict=True)
                if not CLOCK.fullmatch(field) and not DURATION.fullmatch(field)
                and field.lower() not in NO_VALUE and field.lower() not in PHASES]
        if not kept or any(value is None for _, value in kept):
            continue
        cells = ([name for name, _ in kept], [value for _, value in kept if value is not None])
        if any(PHASES.get(field.lower()) for field in fields):  # an evaluation's row
            if read:
                evaluations.append((len(read) - 1, *cells))
            continue
        read.append(cells)
    if len(read) < FEWEST_ROWS:
        return 0
    rows: list[tuple[list[str], int | None, list[float]]] = []
    for name in COUNTER_NAMES:  # the first counter column that numbers every row
        rows = [(names, _column(names, name), values) for names, values in read]
        if _counted(rows):
            break
    counted = _counted(rows)
    turns = _taking_turns(rows)
    steps: list[int] = []
    for index, (names, column, values) in enumerate(rows):
        if counted and column is not None:
            step = int(values[column])
            label = f"{names[column].lower()} {step}"
        else:
            step, label = index + 1, f"row {index + 1}"
        steps.append(step)
        log.add_values(step, [(name, value) for i, (name, value)
                              in enumerate(zip(names, values, strict=True))
                              if i != column and not _placeholder(name, value, names, values,
                                                                  column, turns)],
                       label=label)
    counter = rows[0][0][rows[0][1]] if counted and rows[0][1] is not None else None
    for after, names, values in evaluations:  # at its own count where it has one
        own = names.index(counter) if counter in names else None
        log.add_eval(int(values[own]) if own is not None else steps[after],
                     {name if is_eval_name(name) else f"eval_{name}": value
                      for name, value in zip(names, values, strict=True)
                      if name.lower() not in COUNTER_NAMES})
    if counted:
        names, column, _ = rows[0]
        assert column is not None
        log.step_unit = names[column].lower()
    else:
        log.step_unit = "row"
        log.notes.append("the table has no counter column: rows are numbered from 1")
    return len(rows)


def _html_rows(lines: Iterable[str]) -> Iterator[str]:
    """`lines`, with each row of an HTML table among them (`<tr>` to `</tr>`, over one line or
    several) given as one markdown row of its cells' text: a notebook saved with its output keeps
    the HF Trainer's progress table, or a DataFrame, so."""
    pending: str | None = None
    for line in lines:
        if pending is None:
            start = HTML_ROW.search(line)
            if start is None:
                yield line
                continue
            pending = line[start.start():]
        else:
            pending += line
        while pending is not None and (end := HTML_ROW_END.search(pending)) is not None:
            cells = [html.unescape(TAG.sub("", cell.group(2))).strip().replace("|", "/")
                     for cell in HTML_CELL.finditer(pending[:end.end()])]
            if cells:
                yield "| " + " | ".join(cells) + " |"
            rest = pending[end.end():]
            start = HTML_ROW.search(rest)
            pending = None if start is None else rest[start.start():]
        if pending is not None and len(pending) > HTML_ROW_CHARS:  # never closed
            pending = None


def _column(names: list[str], counter: str) -> int | None:
    lowered = [name.lower() for name in names]
    return lowered.index(counter) if counter in lowered else None


def _counted(rows: list[tuple[list[str], int | None, list[float]]]) -> bool:
    """Whether every row has a counter column of whole numbers that go up from row to row."""
    last: float | None = None
    for _, column, values in rows:
        if column is None:
            return False
        value = values[column]
        if not float(value).is_integer() or (last is not None and value <= last):
            return False
        last = value
    return True


def _taking_turns(rows: list[tuple[list[str], int | None, list[float]]]) -> set[frozenset[str]]:
    """The pairs of columns (the counter aside) that are never both a number on one row, each
    a number on some row."""
    finite: dict[str, set[int]] = {}
    for index, (names, column, values) in enumerate(rows):
        for i, (name, value) in enumerate(zip(names, values, strict=True)):
            if i != column:
                cells = finite.setdefault(name, set())
                if math.isfinite(value):
                    cells.add(index)
    named = [name for name, cells in finite.items() if cells]
    return {frozenset((a, b)) for n, a in enumerate(named) for b in named[n + 1:]
            if not finite[a] & finite[b]}


def _placeholder(name: str, value: float, names: list[str], values: list[float],
                 column: int | None, turns: set[frozenset[str]]) -> bool:
    """A `nan` written in a column whose partner in turn-taking holds a number on this row."""
    if not math.isnan(value):
        return False
    return any(i != column and math.isfinite(other) and frozenset((name, partner)) in turns
               for i, (partner, other) in enumerate(zip(names, values, strict=True)))
