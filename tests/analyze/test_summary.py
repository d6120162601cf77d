"""The human summary of an analysed log (`trainguard.analyze.summary`)."""

from __future__ import annotations

import pytest

from trainguard.analyze.summary import _every


@pytest.mark.parametrize("interval, unit, said", [
    (1, "epoch", "every epoch"),
    (25, "batch", "every 25 batches"),
    (10, "epoch", "every 10 epochs"),
    (10, "iter", "every 10 iters"),
    (100, "global step", "every 100 global steps"),
    (50, "num_updates", "every 50 (num_updates)"),
])
def test_how_often_the_log_was_written_reads_as_english(interval: float, unit: str,
                                                        said: str) -> None:
    assert _every(interval, unit) == said
