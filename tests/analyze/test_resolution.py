"""Rises of the loss within the rounding the log writes it at are noted, not judged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainguard.analyze import analyze
from trainguard.analyze.resolution import below_resolution, quantum


def _state(path: Path, losses: list[float]) -> Path:
    # no reward column: a log of sampled rewards has its loss set aside (`analyze/rl_log.py`),
    # and the rounding of a loss is judged on a loss that is judged
    rows = [{"step": 10 * (i + 1), "loss": loss, "grad_norm": 0.3 + 0.01 * (i % 5),
             "learning_rate": 1e-5, "kl": loss / 0.04}
            for i, loss in enumerate(losses)]
    path.write_text(json.dumps({"log_history": rows}))
    return path


@pytest.mark.parametrize(("values", "unit"), [
    ([0.0, 0.0001, 0.0003, 0.0008], 1e-4),
    ([2.31, 2.2, 2.05], 1e-2),
    ([2.312345678, 2.2], None),
    ([None, float("nan"), 0.0], None),
])
def test_the_last_written_digit(values: list[float | None], unit: float | None) -> None:
    got = quantum(values)
    assert got == pytest.approx(unit) if unit is not None else got is None


def test_a_rise_below_ten_units_is_rounding() -> None:
    assert below_resolution(0.0007, 1e-4)
    assert not below_resolution(0.001, 1e-4)
    assert not below_resolution(0.0007, None)


# a loss that is a KL penalty, starting at 0.0 and growing by units of the 4th decimal
KL_PENALTY = [0.0, 0.0, 0.0, 0.0, 0.0001, 0.0001, 0.0003, 0.0002, 0.0004, 0.0003, 0.0005,
              0.0006, 0.0004, 0.0004, 0.001 - 0.0001, 0.0008, 0.0006, 0.0007, 0.0006, 0.0008]


@pytest.mark.parametrize(("losses", "verdict"), [
    (KL_PENALTY, "healthy"),
    # the same shape a hundred times larger is a climb the log can show: still judged
    ([round(v * 100, 4) + 0.001 for v in KL_PENALTY], "degraded"),
])
def test_rises_within_rounding_give_a_note_not_a_verdict(tmp_path: Path, losses: list[float],
                                                         verdict: str) -> None:
    result = analyze(_state(tmp_path / "trainer_state.json", losses))
    assert result.verdict == verdict
    assert any("rounding" in note for note in result.notes) == (verdict == "healthy")
