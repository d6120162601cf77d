"""The Log a reader makes: its series kept sparse (the rows holding each, and their values) and
laid out over every row when read, so that a log of many names each on a few rows costs what its
values cost."""

from __future__ import annotations

import math

import pytest

from trainguard.analyze.log import LOSS, Log, LogBuilder, Series, is_part_lr


def test_a_series_is_laid_out_over_every_row_when_read() -> None:
    series = Series(5)
    series.set_points("grad_norm/p1", [1, 3], [0.5, math.inf])
    assert series.points("grad_norm/p1") == ([1, 3], [0.5, math.inf])
    assert not series.laid_out("grad_norm/p1")
    assert series["grad_norm/p1"] == [None, 0.5, None, math.inf, None]
    assert series.laid_out("grad_norm/p1"), "read once, kept laid out"
    assert series.points("grad_norm/p1") == ([1, 3], [0.5, math.inf]), "the same once laid out"


def test_a_series_on_every_row_is_its_values() -> None:
    series = Series(3)
    values = [1.0, 2.0, 3.0]
    series.set_points(LOSS, [0, 1, 2], values)
    assert series[LOSS] is values


def test_holds_rename_copy_and_delete() -> None:
    series = Series(3, {"lr": [None, None, None]})
    series.set_points("loss_total", [2], [1.5])
    assert not series.holds("lr") and series.holds("loss_total") and not series.holds("x")
    series.rename("loss_total", LOSS)
    assert list(series) == ["lr", LOSS] and series[LOSS] == [None, None, 1.5]
    copy = series.copy()
    del copy["lr"]
    copy[LOSS] = [0.0, 0.0, 0.0]
    assert "lr" in series and series[LOSS] == [None, None, 1.5], "the copy's changes are its own"
    assert dict(series) == {"lr": [None, None, None], LOSS: [None, None, 1.5]}


def test_a_log_takes_a_plain_dict_of_series() -> None:
    log = Log(path="x", format="jsonl", steps=[10, 20], series={LOSS: [2.0, None]})
    assert isinstance(log.series, Series)
    assert log.values(LOSS) == [2.0, None] and log.values("lr") == [None, None]
    assert log.has(LOSS) and not log.has("lr")


def test_the_builder_keeps_names_of_a_few_rows_sparse() -> None:
    builder = LogBuilder("x", "jsonl")
    names = 5000
    for step in range(names):
        builder.add_entry(step, {"loss": 2.0, f"grad_norm/p{step}": 0.5, "eval_loss": 1.0})
    log = builder.build()
    assert len(log) == names and len(log.series) == names + 1
    # stored as (rows, values): no list of 5000 rows for each of the 5000 names
    assert log.series.points("grad_norm/p7") == ([7], [0.5])
    assert [name for name in log.series if log.series.laid_out(name)] == [LOSS]
    assert log.series["grad_norm/p7"][7] == 0.5 and log.series["grad_norm/p7"][6] is None
    assert len(log.evals) == names


@pytest.mark.parametrize("name, part", [("lr/unet", True), ("lr-AdamW/pg1", True),
                                        ("learning_rate/group0", True), ("lr", False),
                                        ("lr/unet/extra", False), ("loss/current", False),
                                        ("lr/", False)])
def test_an_lr_one_level_below_an_lr_name_is_a_parts(name: str, part: bool) -> None:
    assert is_part_lr(name) == part
