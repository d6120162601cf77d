"""A log without a loss (`trainguard.analyze.lossless`): its values going non-finite for good."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from trainguard.analyze import analyze
from trainguard.analyze.log import Log
from trainguard.analyze.lossless import (
    evaluation_went_nonfinite,
    metric_went_nonfinite,
    went_nonfinite,
)

NAN, INF = math.nan, math.inf


def _log(series: dict[str, list[float | None]]) -> Log:
    rows = len(next(iter(series.values())))
    return Log(path="table.txt", format="text:rl", steps=list(range(1, rows + 1)),
               series=series, step_unit="iteration")


@pytest.mark.parametrize("series, row", [
    ({"KL": [0.001, 0.0009, NAN]}, 2),                         # a number, then NaN to the end
    ({"KL": [0.001, NAN, NAN], "EVAfter": [0.9, 0.9, INF]}, 1),  # the earliest of two
    ({"KL": [0.001, None, NAN], "EVAfter": [0.9, 0.9, 0.9]}, 2),  # rows without it passed over
    ({"ep_rewmean": [NAN, NAN, NAN], "KL": [0.1, 0.2, 0.1]}, None),  # never a number: undefined
    ({"KL": [0.001, NAN, 0.002]}, None),                       # back to a number
    ({"KL": [0.001, NAN, 0.002, NAN]}, None),                  # back once: its NaN does not last
    ({"KL": [0.001, NAN, None], "EVAfter": [0.9, 0.9, 0.9]}, None),  # not held to the end
    ({"KL": [0.001, 0.002, 0.003]}, None),
    ({"grad_norm": [1.0, NAN, NAN], "lr": [1e-3, NAN, NAN]}, None),  # read by their own rules
    ({"loss": [2.0, 1.9, 1.8], "KL": [0.001, 0.002, NAN]}, None),  # the loss says: not here
])
def test_a_value_non_finite_to_the_end_after_every_row_finite(
        series: dict[str, list[float | None]], row: int | None) -> None:
    events = went_nonfinite(_log(series))
    assert [e.details["row"] for e in events] == ([] if row is None else [row])
    if events:
        assert events[0].kind == "nonfinite_value" and events[0].severity == "error"


def test_a_table_of_an_rl_trainer_without_a_loss_that_goes_nan_is_degraded(
        tmp_path: Path) -> None:
    """baselines ACKTR prints no loss: its KL turning NaN, with everything else still a
    number, is where the run broke."""
    blocks = []
    for it in range(3020, 3028):
        kl = "nan" if it >= 3026 else f"{0.001 + 0.0002 * (it % 3):.6g}"
        blocks.append(f"Iteration {it}\nkl too low\n\n| EVAfter   | 0.98     |\n"
                      f"| EpRewMean | {-8.5 + 0.3 * (it % 4):<8.4g} |\n| KL        | {kl:<8} |\n\n")
    path = tmp_path / "acktr.txt"
    path.write_text("".join(blocks))
    result = analyze(path)
    assert (result.verdict, result.kind, result.onset) == ("degraded", "nan", "iteration 3026")
    assert any("KL is nan" in line for line in result.evidence)
    assert "the log ends with non-finite values" in result.evidence
    assert "KL turned non-finite" in " ".join(" ".join(c.evidence) for c in result.causes)


@pytest.mark.parametrize("series, row", [
    ({"logps/chosen": [-30.0, -29.0, NAN, NAN]}, 2),          # a log-probability, NaN to the end
    ({"kl": [0.001, 0.002, 0.003, INF]}, 3),
    ({"completions/mean_terminated_length": [3.0, NAN, NAN, NAN]}, None),  # bookkeeping
    ({"logps/chosen": [-30.0, NAN, -29.0, -28.0]}, None),     # back to a number
])
def test_a_trainers_metric_broken_to_the_end_beside_a_finite_loss(
        series: dict[str, list[float | None]], row: int | None) -> None:
    log = _log({"loss": [0.7, 0.6, 0.5, 0.4], **series})
    assert went_nonfinite(log) == []  # the rule for logs without a loss stays theirs
    found = metric_went_nonfinite(log)
    assert [e.details["row"] for e in found] == ([] if row is None else [row])
    assert metric_went_nonfinite(_log(series)) == []  # without a loss: `went_nonfinite`'s


@pytest.mark.parametrize("losses, at", [
    ([0.5, 0.4, NAN, NAN], 3),      # NaN from the third evaluation to the last
    ([0.5, NAN, 0.4, NAN], None),   # a number again in between: not broken for good
    ([NAN, NAN, NAN, NAN], 1),      # never a number: no held-out loss was ever computed
    ([0.5, 0.4, 0.3, 0.2], None),
])
def test_an_evaluation_loss_nan_from_an_evaluation_to_the_last(losses: list[float],
                                                               at: int | None) -> None:
    log = _log({"loss": [1.0, 0.9, 0.0, 0.0]})
    log.evals = [(step, {"eval_loss": value}) for step, value in zip([1, 2, 3, 4], losses,
                                                                      strict=True)]
    events = evaluation_went_nonfinite(log)
    assert [e.step for e in events] == ([] if at is None else [at])


def test_evaluations_that_stop_before_the_last_row_do_not_say_how_it_ends() -> None:
    log = _log({"loss": [1.0, 0.9, 0.8, 0.7, 0.6]})
    log.evals = [(1, {"eval_loss": 0.5}), (2, {"eval_loss": NAN})]
    assert evaluation_went_nonfinite(log) == []
    log.evals = [(5, {"eval_loss": NAN})]  # one evaluation, NaN: not enough to say
    assert evaluation_went_nonfinite(log) == []
