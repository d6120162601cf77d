"""What a log's judgement may read into it, and what it may not (`analyze/judge.py`,
`quirks.py`, `chance.py`): AMP skips are notes, a language model's loss is never "at chance",
throughput never collapses, a StepLR schedule is no skipped steps, the incident that decides
gives the onset, and the verdict on a log is the live verdict's rule."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from trainguard.analyze import analyze
from trainguard.verdict import LossTrack, ended_worse

NAN = math.nan


def trainer_state(path: Path, rows: list[dict], evals: list[dict] | None = None) -> Path:
    history = [{"step": row.pop("step", i + 1), **row} for i, row in enumerate(rows)]
    history += evals or []
    path.write_text(json.dumps({"log_history": history}))
    return path


def falling(n: int, start: float = 3.0, end: float = 1.0, noise: float = 0.02,
            seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [end + (start - end) * math.exp(-i / (n / 5)) + rng.gauss(0, noise) for i in range(n)]


def decay(n: int, peak: float = 2e-4) -> list[float]:
    return [peak * (1 - i / (n + 7)) for i in range(n)]


# -- AMP skips: a non-finite grad norm with finite losses after it -------------------------------
def test_an_amp_skip_at_the_first_step_is_a_note_not_a_verdict(tmp_path: Path) -> None:
    """fp16's loss scaler calibrates on the first steps: NaN grad norms there, the loss falls."""
    losses = falling(60)
    lrs = [0.0, 0.0, *decay(58)]
    rows = [{"loss": v, "grad_norm": NAN if i < 2 else 1.0, "learning_rate": lr}
            for i, (v, lr) in enumerate(zip(losses, lrs, strict=True))]
    result = analyze(trainer_state(tmp_path / "trainer_state.json", rows))
    assert result.verdict == "healthy", result.evidence
    assert any("skipped" in note for note in result.notes)


def test_one_amp_skip_mid_run_is_a_note_not_a_verdict(tmp_path: Path) -> None:
    losses = falling(80)
    rows = [{"loss": v, "grad_norm": NAN if i == 40 else 1.0 + 0.01 * (i % 3),
             "learning_rate": lr} for i, (v, lr) in enumerate(zip(losses, decay(80),
                                                                    strict=True))]
    result = analyze(trainer_state(tmp_path / "trainer_state.json", rows))
    assert result.verdict == "healthy", result.evidence
    assert any("non-finite grad norm beside a finite loss" in note for note in result.notes)


def test_a_nan_grad_norm_followed_by_nan_losses_is_no_skip(tmp_path: Path) -> None:
    losses = falling(40)
    rows = [{"loss": v if i < 30 else 0.0, "grad_norm": 1.0 if i < 30 else NAN,
             "learning_rate": lr} for i, (v, lr) in enumerate(zip(losses, decay(40),
                                                                   strict=True))]
    result = analyze(trainer_state(tmp_path / "trainer_state.json", rows))
    assert (result.verdict, result.kind, result.onset_step) == ("degraded", "nan", 31)


# -- chance level: only for a classifier ----------------------------------------------------------
def test_a_language_model_loss_at_1_386_is_never_called_chance(tmp_path: Path) -> None:
    """ln 4 = 1.386: an LM fine-tune whose loss dipped to 1.2 on its first epoch's easy batches
    and then sits at 1.386 has not collapsed to 4 classes."""
    rng = random.Random(2)
    losses = [2.4 - 1.2 * i / 30 for i in range(31)] + [1.386 + rng.gauss(0, 0.02)
                                                        for _ in range(90)]
    rows = [{"loss": v, "grad_norm": 1.0, "learning_rate": 2e-5} for v in losses]
    result = analyze(trainer_state(tmp_path / "trainer_state.json", rows))
    assert result.verdict == "healthy" and result.judgement is not None
    assert not any("chance" in line for line in result.evidence)


