"""JSON Lines: one JSON object per line, one logged step each.

The step is the first of `step`, `global_step`, `current_steps` (LLaMA-Factory's
`trainer_log.jsonl`), `iteration`, `iter`, `_step` (a W&B export), `trainer/global_step`; lines
without one are numbered by their position. Numeric values are the row's series (names made
canonical: `learning_rate` -> `lr`), `eval_*`/`val_*` values its evaluation. A last line cut
short (a writer still writing) is left out with a note; a bad line before it is an error.
"""

from __future__ import annotations

import json
from pathlib import Path

from trainguard.analyze.log import Log, LogBuilder, LogError
from trainguard.analyze.source import Lines

FORMAT = "jsonl"
STEP_KEYS = ("step", "global_step", "current_steps", "iteration", "iter", "_step",
             "trainer/global_step")


def read(path: str | Path) -> Log:
    path = Path(path)
    lines = Lines(path, errors="strict", skip_long=False)
    log = LogBuilder(path, FORMAT)
    numbered = False
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
            step = next((record[k] for k in STEP_KEYS if isinstance(record.get(k), int)
                         and not isinstance(record.get(k), bool)), None)
            if step is None:
                step, numbered = index, True
            log.add_entry(step, record)
    except UnicodeDecodeError:
        raise LogError(f"{path}: not a JSON Lines file (not UTF-8 text)") from None
    if pending is not None:
        if lines.ended:
            _refuse(path, *pending)
        log.notes.append(f"the last line ({pending[0] + 1}) is cut short (the file was being "
                         "written); it is left out")
    if numbered:
        log.notes.append("some lines have no step; they are numbered by their line")
    return log.build(what="training values (no line with a numeric metric)")


def _refuse(path: Path, index: int, line: str, exc: json.JSONDecodeError) -> None:
    del line
    raise LogError(f"{path}: line {index + 1} is not valid JSON ({exc.msg} at column "
                   f"{exc.colno})") from None
