"""Runs that learn nothing get the live verdict's word, `stalled`; runs that learn do not."""

from __future__ import annotations

import math

import pytest
import torch

from trainguard.analyze import analyze_log
from trainguard.analyze.log import Log

ROWS = 40


def _log(losses: list[float], grads: list[float] | None = None, *, first: int = 10,
         **more: list[float]) -> Log:
    series: dict[str, list[float | None]] = {"loss": list(losses)}
    if grads is not None:
        series["grad_norm"] = list(grads)
    for name, values in more.items():
        series[name] = list(values)
    series["learning_rate"] = [1e-5 * (1 - i / (2 * len(losses))) for i in range(len(losses))]
    return Log(path="synthetic", format="hf", steps=[first + 10 * i for i in range(len(losses))],
               series=series)


def _epochs(losses: list[float]) -> Log:
    """`_log(losses)` whose rows are epochs 0, 1, 2..."""
    log = _log(losses)
    log.steps = list(range(len(losses)))
    log.step_unit = "epoch"
    return log


PINNED_EPOCHS = [7.512344, 7.512351, 7.512339, 7.512347, 7.512336, 7.512342, 7.512350,
                 7.512341]
"""A classifier's epoch losses written to seven digits, moving only in the last two."""


GUESSED = [0.6993, 0.6993, 0.6968, 0.6958, 0.6952, 0.6945, 0.694, 0.6936, 0.6934, 0.6935]
"""A recurrent classifier's epochs on sequences too long for it: 0.9% above ln 2 at most."""


def _evaluated(losses: list[float], eval_losses: list[float]) -> Log:
    """`_log(losses)` with an evaluation after every `len(losses) // len(eval_losses)` rows."""
    log = _log(losses)
    every = len(losses) // len(eval_losses)
    log.evals = [(log.steps[every * (i + 1) - 1], {"eval_loss": v})
                 for i, v in enumerate(eval_losses)]
    return log


def _falling(start: float, rows: int = ROWS) -> list[float]:
    return [round(start * 0.97 ** i + 0.01 * (i % 3), 4) for i in range(rows)]


