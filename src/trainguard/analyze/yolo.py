"""The training console of Ultralytics YOLO (v8 and later) and YOLOv5: a header naming the loss
terms, then a progress line per update of the epoch.

    Epoch    GPU_mem   box_loss   cls_loss   dfl_loss  Instances       Size
    1/100      2.61G      1.234      2.345      1.456         32        640: 100%|####| 50/50 [...]

YOLOv5 names its terms `box obj cls` (older releases add `total`) and counts epochs from 0
(`0/299`); the columns between `GPU_mem` and `Instances`/`labels`/`targets` are the loss terms
either way. Each update prints the epoch's running mean so far (a terminal rewrites the line;
a log file keeps every update, split at `\\r`), so the epoch's row is its last update. The loss
is the sum of the terms (YOLOv5's `total` where printed): the trainer optimises their sum, and
a term alone can fall while another explodes. Rows are the epochs as printed (`epoch 1`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from trainguard.analyze.log import LOSS, LogBuilder, number
from trainguard.analyze.pasted import NUM

_HEADER = re.compile(r"^\s*Epoch\s+gpu_mem\s+(.+?)\s+(?:Instances|labels|targets)\s+"
                     r"(?:Size|img_size)\s*$", re.IGNORECASE)


def _row_pattern(terms: int) -> re.Pattern[str]:
    """An update of the epoch under a header of `terms` loss terms: the epoch of the total, the
    memory, the terms, the instances and the image size."""
    return re.compile(rf"^\s*(\d+)/(\d+)\s+\S+\s+((?:{NUM}\s+){{{terms}}})\d+\s+\d+(?::|\s|$)",
                      re.IGNORECASE)


def read_rows(lines: Iterable[str], log: LogBuilder) -> int:
    """Add one row per epoch (its last update) to `log`; the number of rows."""
    names: list[str] = []
    row: re.Pattern[str] | None = None
    epochs: dict[int, list[float]] = {}
    for raw in lines:
        for line in raw.split("\r"):
            header = _HEADER.match(line)
            if header:
                names = [_term(name) for name in header.group(1).split()]
                row = _row_pattern(len(names))
                continue
            found = row.match(line) if row is not None else None
            if found is None:
                continue
            read = [number(v) for v in found.group(3).split()]
            values = [v for v in read if v is not None]
            if len(values) == len(read):
                epochs[int(found.group(1))] = values
    if not epochs:
        return 0
    total = "total_loss" in names
    for epoch, values in sorted(epochs.items()):
        terms = dict(zip(names, values, strict=True))
        loss = terms["total_loss"] if total else math.fsum(terms.values())
        log.add_values(epoch, [(LOSS, loss), *terms.items()], label=f"epoch {epoch}")
    log.step_unit = "epoch"
    log.notes.append(f"the loss is {'total_loss' if total else 'the sum of ' + ', '.join(names)}"
                     " (the trainer prints its terms), each epoch's last update")
    return len(epochs)


def _term(name: str) -> str:
    """A loss term's name as a loss (YOLOv5's `box` -> `box_loss`)."""
    lowered = name.lower()
    return lowered if lowered.endswith("loss") else f"{lowered}_loss"
