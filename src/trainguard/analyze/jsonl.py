"""JSON Lines: one JSON object per line, one logged step each.

The step is the first of `step`, `global_step`, `current_steps` (LLaMA-Factory's
`trainer_log.jsonl`), `iteration`, `iter`, the trainer's step in a W&B history
(`train/global_step` of the HF Trainer, `trainer/global_step` of Lightning), W&B's own count of
its log calls `_step` (`wandb-history.jsonl`, an export); a line with none of these but a
whole-numbered `epoch` is that epoch's record (DeiT, MAE and ConvNeXt write one per epoch to
`log.txt`); other lines are numbered by their position. Numeric values are the row's series
(names made canonical: `learning_rate` -> `lr`), `eval_*`/`val_*` values its evaluation. A
last line cut short (a writer still writing) is left out with a note; a bad line before it is
an error.

mmcv / MMEngine `*.log.json`: the `env_info` header record is no step; `"mode": "val"` records
are evaluations; `iter` counts within an epoch (`_Epochs`).
"""

from __future__ import annotations

import json
from pathlib import Path

from trainguard.analyze.log import Log, LogBuilder, LogError, whole_number
from trainguard.analyze.source import MAX_RECORD, Lines

FORMAT = "jsonl"
STEP_KEYS = ("step", "global_step", "current_steps", "iteration", "iter", "train/global_step",
             "trainer/global_step", "_step")


def read(path: str | Path) -> Log:
    path = Path(path)
    lines = Lines(path, errors="strict", skip_long=False, max_line=MAX_RECORD)
    log = LogBuilder(path, FORMAT)
    numbered = by_epoch = False
    epochs = _Epochs()
    # one line held back: a line that does not parse is a cut-off only when it is the last
    pending: tuple[int, str, json.JSONDecodeError] | None = None
    try:
        for index, line in enumerate(lines):
            if not line.strip():
                continue
            if pending is not None:
                _refuse(path, *pending)
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                pending = (index, line, exc)
                continue
            if not isinstance(record, dict):
                raise LogError(f"{path}: line {index + 1} is {type(record).__name__}, expected "
                               "a JSON object")
            mode = record.get("mode")
            if isinstance(mode, str) and mode.lower() in EVAL_MODES:  # MMEngine / mmcv
                record = {k: v for k, v in record.items() if k not in ("mode", "lr")}
                at = epochs.last if epochs.last is not None else index
                log.add_eval(at, {k: float(v) for k, v in record.items()
                                  if isinstance(v, (int, float)) and not isinstance(v, bool)
                                  and k not in ("epoch", "iter", "step")})
                continue
            step = next((record[k] for k in STEP_KEYS if isinstance(record.get(k), int)
                         and not isinstance(record.get(k), bool)), None)
            if step is None and whole_number(record.get("epoch")) and "iter" not in record:
                # one record per epoch (DeiT, MAE, ConvNeXt's `log.txt`): the epoch numbers it
                log.add_entry(int(record["epoch"]), record)
                by_epoch = True
                continue
            if step is None:
                if "env_info" in record or "config" in record:
                    continue  # the header record of an mmcv / MMEngine log, not a step
                step, numbered = index, True
                log.add_entry(step, record)
                continue
            step, label = epochs.number(record, step)
            log.add_entry(step, record, label=label)
    except UnicodeDecodeError:
        raise LogError(f"{path}: not a JSON Lines file (not UTF-8 text)") from None
    if pending is not None:
        if lines.ended:
            _refuse(path, *pending)
        log.notes.append(f"the last line ({pending[0] + 1}) is cut short (the file was being "
                         "written); it is left out")
    if numbered:
        log.notes.append("some lines have no step; they are numbered by their line")
    elif by_epoch:
        log.step_unit = "epoch"
    return log.build(what="training values (no line with a numeric metric)")


EVAL_MODES = frozenset({"val", "valid", "validation", "test", "eval"})
"""An MMEngine / mmcv `*.log.json` record of `"mode": "val"` is an evaluation."""


class _Epochs:
    """A step counter that starts again with each epoch (mmcv's `"epoch": 2, "iter": 50`):
    rows numbered across epochs, as (the largest count of the epochs before) + iter, and named
    as the record names them (`epoch 2, iter 50`)."""

    def __init__(self) -> None:
        self.last: int | None = None
        self.epoch: float | None = None
        self.offset = 0
        self.largest = 0
        self.restarted = False

    def number(self, record: dict[str, object], step: int) -> tuple[int, str]:
        epoch = record.get("epoch")
        if not isinstance(epoch, (int, float)) or isinstance(epoch, bool):
            self.last = step + self.offset
            return self.last, ""
        if self.epoch is not None and epoch > self.epoch and self.last is not None \
                and step + self.offset <= self.last:
            self.offset += self.largest  # the counter began again with the epoch
            self.restarted = True
        self.epoch = epoch
        self.largest = max(self.largest, step)
        self.last = step + self.offset
        name = next(k for k in STEP_KEYS if record.get(k) == step)
        # an iteration within a whole-numbered epoch (mmcv's) is named by both, as written
        within = self.restarted or (isinstance(epoch, int) and name == "iter")
        return self.last, f"epoch {epoch:g}, {name} {step}" if within else ""


def _refuse(path: Path, index: int, line: str, exc: json.JSONDecodeError) -> None:
    del line
    raise LogError(f"{path}: line {index + 1} is not valid JSON ({exc.msg} at column "
                   f"{exc.colno})") from None