CASES = {
    "zero loss, zero gradient: no signal": (_log([0.0] * ROWS, [0.0] * ROWS), "stalled"),
    "DPO loss pinned at ln 2, rewards 0": (
        _log([0.6931] * 4, rewards_chosen=[0.0] * 4, rewards_margins=[0.0] * 4), "stalled"),
    "classifier at ln 4 throughout": (_log([1.3863] * ROWS, _falling(2.0)), "stalled"),
    "constant loss that is no chance level": (_log([2.5] * ROWS, _falling(1.0)), "healthy"),
    "at ln 2, then it learns": (_log([0.6931] * 10 + _falling(0.6, ROWS - 10)), "healthy"),
    "zero loss, gradient still flowing": (_log([0.0] * ROWS, _falling(0.5)), "healthy"),
    "a falling loss": (_log(_falling(3.0), _falling(1.0)), "healthy"),
    "two rows at ln 2: too few to tell": (_log([0.6931] * 2), "healthy"),
    # a tracker keeps the float32 loss as a double, every digit written (W&B, MLflow)
    "DPO loss at ln 2 in float32, full precision": (
        _log([float(torch.tensor(math.log(2)).float())] * 8), "stalled"),
    "a float32 loss near ln 2 but not at it": (
        _log([float(torch.tensor(math.log(2) * 1.001).float())] * 8, _falling(1.0, 8)),
        "healthy"),
    # the weights move (the loss does) and not one prediction changes
    "accuracy frozen to every digit while the loss moves": (
        _log(_falling(2.0), accuracy=[0.18052256107330322] * ROWS), "stalled"),
    "accuracy at 1 throughout: converged, not stuck": (
        _log(_falling(2.0), accuracy=[1.0] * ROWS), "healthy"),
    "accuracy repeating a few times as it converges": (
        _log(_falling(2.0), accuracy=[0.9] * 8 + [0.91] * 8 + [0.9] * 8 + [0.92] * 16),
        "healthy"),
    "accuracy frozen on too few rows": (_log(_falling(2.0, 9), accuracy=[0.5] * 9), "healthy"),
    # train, validation and test accuracy stuck at one value together: a constant prediction
    "three accuracies frozen at one value on 8 rows": (
        _log(_falling(2.0, 8), train_acc=[0.5] * 8, val_acc=[0.5] * 8, test_acc=[0.5] * 8),
        "stalled"),
    "two accuracies repeating at different values": (
        _log(_falling(2.0, 8), train_acc=[0.97] * 8, val_acc=[0.91] * 8), "healthy"),
    # a loss repeating to every digit on distinct steps: the outputs never change (dead units)
    "a loss frozen to five digits on every step": (_log([7.7125] * ROWS), "stalled"),
    "a loss frozen on too few steps": (_log([7.7125] * 9), "healthy"),
    "a loss rounded to 0.01 repeating on a plateau": (_log([0.01] * ROWS), "healthy"),
    # a loss that moves in its last digits only, at ln 2, from the start
    "a loss within 0.5% of ln 2 on every row from the start": (
        _log([0.69396, 0.69305, 0.69299] + [0.69298] * 9), "stalled"),
    "near ln 2 from the start, then learning": (
        _log([0.69396, 0.69305] + [0.69298] * 8 + _falling(0.6, 10)), "healthy"),
    "near ln 2 in a log that begins mid-run": (
        _log([0.69396, 0.69305, 0.69299] + [0.69298] * 9, first=5000), "healthy"),
    # a loss within 2% of ln 2 that falls a little, its accuracy at a coin's throughout
    "loss near ln 2, accuracy at 1/2 on every row": (
        _log(GUESSED, accuracy=[0.5034, 0.5006, 0.5034, 0.5038, 0.5045, 0.508, 0.5109,
                                0.511, 0.5101, 0.5096]), "stalled"),
    "loss near ln 2, accuracy climbing away from 1/2": (
        _log(GUESSED, accuracy=[0.50, 0.52, 0.55, 0.58, 0.6, 0.62, 0.63, 0.65, 0.66, 0.68]),
        "healthy"),
    "loss near ln 2 with no accuracy": (_log(GUESSED), "healthy"),
    # the same held-out data scored at ln 4 exactly, every time: a uniform guess
    "eval loss at ln 4 at every evaluation": (
        _evaluated([1.356, 1.3864, 1.3864, 1.3863, 1.3863, 1.3864], [1.386] * 3), "stalled"),
    "eval loss repeating a value that is no chance level": (
        _evaluated(_falling(2.0, 12), [1.25] * 3), "healthy"),
    "eval loss near ln 4 but moving": (
        _evaluated(_falling(2.0, 12), [1.39, 1.386, 1.38]), "healthy"),
    # a regression's error that moves in its last digits only over hundreds of rows from the
    # start: no chance value to compare with, and nothing learned
    "a loss within 0.5% of its first value on 120 rows from the start": (
        _log([85.093 - 0.0005 * i for i in range(120)]), "stalled"),
    "the same band on too few rows": (_log([85.093 - 0.0005 * i for i in range(60)]), "healthy"),
    "a loss that moves 2% over 120 rows": (_log([85.0 * (1 - 0.00017 * i) for i in range(120)]),
                                           "healthy"),
    "pinned in a log that begins mid-run": (
        _log([85.093 - 0.0005 * i for i in range(120)], first=5000), "healthy"),
    # each row an epoch's mean loss, written to six or more digits: within 0.01% of the
    # first on five epochs from the start says the same, in fewer rows
    "an epoch loss within 0.01% of its first on 8 epochs": (
        _epochs(PINNED_EPOCHS), "stalled"),
    "the same band on 4 epochs: too few": (_epochs(PINNED_EPOCHS[:4]), "healthy"),
    "an epoch loss rounded to 0.01: the band below what it shows": (_epochs([2.31] * 8),
                                                                     "healthy"),
    "an epoch loss moving 0.05% per epoch": (
        _epochs([10.85 * (1 - 0.0005 * i) for i in range(8)]), "healthy"),
    "the same band on 8 rows of steps": (
        _log(PINNED_EPOCHS), "healthy"),
    "accuracy at 1/2 while the loss leaves ln 2": (
        _log([0.6993, 0.69, 0.68, 0.66, 0.64, 0.62, 0.6, 0.58, 0.57, 0.56],
             accuracy=[0.5] * 5 + [0.51] * 5), "healthy"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_learns_nothing(name: str) -> None:
    log, verdict = CASES[name]
    result = analyze_log(log)
    assert result.verdict == verdict
    if verdict == "stalled":
        assert result.onset_step == log.steps[0] and result.kind is None
        assert result.causes == [] and (
            "rows" in result.evidence[0] or "evaluations" in result.evidence[0])


def test_zero_loss_beside_a_nan_gradient_is_nan_not_stalled() -> None:
    result = analyze_log(_log([0.0] * ROWS, [math.nan] * ROWS))
    assert (result.verdict, result.kind) == ("degraded", "nan")


def test_a_loss_that_drops_to_exactly_0_in_one_row_and_stays_is_stalled_from_there() -> None:
    """0.100427 then 0.000000 on every row after (MXNet's MultiLogisticLoss): no signal left.
    A loss that reaches 0 over many rows, or that is 0 on too few rows, is judged as usual."""
    dropped = _log([0.100427] + [0.0] * 11)
    result = analyze_log(dropped)
    assert result.verdict == "stalled" and result.onset_step == dropped.steps[1]
    assert "dropped from 0.100427 to exactly 0" in result.evidence[0]
    approached = _log([round(0.1 * 0.5 ** i, 6) for i in range(20)] + [0.0] * 12)
    assert analyze_log(approached).verdict == "healthy"
    assert analyze_log(_log([0.100427] * 4 + [0.0] * 6)).verdict == "healthy"


def test_a_term_that_freezes_to_every_digit_to_the_end_is_stalled_from_there() -> None:
    """CenterNet's heatmap loss 10.560472, then 9.208497 on every epoch after while the total
    still moves with the other terms: that head's outputs stopped changing."""
    total = [13.094866, 11.584103, 11.529147, 11.560646, 11.544007, 11.511237, 11.53961]
    frozen = _log(total, hm_loss=[10.560472] + [9.208497] * 6)
    result = analyze_log(frozen)
    assert result.verdict == "stalled" and result.onset_step == frozen.steps[1]
    assert "hm_loss is 9.208497 on all 6 rows" in result.evidence[0]


@pytest.mark.parametrize("name, term", [
    ("too few digits", [1.5, 1.3] + [1.25] * 6),
    ("too few rows", [10.560472, 9.312201] + [9.208497] * 3),
    # a logger that reprints a stale value between its refreshes did so before the end too
    ("stale between refreshes", [10.560472] * 3 + [9.871234] * 3 + [9.208497] * 4),
])
def test_a_term_that_repeats_is_not_frozen_on_weak_evidence(name: str, term: list[float]
                                                            ) -> None:
    total = [13.0 - 0.1 * i + 0.03 * (i % 2) for i in range(len(term))]
    assert analyze_log(_log(total, hm_loss=term)).verdict == "healthy", name


LEARNED_THEN_FROZE = [2.8488, 2.9312, 3.0591, 3.0616, 3.0618, 3.0619, 3.0617, 3.0617, 3.0618,
                      3.0618, 3.0616, 3.0618]
"""A contrastive loss's epoch means: it moves, then holds to within 1e-4 of itself (its
collapsed value) on every epoch to the end."""


@pytest.mark.parametrize(("name", "losses", "onset"), [
    ("held to the end", LEARNED_THEN_FROZE, 3),
    # a converged run's epoch means still move by more than the band
    ("converging", [2.0 * 0.9 ** i + 0.5 for i in range(12)], None),
    ("a plateau that moves", [2.85, 2.40, 1.5012, 1.5031, 1.4998, 1.5025, 1.5007, 1.4991,
                              1.5019, 1.5003], None),
    ("too few epochs", [2.8488, 2.9312, 3.0591, 3.0616, 3.0618, 3.0619, 3.0617], None),
    ("written too coarsely", [2.8, 2.9, 3.1, 3.1, 3.1, 3.1, 3.2, 3.1, 3.1, 3.1], None),
])
def test_epoch_means_that_hold_to_the_tight_band_after_moving_are_stalled(
        name: str, losses: list[float], onset: int | None) -> None:
    result = analyze_log(_epochs(losses))
    if onset is None:
        assert result.verdict != "stalled", (name, result.evidence)
    else:
        assert (result.verdict, result.onset_step) == ("stalled", onset), result.evidence
        assert "stayed within 0.01%" in result.evidence[0]


def test_the_tight_tail_is_read_on_epochs_only() -> None:
    """The same values on rows of steps: one batch's loss is no epoch's mean."""
    assert analyze_log(_log(LEARNED_THEN_FROZE)).verdict != "stalled"
