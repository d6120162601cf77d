"""Gym's and Stable-Baselines3's `Monitor` file (`analyze/monitor.py`): a JSON comment line, the
`r,l,t` header, one line per episode."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from trainguard.analyze import analyze_log, read_log
from trainguard.analyze.log import LogError


def _monitor(path: Path, returns: list[float], *, space: bool = False, extra: str = "") -> Path:
    comment = json.dumps({"t_start": 1551811844.79, "env_id": "Walker2d-v2"})
    lines = [("# " if space else "#") + comment, "r,l,t" + extra]
    for i, value in enumerate(returns):
        lines.append(f"{value},{100 + i % 7},{0.5 * (i + 1):.6f}" + (",1" if extra else ""))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(("space", "extra"), [(False, ""), (True, ",is_success")])
def test_the_episodes_are_the_rows_and_the_return_their_value(tmp_path: Path, space: bool,
                                                              extra: str) -> None:
    returns = list(np.linspace(-50.0, 900.0, 300) + np.random.default_rng(0).normal(0, 40, 300))
    log = read_log(_monitor(tmp_path / "0.monitor.csv", returns, space=space, extra=extra))
    assert log.format == "monitor" and log.step_unit == "episode"
    assert log.steps[:2] == [1, 2] and log.label(0) == "episode 1"
    assert log.series["episode_reward"][10] == pytest.approx(returns[10])
    assert log.series["episode_length"][3] == 103
    assert analyze_log(log).verdict == "healthy"


def test_a_csv_without_the_monitors_comment_is_not_one(tmp_path: Path) -> None:
    path = tmp_path / "monitor.csv"
    path.write_text("r,l,t\n1.0,10,0.5\n")
    with pytest.raises(LogError):
        read_log(path, "monitor")
