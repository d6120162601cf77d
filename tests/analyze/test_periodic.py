"""A loss that rises and falls with a period (batches grouped by length) is structure, not
divergence; a blow-up above its teeth still is one."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from trainguard.analyze import analyze
from trainguard.analyze.periodic import period


def _saw(rows: int, teeth: int = 20, blow_up_at: int | None = None) -> list[float]:
    """A slowly falling loss with a sawtooth of `teeth` rows on it (it climbs through each
    tooth, then drops), and from `blow_up_at` on 5x its earlier highest."""
    out = []
    for i in range(1, rows + 1):
        loss = 1.2 - 0.001 * i + 0.8 * (i % teeth) / teeth
        if blow_up_at is not None and i >= blow_up_at:
            loss = 10.0 + 0.01 * i
        out.append(round(loss, 4))
    return out


def _state(path: Path, losses: list[float]) -> Path:
    history = [{"step": 10 * (i + 1), "loss": v, "grad_norm": 1.0 + 0.1 * (i % 3),
                "learning_rate": 2e-5, "epoch": (i + 1) / len(losses)}
               for i, v in enumerate(losses)]
    path.write_text(json.dumps({"log_history": history}))
    return path


@pytest.mark.parametrize(("values", "rows"), [
    (_saw(120), 20),
    ([math.sin(i / 5) for i in range(300)], 32),  # 2 pi x 5 = 31.4 rows, whole-row lags
    ([2.5 * math.exp(-i / 40) for i in range(200)], None),  # smooth: no period
    ([1.0] * 100 + [5.0] * 100, None),  # a step up: no period
    ([*_saw(120)[:50], None, *_saw(120)[51:]], None),  # a gap: nothing said
])
def test_the_period_of_a_loss(values: list[float | None], rows: int | None) -> None:
    found = period(values)
    assert (found[0] if found else None) == rows


@pytest.mark.parametrize(("losses", "verdict"), [
    (_saw(119), "healthy"),  # ends on a tooth's top
    (_saw(120), "healthy"),
    (_saw(119, blow_up_at=100), "degraded"),
])
def test_a_sawtooth_is_healthy_and_a_blow_up_above_it_is_not(tmp_path: Path,
                                                              losses: list[float],
                                                              verdict: str) -> None:
    result = analyze(_state(tmp_path / "trainer_state.json", losses))
    assert result.verdict == verdict
    assert ("periodic structure" in result.evidence[0]) == (verdict == "healthy")