def test_a_classifier_back_at_ln_k_is_called_chance(tmp_path: Path) -> None:
    """With an accuracy among its metrics the log is a classifier's: its loss settling at ln 4
    after it had learned is a collapse to a constant prediction."""
    learned = falling(60, start=1.4, end=0.3, noise=0.01)
    rng = random.Random(1)
    losses = learned + [math.log(4) + rng.gauss(0, 0.005) for _ in range(60)]
    rows = [{"loss": v, "grad_norm": 1.0, "learning_rate": 2e-5} for v in losses]
    evals = [{"step": 30, "eval_accuracy": 0.8, "eval_loss": 0.5},
             {"step": 110, "eval_accuracy": 0.25, "eval_loss": 1.39}]
    result = analyze(trainer_state(tmp_path / "trainer_state.json", rows, evals))
    assert result.verdict == "degraded" and result.judgement is not None
    assert "loss_at_chance" in {e.kind for e in result.judgement.incident}


# -- only quality metrics collapse ----------------------------------------------------------------
def test_eval_samples_per_second_falling_is_never_a_collapse(tmp_path: Path) -> None:
    rows = [{"loss": v, "grad_norm": 1.0, "learning_rate": 2e-5} for v in falling(100)]
    evals = [{"step": s, "eval_loss": 1.2 - s / 1000, "eval_samples_per_second": 80.0 / (k + 1),
              "eval_runtime": 10.0 * (k + 1), "eval_steps_per_second": 10.0 / (k + 1)}
             for k, s in enumerate(range(10, 101, 10))]
    result = analyze(trainer_state(tmp_path / "trainer_state.json", rows, evals))
    assert result.verdict == "healthy"
    assert "metric_collapse" not in {e.kind for e in result.events}


