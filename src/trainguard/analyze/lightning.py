"""PyTorch Lightning `CSVLogger` output: `metrics.csv` (one column per logged name).

Lightning writes one line per logging call with the columns of that call filled in: the step
metrics every `log_every_n_steps`, the epoch aggregates (`*_epoch`) and validation metrics once
an epoch. Lines with training values are rows at their `step`; `val_*`/`test_*` columns are
evaluations. Where the step-level values exist (`train_loss_step`), the epoch aggregates are left
out of the rows (they repeat the same losses on a coarser grid); a log that has only the epoch
level keeps it. Rows are named as Lightning counts them: `epoch 0 (step 198)`.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from pathlib import Path

from trainguard.analyze.log import Log, LogBuilder, LogError, is_eval_name, number
from trainguard.analyze.source import MAX_RECORD, Lines

FORMAT = "lightning"


def epoch_aggregates(names: Iterable[str]) -> set[str]:
    """The epoch aggregates (`train_loss_epoch`) among a log's names, where the step-level
    values (`train_loss_step`) are there too: the same losses again on a coarser grid, in a
    metrics.csv as in the trackers Lightning logs to."""
    names = list(names)
    if not any(name.endswith("_step") and "loss" in name for name in names):
        return set()
    return {name for name in names if name.endswith("_epoch") and not is_eval_name(name)}


def read(path: str | Path) -> Log:
    path = Path(path)
    lines = Lines(path, errors="strict", skip_long=False, max_line=MAX_RECORD)
    # records read as they go: a list of every field would cost several times the file
    records = csv.reader(lines)
    try:
        header = [name.strip() for name in next(records)]
    except StopIteration:
        raise LogError(f"{path}: the file is empty") from None
    except UnicodeDecodeError:
        raise LogError(f"{path}: not a CSV file (not UTF-8 text)") from None
    except csv.Error as exc:
        raise LogError(f"{path}: not a valid CSV file ({exc})") from None
    if not any(name for name in header):
        raise LogError(f"{path}: the file is empty")
    if "step" not in header:
        raise LogError(f"{path}: not a Lightning metrics.csv (no 'step' column in its header "
                       f"{', '.join(header[:6])})")
    step_at = header.index("step")
    epoch_at = header.index("epoch") if "epoch" in header else None
    aggregates = epoch_aggregates(header)
    keep = [i for i, name in enumerate(header)
            if i not in (step_at, epoch_at) and name and name not in aggregates]
    log = LogBuilder(path, FORMAT)
    try:
        following = next(records, None)
        number_ = 1
        while following is not None:
            fields, following = following, next(records, None)
            number_ += 1
            if not fields:
                continue
            if len(fields) != len(header):
                if following is None and not lines.ended:
                    log.notes.append(f"the last line ({number_}) is incomplete (the file was "
                                     "cut while being written); it is left out")
                    continue
                raise LogError(f"{path}: line {number_} has {len(fields)} fields, the header "
                               f"{len(header)}")
            step = number(fields[step_at])
            if step is None or step != int(step):
                raise LogError(f"{path}: line {number_}: the step {fields[step_at]!r} is not a "
                               "whole number")
            epoch = number(fields[epoch_at]) if epoch_at is not None else None
            label = (f"epoch {int(epoch)} (step {int(step)})"
                     if epoch is not None and epoch == int(epoch) else "")
            log.add_values(int(step), ((header[i], fields[i]) for i in keep if fields[i].strip()),
                           label=label)
    except UnicodeDecodeError:
        raise LogError(f"{path}: not a CSV file (not UTF-8 text)") from None
    except csv.Error as exc:
        raise LogError(f"{path}: not a valid CSV file ({exc})") from None
    return log.build(what="training values (no row with a training metric)")
