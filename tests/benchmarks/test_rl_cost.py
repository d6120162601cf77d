"""`benchmarks/rl_cost.py` runs a GRPO trainer with and without the callback and says what the
callback takes; its figures are printed, not tested."""

from __future__ import annotations

import pytest

pytest.importorskip("trl")
from benchmarks.rl_cost import main


def test_it_times_both_runs_and_what_trainguard_takes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--pairs", "1", "--steps", "4"]) == 0
    out = capsys.readouterr().out
    assert "side by side: plain" in out and "ratio" in out
    assert "inside trainguard, every step" in out and "ms a step" in out
    assert "once a run" in out