# -- a StepLR schedule is not skipped steps -------------------------------------------------------
def test_a_healthy_step_lr_run_is_healthy(tmp_path: Path) -> None:
    """fp32, StepLR (x0.1 every 40 steps): the LR is constant for stretches and then steps; no
    row of it is a skipped step."""
    losses = falling(120, start=2.0, end=0.4)
    lrs = [0.1 * 0.1 ** (i // 40) for i in range(120)]
    rows = [{"loss": v, "grad_norm": 1.0, "learning_rate": lr}
            for v, lr in zip(losses, lrs, strict=True)]
    result = analyze(trainer_state(tmp_path / "trainer_state.json", rows))
    assert result.verdict == "healthy", result.evidence
    assert result.log is not None and not any(
        "frozen" in note for note in result.notes)


# -- the incident that decides --------------------------------------------------------------------
def test_the_onset_is_that_of_the_incident_the_run_never_came_back_from(tmp_path: Path) -> None:
    """A start far too high (a `bad_start` the loss falls ten orders of magnitude from), then
    healthy training, then NaN at step 90: the NaN is the onset, the start told as earlier."""
    losses = [1e9, 1e6, 1e3, *falling(87, start=3.0, end=1.0)]
    rows = [{"loss": v if i < 90 else 0.0, "grad_norm": 1.0 if i < 90 else NAN,
             "learning_rate": 1e-4} for i, v in enumerate([*losses, *[0.0] * 10])]
    result = analyze(trainer_state(tmp_path / "trainer_state.json", rows))
    assert (result.verdict, result.kind, result.onset_step) == ("degraded", "nan", 91)


def test_a_jump_that_never_comes_back_is_degraded_not_recovered(tmp_path: Path) -> None:
    """A loss that jumps from 0.06 to 1e19 and keeps climbing is thrashing far above its level,
    however noisy its last rows are (the live verdict's noise clause)."""
    losses = [0.06, 0.16, 0.058, 5.4e19, 4.3e20, 2.1e21, 7.8e21, 2.5e22]
    rows = [{"loss": v, "learning_rate": 1e-3, "step": 435 + i} for i, v in enumerate(losses)]
    result = analyze(trainer_state(tmp_path / "trainer_state.json", rows))
    assert (result.verdict, result.kind, result.onset_step) == ("degraded", "explosion", 438)


# -- one verdict rule, live and offline -----------------------------------------------------------
@pytest.mark.parametrize("final_ratio, noisy, worse", [
    (1.05, False, False),  # within 10%
    (1.4, False, True),  # 40% above, a quiet tail
    (1.4, True, False),  # 40% above, within a tail's own noise
    (30.0, True, True),  # thrashing at 30x: worse whatever the noise
])
def test_the_offline_verdict_is_the_live_verdicts_rule(tmp_path: Path, final_ratio: float,
                                                       noisy: bool, worse: bool) -> None:
    """The same losses, fed to the live `LossTrack` and written as a log for `analyze`: both
    call the end worse than before the trouble, or both do not."""
    rng = random.Random(3)
    before = [1.0 + rng.gauss(0, 0.01) for _ in range(60)]
    spike = [50.0, 40.0]
    spread = 0.9 if noisy else 0.01
    after = [max(final_ratio + rng.uniform(-spread, spread) * final_ratio, 1e-3)
             for _ in range(40)]
    losses = before + spike + after
    track = LossTrack()
    for step, loss in enumerate(losses):
        track.observe(step, loss, trouble=step == len(before))
    live = track.verdict()
    assert live is not None
    assert (live.verdict == "degraded") is worse
    rows = [{"loss": v, "learning_rate": 1e-4} for v in losses]
    offline = analyze(trainer_state(tmp_path / "trainer_state.json", rows))
    assert (offline.verdict == "degraded") is worse, offline.evidence
    reference, tail = live.before_trouble, list(track.recent)
    assert reference is not None and live.final is not None
    assert ended_worse(live.final, reference, tail) is worse


# -- only claims a log can support ----------------------------------------------------------------
def test_a_log_analysis_claims_nothing_about_batches(tmp_path: Path) -> None:
    """A log holds no batch: a NaN in it is never 'with a finite batch' nor 'check the batch'."""
    rows = [{"loss": v if i < 30 else 0.0, "grad_norm": 1.0 if i < 30 else NAN,
             "learning_rate": 1e-4} for i, v in enumerate(falling(40))]
    result = analyze(trainer_state(tmp_path / "trainer_state.json", rows))
    assert result.verdict == "degraded" and result.causes
    said = [line for cause in result.causes for line in cause.evidence] + result.evidence
    assert not [line for line in said if "batch" in line], said


# -- a loss whose level is zero -------------------------------------------------------------------
def test_a_loss_rising_from_a_level_of_zero_is_judged_without_a_ratio(tmp_path: Path) -> None:
    """A penalty that starts at exactly 0 (a KL term) and grows: its level before the trouble is
    0, no ratio can be taken against it, and the analysis still says how the log ends. (Its
    rises are hundreds of units of the 4th decimal the log writes: not rounding.)"""
    losses = [0.0] * 4 + [0.0101, 0.0098, 0.0312, 0.0205, 0.0411, 0.0297, 0.0502, 0.0613,
                          0.2718, 0.0404, 0.1012, 0.0911, 0.0803, 0.0607, 0.0702, 0.0598]
    rows = [{"loss": v, "grad_norm": 0.15, "learning_rate": 4e-6, "step": 10 * (i + 1)}
            for i, v in enumerate(losses)]
    result = analyze(trainer_state(tmp_path / "trainer_state.json", rows))
    assert result.judgement is not None and result.judgement.reference == 0.0
    assert any("the loss ends at" in line for line in result.evidence), result.evidence


# -- a loss that leaves its level by orders of magnitude ------------------------------------------
def blown_rows(blown: set[int], n: int = 12) -> list[dict]:
    """A Trainer's log of `n` rows every 10 steps, its loss falling from 6.95, with the rows of
    `blown` at 1.25e10 and the gradient norm untouched."""
    losses = [2.7 + 4.25 * math.exp(-i / 2.5) for i in range(n)]
    return [{"loss": 1.25e10 if i in blown else v, "grad_norm": 1.5 - 0.05 * i,
             "learning_rate": 2e-5, "epoch": round(3 * (i + 1) / n, 2), "step": 10 * (i + 1)}
            for i, v in enumerate(losses)]


@pytest.mark.parametrize("blown", [{3, 7, 11}, {7, 10, 11}, {11}],
                         ids=["spaced, the last row too", "a pair at the end", "the last row"])
def test_a_log_that_ends_orders_of_magnitude_above_its_level_degraded(
        tmp_path: Path, blown: set[int]) -> None:
    """Jumps of nine orders of magnitude are no heavy-tailed batch, even when the row after one
    is back at the level, or when the log ends on one: the log ends blown up."""
    result = analyze(trainer_state(tmp_path / "trainer_state.json", blown_rows(blown)))
    assert (result.verdict, result.kind) == ("degraded", "explosion"), result.evidence
    assert result.onset_step == 10 * (min(blown) + 1)


def test_jumps_of_orders_of_magnitude_the_loss_came_back_from_are_a_recovered_spike(
        tmp_path: Path) -> None:
    result = analyze(trainer_state(tmp_path / "trainer_state.json", blown_rows({4, 7, 9})))
    assert (result.verdict, result.kind, result.onset_step) == (
        "recovered", "explosion", 50), result.evidence


def test_a_one_batch_jump_of_a_loss_near_its_floor_stays_healthy(tmp_path: Path) -> None:
    """0.001 to 0.18 (176x) after starting at 12: one odd batch near the floor, less than a
    tenth of the loss's fall, back at the next row: healthy, however large the ratio."""
    rng = random.Random(0)
    losses = [12.0 * math.exp(-i / 8) + 0.001 * (1 + 0.05 * rng.gauss(0, 1)) for i in range(160)]
    losses[140] = 0.18
    rows = [{"loss": v, "learning_rate": 1e-3} for v in losses]
    result = analyze(trainer_state(tmp_path / "trainer_state.json", rows))
    assert [(e.kind, e.severity) for e in result.events] == [("loss_spike", "error")]
    assert result.verdict == "healthy", result.evidence


def test_a_jump_the_loss_came_back_from_is_never_told_as_one_it_never_came_back_from(
        tmp_path: Path) -> None:
    """The loss was back at its level after the first jump; the log ends blown up again: the
    evidence does not say it never came back after the first."""
    result = analyze(trainer_state(tmp_path / "trainer_state.json", blown_rows({3, 7, 11})))
    assert result.verdict == "degraded"
    assert not [line for line in result.evidence if "never came back" in line], result.evidence


# -- a gradient norm that jumps alone -------------------------------------------------------------
def _grad_jumps(path: Path, *, loss_jumps: bool) -> Path:
    """A Trainer log whose gradient norm jumps 100x on rows 20-25 (batch size 1, a regression
    head); the loss falls on slowly, barely moved, or (`loss_jumps`) jumps 4x with it and stays
    there."""
    history = []
    for i in range(1, 41):
        loss = 1.0 - 0.002 * i + 0.01 * (i % 3)
        grad = 1.0 + 0.05 * (i % 4)
        if 20 <= i <= 25:  # the loss a little up (5%) beside it, within its own noise
            grad *= 100
            loss += 0.05
        if loss_jumps and i >= 20:
            loss *= 4
        history.append({"step": 10 * i, "loss": round(loss, 4), "grad_norm": grad,
                        "learning_rate": 2e-5, "epoch": i / 40})
    path.write_text(json.dumps({"log_history": history}))
    return path


@pytest.mark.parametrize(("loss_jumps", "verdict"), [(False, "healthy"),
                                                     (True, "recovered or degraded")])
def test_a_gradient_norm_that_jumps_alone_gives_a_note_not_a_verdict(
        tmp_path: Path, loss_jumps: bool, verdict: str) -> None:
    result = analyze(_grad_jumps(tmp_path / "trainer_state.json", loss_jumps=loss_jumps))
    assert result.verdict in verdict.split(" or ")
    if verdict == "healthy":
        assert "gradient norm jumped from step 200" in result.evidence[0]


# -- the first incident of the kind reported ------------------------------------------------------
def _incidents(path: Path, jumps: list[int], nan_from: int | None = None) -> Path:
    """A Trainer log falling from 2.5, the loss 4x up for three rows from each row of `jumps`
    and back after them, then NaN from `nan_from`."""
    history = []
    for i in range(1, 61):
        loss = 2.5 * math.exp(-i / 40) + 0.3 + 0.005 * (i % 3)
        if any(j <= i < j + 3 for j in jumps):
            loss *= 4
        if nan_from is not None and i >= nan_from:
            loss = math.nan
        history.append({"step": 10 * i, "loss": round(loss, 4), "grad_norm": 1.0,
                        "learning_rate": 2e-5, "epoch": i / 60})
    path.write_text(json.dumps({"log_history": history}))
    return path


@pytest.mark.parametrize(("jumps", "nan_from", "verdict", "onset"), [
    ([15, 30, 45], None, "recovered", 150),  # the first of three, not the last
    ([15], 40, "degraded", 400),  # an explosion it came back from is no NaN's onset
])
def test_the_onset_is_the_first_incident_of_the_kind_reported(
        tmp_path: Path, jumps: list[int], nan_from: int | None, verdict: str,
        onset: int) -> None:
    result = analyze(_incidents(tmp_path / "trainer_state.json", jumps, nan_from))
    assert (result.verdict, result.onset_step) == (verdict, onset)
    if len(jumps) > 1:
        assert any("step 450" in line for line in result.evidence), result.evidence


# -- a jump on the last row ------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "verdict"), [
    ("Validation loss", "degraded"),  # a mean over the whole evaluation set: the model's state
    ("Train loss", "healthy"),  # one batch's jump that nothing after it confirms
])
def test_a_jump_on_the_last_row_counts_only_when_it_is_an_evaluations_mean(
        tmp_path: Path, name: str, verdict: str) -> None:
    levels = [0.152, 0.149, 0.150, 0.147, 0.148, 0.146, 0.147, 0.712]
    lines = [f"{name} {500 * (i + 1)}:  {v:.6f}" for i, v in enumerate(levels)]
    path = tmp_path / "paste.txt"
    path.write_text("\n".join(lines) + "\n")
    result = analyze(path)
    assert result.verdict == verdict, result.evidence
    if verdict == "degraded":
        assert (result.kind, result.onset_step) == ("explosion", 4000)


