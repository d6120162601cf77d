"""Hugging Face Trainer `trainer_state.json`: its `log_history`.

Entries with a `loss`, `grad_norm` or `learning_rate` (and any other numbers a Trainer subclass
logs, such as `loss_total`) are training rows at their `step`; entries with `eval_*` keys are
evaluations; the run's closing totals (`train_runtime`, `total_flos`...) are left out. Two HF
habits are read for what they are, later, for every format (`trainguard.analyze.quirks`): a
`loss` of 0.0 beside a NaN `grad_norm` is a logging window whose losses were all NaN/inf (the
Trainer's `logging_nan_inf_filter`), and a learning rate that stays frozen on consecutive rows
under an active schedule is a run of skipped optimizer steps (fp16 GradScaler overflows).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from trainguard.analyze.log import Log, LogBuilder, LogError
from trainguard.analyze.source import open_regular

FORMAT = "hf"


def read_json(path: Path) -> object:
    """The parsed JSON of a file; a `LogError` that says where it broke off otherwise."""
    try:
        with open_regular(path) as handle:
            text = handle.read()
    except OSError as exc:
        raise LogError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if not text.strip():
        raise LogError(f"{path}: the file is empty")
    try:
        return json.loads(text)
    except UnicodeDecodeError:
        raise LogError(f"{path}: not a JSON file (not UTF-8 text)") from None
    except json.JSONDecodeError as exc:
        cut = _cut_short(exc)
        why = "the file is truncated" if cut else "the file is damaged"
        raise LogError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}, column "
                       f"{exc.colno}): {why}") from None


def _cut_short(exc: json.JSONDecodeError) -> bool:
    """Whether the JSON broke off at its end, not inside: after where the parser stopped there is
    nothing, or only the start of a token (a string without its closing quote, `Infin`, `1.5e-`)."""
    rest = exc.doc[exc.pos:].strip()
    if exc.msg.startswith("Unterminated string") or (
            exc.msg.startswith("Invalid \\uXXXX") and len(rest) <= 6):
        return True
    return exc.msg != "Extra data" and re.fullmatch(r"[\w.+-]*", rest) is not None


def read(path: str | Path) -> Log:
    path = Path(path)
    state = read_json(path)
    if not isinstance(state, dict) or "log_history" not in state:
        raise LogError(f"{path}: not a Hugging Face trainer_state.json (it has no log_history)")
    history = state["log_history"]
    if not isinstance(history, list):
        raise LogError(f"{path}: log_history is {type(history).__name__}, expected a list of "
                       "log entries")
    log = LogBuilder(path, FORMAT)
    for number, entry in enumerate(history):
        if not isinstance(entry, dict):
            raise LogError(f"{path}: log_history entry {number} is {type(entry).__name__}, "
                           "expected an object")
        if "train_runtime" in entry:  # the closing totals: `train_loss` is the run's mean loss
            continue
        step = entry.get("step")
        if not isinstance(step, int) or isinstance(step, bool):
            raise LogError(f"{path}: log_history entry {number} has no whole-number step "
                           f"(step is {step!r})")
        log.add_entry(step, entry)
    return log.build(what="training entries in log_history")
