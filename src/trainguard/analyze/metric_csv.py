"""A metric's own CSV file without a header, `epoch,step,value` a line, named after the metric:
d3rlpy's logger (`critic_loss.csv`, `actor_loss.csv`, `td_error.csv` in a run's folder), and any
logger that writes one file per metric so.

    1,1000,0.2406839430630207
    2,2000,0.5605428324639797

The first column counts epochs and the second steps (both whole numbers that grow), the third
is the value: rows are the steps (`epoch E, step S`). The file's name names the value: one that
names a loss is the loss (`critic_loss`), any other a series of that name.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

from trainguard.analyze.log import LOSS, Log, LogBuilder, LogError, number
from trainguard.analyze.source import MAX_RECORD, Lines

FORMAT = "metric-csv"
_LINE = re.compile(r"^\s*(\d+)\s*,\s*(\d+)\s*,\s*([^,\s]+)\s*$")


def is_metric_csv(first: str, second: str) -> bool:
    """Two lines of `whole,whole,number`, the epoch not going back and the step growing."""
    a, b = _LINE.match(first), _LINE.match(second)
    return (a is not None and b is not None
            and number(a.group(3)) is not None and number(b.group(3)) is not None
            and int(b.group(1)) >= int(a.group(1)) and int(b.group(2)) > int(a.group(2)))


def read(path: str | Path) -> Log:
    path = Path(path)
    name = path.stem
    series = LOSS if "loss" in name.lower() else name
    log = LogBuilder(path, FORMAT)
    last = None
    try:
        for fields in csv.reader(Lines(path, errors="strict", skip_long=False,
                                       max_line=MAX_RECORD)):
            if len(fields) != 3:
                continue
            epoch, step, value = (number(v) for v in fields)
            if (epoch is None or step is None or value is None or not step.is_integer()
                    or (last is not None and step <= last)):
                continue
            last = step
            log.add(int(step), {series: value}, label=f"epoch {int(epoch)}, step {int(step)}")
    except (UnicodeDecodeError, csv.Error) as exc:
        raise LogError(f"{path}: not a valid CSV file ({exc})") from None
    return log.build()