# -- a jump that starts a climb --------------------------------------------------------------------
@pytest.mark.parametrize(("after", "kind"), [
    ([4.3, 8.8, 13.5, 15.7, 15.0, 18.8, 20.8, 25.6, 29.6], "slow-divergence"),  # a ramp
    ([4.3, 4.5, 4.2, 4.4, 4.6, 4.3, 4.5, 4.4, 4.6], "explosion"),  # sat where it landed
    ([4.3, 9.0, 5.3, 320.0, 22.0, 131.0, 4980.0, 156.0], "explosion"),  # ran wild
    ([5e19, 4e20, 2e21, 8e21, 2.5e22], "explosion"),  # orders of magnitude at once
])
def test_a_jump_is_an_explosion_unless_it_starts_a_steady_climb(
        tmp_path: Path, after: list[float], kind: str) -> None:
    losses = [1.02, 0.99, 1.01, 0.98, 1.0, *after]
    rows = [{"step": 10 * (i + 1), "loss": v, "learning_rate": 5e-3}
            for i, v in enumerate(losses)]
    result = analyze(trainer_state(tmp_path / "trainer_state.json", rows))
    assert (result.verdict, result.kind, result.onset_step) == ("degraded", kind, 60)


# -- the first rows of training ------------------------------------------------------------------
@pytest.mark.parametrize(("first", "onset"), [
    (1, 4),  # from the start: two rows of a fresh model show no level to stand above
    (5001, 5003),  # an excerpt from mid-run may be cut where its trouble began
])
def test_the_onset_is_not_traced_back_into_the_first_rows_of_training(
        tmp_path: Path, first: int, onset: int) -> None:
    losses = ["39.66", "22.22", "68.61", "1266.9", "332.0", "1436176.25", "nan", "nan"]
    path = tmp_path / "paste.txt"
    path.write_text("\n".join(f"iteration : {first + i}, losses : {v}"
                              for i, v in enumerate(losses)) + "\n")
    result = analyze(path)
    assert (result.verdict, result.kind, result.onset_step) == ("degraded", "nan", onset)


