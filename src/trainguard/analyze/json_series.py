"""One JSON object holding a run's values, by metric or by step (reference runs that training
frameworks commit to check against):

    by metric   `{"lm loss": {"start_step": 1, "end_step": 50, "step_interval": 5,
                "values": {"1": 10.8, "6": 9.9, ...}}, "num-zeros": {...}}` (Megatron-LM's
                golden values), `{"lm loss:": {"values": [12.3, 12.3, 18.7, ...]}}` (FlagScale's
                gold results: a list, numbered from `start_step`, else from 1, by
                `step_interval`), or a bare list per metric; a name's trailing colon is dropped
    by step     `{"0": {"lm loss": 11.9, "elapsed time per iteration (ms)": 284.2}, "1": {...}}`
                (Megatron-Bridge's golden values): most keys whole numbers, each its row's
                step (the others, the run's totals such as `max_alloc`, left out)

Values are read as any log's (`"nan"` is NaN), names made canonical (`lm loss` -> loss); the
frameworks' clocks and memory counters are bookkeeping (`analyze/log.py`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from trainguard.analyze.log import Log, LogBuilder, LogError, is_bookkeeping, whole_number
from trainguard.analyze.source import MAX_RECORD

FORMAT = "json-series"
_BY_METRIC = re.compile(rb'^\{\s*"[^"\n]{1,120}"\s*:\s*\{\s*'
                        rb'"(?:start_step|end_step|step_interval|values)"\s*:')
_BY_STEP = re.compile(rb'^\{\s*"\d{1,18}"\s*:\s*\{\s*"[^"\n]{1,120}"\s*:')


def sniff(head: bytes) -> bool:
    """Whether a JSON file starts as one of the two shapes (its first key and value)."""
    start = head.lstrip()
    return bool(_BY_METRIC.match(start) or _BY_STEP.match(start))


def read(path: str | Path) -> Log:
    path = Path(path)
    if path.stat().st_size > MAX_RECORD:
        raise LogError(f"{path}: a JSON object of {path.stat().st_size} bytes, more than "
                       f"{MAX_RECORD} read at once")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise LogError(f"{path}: not a JSON object ({exc})") from None
    if not isinstance(data, dict) or not data:
        raise LogError(f"{path}: not a JSON object of values by metric or by step")
    log = LogBuilder(path, FORMAT)
    steps = [key for key in data if _whole_key(key)]
    if 2 * len(steps) > len(data):  # by step (other keys: the run's totals, `max_alloc`)
        for key in sorted(steps, key=int):
            if isinstance(data[key], dict):
                log.add_entry(int(key), data[key])
    else:
        numbered = False
        for name, series in data.items():
            label = name.strip().rstrip(":").strip()
            points = _points(series)
            if points is None:
                continue
            numbered = numbered or (_numbered(series) and not is_bookkeeping(label))
            for step, value in points:
                log.add_values(step, [(label, value)])
        if numbered:
            log.notes.append("the values carry no step: they are numbered from 1")
    return log.build(what="training values (no metric holds numbers)")


def _whole_key(key: str) -> bool:
    """A step number as a key: ASCII digits, no longer than a 64-bit step."""
    key = key.strip()
    return key.isascii() and key.isdigit() and len(key) <= 18


def _points(series: Any) -> list[tuple[int, Any]] | None:
    """A metric's (step, value) pairs; None for a value that is no series."""
    if isinstance(series, list):
        return list(enumerate(series, start=1))
    if not isinstance(series, dict) or not isinstance(series.get("values"), (dict, list)):
        return None
    values = series["values"]
    if isinstance(values, dict):
        points = [(int(k), v) for k, v in values.items() if _whole_key(str(k))]
        return sorted(points, key=lambda point: point[0])  # by step alone: values may be text
    start = series.get("start_step")
    interval = series.get("step_interval")
    start = start if whole_number(start) else 1
    interval = interval if whole_number(interval) and interval > 0 else 1
    return [(start + i * interval, v) for i, v in enumerate(values)]


def _numbered(series: Any) -> bool:
    """A list of values with no step to start from: numbered from 1."""
    return isinstance(series, list) or (isinstance(series.get("values"), list)
                                        and "start_step" not in series)
