"""Gym's and Stable-Baselines3's `Monitor` file (`monitor.csv`, `0.monitor.csv`): one line per
finished episode of an environment.

    #{"t_start": 1624983787.5997083, "env_id": "PandaStack-v1"}
    r,l,t
    -100.0,100,3.624664

The first line is a JSON comment (when the monitor started, the environment), the second the
header: `r` the episode's return, `l` its length in steps, `t` the seconds since the start (and
any info keywords the monitor was asked to keep after them). Rows are the episodes, numbered
from 1 (`episode N`): the return is `episode_reward` and the length `episode_length`; there is
no loss, and the run is judged on what its returns did.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from trainguard.analyze.log import Log, LogBuilder, LogError, number
from trainguard.analyze.source import MAX_RECORD, Lines

FORMAT = "monitor"
NAMES = {"r": "episode_reward", "l": "episode_length"}


def is_monitor(first: str, second: str) -> bool:
    """A monitor file's first two lines: a JSON object after `#`, then `r,l,t...`."""
    if not first.startswith("#") or not second.startswith("r,l,t"):
        return False
    try:
        return isinstance(json.loads(first[1:].strip()), dict)
    except ValueError:
        return False


def read(path: str | Path) -> Log:
    path = Path(path)
    lines = iter(Lines(path, errors="strict", skip_long=False, max_line=MAX_RECORD))
    try:
        first, second = next(lines, ""), next(lines, "")
    except UnicodeDecodeError:
        raise LogError(f"{path}: not a CSV file (not UTF-8 text)") from None
    if not is_monitor(first.strip(), second.strip()):
        raise LogError(f"{path}: not a Monitor file (no '#{{...}}' line over 'r,l,t')")
    header = [name.strip() for name in second.strip().split(",")]
    log = LogBuilder(path, FORMAT, step_unit="episode")
    episode = 0
    try:
        for fields in csv.reader(lines):
            if len(fields) != len(header):
                continue
            values = dict(zip(header, fields, strict=True))
            read_ = {NAMES[k]: number(values[k]) for k in NAMES if k in values}
            episode += 1
            log.add(episode, {k: v for k, v in read_.items() if v is not None},
                    label=f"episode {episode}")
    except (UnicodeDecodeError, csv.Error) as exc:
        raise LogError(f"{path}: not a valid CSV file ({exc})") from None
    return log.build(what="episodes")