# -- a collapse only the evaluations show: they say whether it passed -----------------------------
@pytest.mark.parametrize("wers, eval_losses, verdict, kind", [
    # off its cliff at the last evaluation, the eval loss up with it
    ([35.0, 33.0, 31.0, 150.0], [1.2, 1.1, 1.0, 2.6], "degraded", "collapse"),
    # back within its bound at the next one: the evaluations dipped and came back
    ([35.0, 33.0, 150.0, 30.0], [1.2, 1.1, 2.6, 1.0], "healthy", None),
    # off its cliff while the evaluation's own loss held: a scoring artifact
    ([35.0, 33.0, 31.0, 150.0], [1.2, 1.1, 1.0, 1.05], "healthy", None),
])
def test_a_metric_cliff_lasts_only_when_no_later_evaluation_shows_it_back(
        tmp_path: Path, wers: list[float], eval_losses: list[float], verdict: str,
        kind: str | None) -> None:
    """The training loss falls throughout; an evaluation's error rate jumps 4x its best. The
    training loss never left its course, so it cannot say the run came back: a later
    evaluation of the metric can, and so can the evaluation's own loss, which measures the
    model itself."""
    rows = [{"loss": v, "grad_norm": 1.0, "learning_rate": 2e-5} for v in falling(80)]
    evals = [{"step": 20 * (k + 1), "eval_wer": w, "eval_loss": e}
             for k, (w, e) in enumerate(zip(wers, eval_losses, strict=True))]
    result = analyze(trainer_state(tmp_path / "trainer_state.json", rows, evals))
    assert (result.verdict, result.kind) == (verdict, kind), result.evidence


@pytest.mark.parametrize("metric, kind", [("eval_loss", "nan"), ("eval_perplexity", "nan"),
                                          ("eval_accuracy", "collapse"),
                                          ("eval_answer_accuracy", "collapse")])
def test_an_evaluation_loss_that_is_nan_is_a_nan_not_a_collapse(
        tmp_path: Path, metric: str, kind: str) -> None:
    """fp16 fine-tuning whose every step overflowed from the first: the Trainer logs `loss: 0.0`
    for each all-NaN window at a frozen LR, and the evaluations give NaN. An evaluation's own loss
    (or perplexity) that is NaN is the model's forward pass overflowing, a NaN in the weights or
    activations; an accuracy that is NaN says only that the evaluation broke."""
    rows = [{"loss": 0.0, "learning_rate": 1.0533245556287031e-07, "step": 10 * (i + 1)}
            for i in range(11)]
    evals = [{"step": 10, metric: NAN}, {"step": 60, metric: NAN}]
    result = analyze(trainer_state(tmp_path / "trainer_state.json", rows, evals))
    assert (result.verdict, result.kind) == ("degraded", kind), result.evidence


@pytest.mark.parametrize("swung, verdict", [(True, "healthy"), (False, "degraded")])
def test_a_cliff_no_deeper_than_swings_the_metric_came_back_from_is_its_noise(
        tmp_path: Path, swung: bool, verdict: str) -> None:
    """A validation loss that jumps 10x between neighbouring epochs and comes back, again
    and again (a small, noisy validation set), shows no collapse by jumping 4x at the end;
    the same 4x jump from a steady validation loss does."""
    rows = [{"loss": v, "grad_norm": 1.0, "learning_rate": 2e-5} for v in falling(200)]
    steady = [2.0, 1.8, 1.7, 1.6, 1.5, 1.45, 1.4, 1.38, 1.36]
    noisy = [2.0, 1.8, 20.0, 1.6, 1.5, 16.0, 1.4, 1.38, 1.36]
    values = (noisy if swung else steady) + [5.6]
    evals = [{"step": 20 * (k + 1), "eval_loss": v} for k, v in enumerate(values)]
    result = analyze(trainer_state(tmp_path / "trainer_state.json", rows, evals))
    assert result.verdict == verdict, result.evidence


def test_a_run_whose_only_trouble_is_its_first_losses_is_healthy(tmp_path: Path) -> None:
    """A variational bound that starts at 7e10 and falls to its level in the first rows, then
    keeps it: the loss fell from its first row, nothing broke."""
    values = [7e10, 4e6, 300.0] + [v * 100 for v in falling(60, start=1.2, end=0.9)]
    rows = [{"loss": v, "learning_rate": 1e-3} for v in values]
    result = analyze(trainer_state(tmp_path / "trainer_state.json", rows))
    assert result.verdict == "healthy", result.evidence
    assert any(e.kind == "bad_start" for e in result.events)  # still in the evidence


@pytest.mark.parametrize("after, verdict", [
    ([0.62, 0.60, 0.56, 0.50, 0.41, 0.38], "recovered"),  # finite from the second row, falling
    ([0.62, 0.60, 0.61, 0.63, 0.70, 0.75], "degraded"),  # finite, but no lower at the end
    ([0.62, 0.60, math.inf, 0.50, 0.41, 0.38], "degraded"),  # non-finite again later
])
def test_a_non_finite_first_row_the_run_trains_on_from_is_recovered(
        tmp_path: Path, after: list[float], verdict: str) -> None:
    """A cost of inf on the first print (a huge random initialisation saturating the
    sigmoid), then a finite cost that falls: the run came back from its first row. A start
    that stays broken, or trouble again later, is no recovery."""
    rows = [{"loss": v} for v in [math.inf, *after]]
    result = analyze(trainer_state(tmp_path / "trainer_state.json", rows))
    assert result.verdict == verdict, result.evidence
    assert result.kind == "nan"



def test_an_end_a_unit_of_the_last_digit_above_its_level_is_rounding(tmp_path: Path) -> None:
    """A loss written to 4 decimals that sat at 0.0001 and ends at 0.0002 is "2x" only in
    rounding: no worse. An evaluation loss that rose meanwhile while the training loss fell is
    overfitting, said as a note."""
    losses = [max(round(0.3 * math.exp(-i / 6), 4), 0.0001) for i in range(80)]
    losses += [0.0002, 0.0001, 0.0002, 0.0002, 0.0003, 0.0002] * 4
    rows = [{"step": 25 * (i + 1), "loss": v} for i, v in enumerate(losses)]
    evals = [{"step": 25 * 10 * (i + 1), "eval_loss": v, "eval_wer": w} for i, (v, w) in
             enumerate(zip([0.5, 0.36, 0.321, 0.33, 0.358, 0.37, 0.394, 0.40, 0.412, 0.42,
                            0.42, 0.42, 0.42], [0.9, 0.8, 0.79, 0.77, 0.75, 0.745, 0.743, 0.745,
                                                0.745, 0.745, 0.745, 0.745, 0.745],
                           strict=True))]
    result = analyze(trainer_state(tmp_path / "trainer_state.json", rows, evals))
    assert result.verdict == "healthy", result.evidence
    assert any("rose while the training loss fell (overfitting)" in line
               for line in result.evidence), result.evidence
    # the same end written in full precision is a real doubling of the level
    assert ended_worse(0.0002, 0.0001, [0.0002] * 20)


# -- a term of the loss ----------------------------------------------------------------------------
def _terms(path: Path, nan_rows: range, rows: int = 40) -> Path:
    """A detector's two loss terms, printed side by side with no total; the second is NaN on
    `nan_rows` while the first keeps falling."""
    lines = []
    for i in range(rows):
        second = "nan" if i in nan_rows else f"{4.0 - 0.02 * i:.4f}"
        lines.append(f"iter {10 * (i + 1)}/9000 || ARM_L Loss: {3.0 - 0.01 * i:.4f} "
                     f"ODM_L Loss: {second} ||")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_term_of_the_loss_nan_to_the_end_is_no_recovery(tmp_path: Path) -> None:
    result = analyze(_terms(tmp_path / "train.log", range(30, 40)))
    assert (result.verdict, result.kind, result.onset_step) == ("degraded", "nan", 310)
    assert any("ODM_L Loss" in line for line in result.evidence)


def test_a_term_of_the_loss_nan_for_a_while_has_passed(tmp_path: Path) -> None:
    result = analyze(_terms(tmp_path / "train.log", range(20, 23)))
    assert result.verdict != "degraded", result.evidence


@pytest.mark.parametrize("losses, onset", [
    # above twice the first loss from the first update on, judged once the run settled
    ([4.5, 10.6, 12.9, 9.9, 10.8, 15.4, 15.7, 14.2, 17.0, 16.8, 16.2], 1),
    # the second update took it there
    ([4.5, 4.1, 10.2, 12.9, 9.9, 10.8, 15.4, 15.7, 14.2, 17.0, 16.8, 16.2], 2),
])
def test_a_blow_up_of_the_first_updates_starts_at_the_first_row_above_its_bound(
        tmp_path: Path, losses: list[float], onset: int) -> None:
    path = tmp_path / "log.csv"
    path.write_text("step,train/loss\n" + "".join(f"{i},{v}\n" for i, v in enumerate(losses)))
    result = analyze(path)
    assert result.verdict == "degraded"
    assert result.onset_step == onset


@pytest.mark.parametrize("tail, verdict", [
    ([0.95, 1.25, 0.27], "recovered"),   # the end within the swings single batches made before
    ([3.2, 3.6, 3.0], "degraded"),       # far beyond them: worse, however noisy the start
])
def test_an_end_within_the_noise_of_single_batches_is_not_degraded(
        tmp_path: Path, tail: list[float], verdict: str) -> None:
    """Seven rows of one batch's loss each, logged every step (0.2-0.85 while healthy), then
    two high rows and one back at the level: the end (the median of the last three rows) at
    2.7x the level before is no worse than those rows' own swings; an end at 9x is."""
    losses = [0.83, 0.24, 0.41, 0.21, 0.35, 0.66, 0.25, *tail]
    rows = [{"loss": v, "learning_rate": 2e-5, "epoch": 2.5 + 0.04 * i}
            for i, v in enumerate(losses)]
    path = tmp_path / "console.txt"
    path.write_text("".join(f"{row}\n" for row in rows))
    result = analyze(path)
    assert result.verdict == verdict, result.evidence


def test_a_trend_before_the_trouble_is_no_noise(tmp_path: Path) -> None:
    """A loss falling fast from 8 to 2 (its levels far apart, its steps regular), a spike, then
    held at 8: the rows before the trouble barely swing from one to the next, so the end is
    worse, not within their noise."""
    losses = [8.0 * 0.86 ** i for i in range(10)] + [40.0] + [8.2] * 9
    lines = [f"step {10 * (i + 1)} loss {v:.4f}" for i, v in enumerate(losses)]
    path = tmp_path / "train.log"
    path.write_text("\n".join(lines) + "\n")
    assert analyze(path).verdict == "degraded"


def keras_epochs(path: Path, losses: list[float], first: int = 140) -> Path:
    """Keras's progress output, one line of epoch means per epoch (28980 batches each)."""
    lines = []
    for epoch, value in enumerate(losses, start=first):
        lines += [f"Epoch {epoch}/500", "28980/28980 [==============================] - 25s "
                  f"873us/step - loss: {value:.4f} - val_loss: {value + 2.4:.4f}"]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(("bump", "verdict"), [(1.07, "healthy"), (1.3, "healthy"),
                                               (1.6, "recovered"), (3.0, "recovered")])
def test_an_epoch_mean_that_bumps_and_comes_back_is_a_spike_only_from_1_5x(
        tmp_path: Path, bump: float, verdict: str) -> None:
    """Epoch means of a flat loss: a bump the next epochs come back from, a few percent up,
    is no spike however smooth the means around it; one 1.5x its level or more is."""
    rng = random.Random(0)
    losses = [15.5 * (1 + 0.008 * rng.gauss(0, 1)) for _ in range(11)]
    losses[2], losses[3] = 15.5 * bump, 15.5 * (1 + 0.4 * (bump - 1))
    result = analyze(keras_epochs(tmp_path / "log.txt", losses))
    assert result.verdict == verdict, result.evidence
    assert [e.kind for e in result.events] == ["loss_spike"]


@pytest.mark.parametrize("interval", [10, 50, 500])
def test_a_spike_whose_first_row_is_small_is_judged_by_how_far_it_went(
        tmp_path: Path, interval: int) -> None:
    """Rows of averaged steps: 1.4x, then 20x, then back. The episode's one event carries the
    first row's ratio; the verdict reads how far the loss went (a recovered spike, not a bump)."""
    rng = random.Random(0)
    losses = [2.0 + 3.0 * math.exp(-i / 15) + rng.gauss(0, 0.02) for i in range(120)]
    for row, factor in zip((80, 81, 82), (1.4, 20.0, 1.3), strict=True):
        losses[row] *= factor
    rows = [{"loss": v, "grad_norm": 1.0, "learning_rate": 1e-4, "step": (i + 1) * interval}
            for i, v in enumerate(losses)]
    result = analyze(trainer_state(tmp_path / "trainer_state.json", rows))
    assert result.verdict == "recovered", result.evidence
