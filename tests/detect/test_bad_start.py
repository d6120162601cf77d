from __future__ import annotations

import math

import numpy as np
import pytest

from tests.detect.synth import SEEDS, default_config, healthy_losses, loss_run, run, steps_of
from trainguard.detect import BadStart

WARMUP = default_config().common.warmup_steps


def test_an_enormous_first_loss_that_falls_away_is_a_bad_start() -> None:
    losses = [58.9, 30.0, 9.0, 3.0, 1.0, 0.5, 0.4, 0.35, 0.3, 0.3, 0.28, 0.3, 0.25]
    events = run(BadStart(default_config()), loss_run(losses))
    assert steps_of(events) == [WARMUP]
    [event] = events
    assert event.details["cause"] == "bad_init" and event.details["ratio"] > 100


@pytest.mark.parametrize("seed", SEEDS)
def test_silent_on_healthy_declines(seed: int) -> None:
    assert run(BadStart(default_config()), loss_run(healthy_losses(200, seed))) == []


def test_checked_once_and_blind_to_non_finite_losses() -> None:
    losses = [math.nan, 100.0, 50.0] + [1.0] * 30 + [1000.0]
    events = run(BadStart(default_config()), loss_run(losses))
    assert steps_of(events) == [WARMUP]  # the NaN is not the "first loss"; later jumps ignored


def test_a_fast_but_normal_fall_is_not_flagged() -> None:
    losses = 2.3 * np.exp(-0.2 * np.arange(40))  # 2.3 -> ~0.3 by step 10: 7x
    assert run(BadStart(default_config()), loss_run(losses)) == []


def test_a_preference_loss_learned_fast_is_no_bad_initialisation() -> None:
    """A DPO loss starts at ln 2 whatever the initialisation (the policy against a copy of
    itself): one that falls to 1e-9 in ten steps (beta 2) learned its pairs, it did not shed an
    enormous start. The same losses without preference rewards are a bad start."""
    losses = [math.log(2), 0.14, 1e-3, 1e-5, 1e-7] + [1e-9] * 20
    metrics = {"rewards/chosen": 0.0, "rewards/rejected": 0.0}
    steps = loss_run(losses, trainer_metrics=metrics)
    assert run(BadStart(default_config()), steps) == []
    assert [e.details["cause"] for e in run(BadStart(default_config()), loss_run(losses))] == [
        "bad_init"]
    # ... and a preference loss the first updates made worse is still told
    worse = [math.log(2), 1.9, 2.4, 2.1, 2.2, 2.3, 2.0, 2.2, 2.4, 2.1, 2.2, 2.3]
    [event] = run(BadStart(default_config()), loss_run(worse, trainer_metrics=metrics))
    assert event.details["cause"] == "lr_too_high"


def test_a_run_blown_up_by_its_first_updates_is_a_bad_start_too() -> None:
    losses = [4.0, 8.5, 12.4, 9.3, 8.9, 8.8, 7.8, 9.2, 10.8, 9.4, 6.7, 7.5, 8.1]
    [event] = run(BadStart(default_config()), loss_run(losses))
    assert event.step == WARMUP and event.details["cause"] == "lr_too_high"
    assert event.details["ratio"] > 2
    # what a replay of the first steps judges: the loss, against twice the first one
    assert event.details["signal"] == "loss" and event.details["bound"] == 8.0


def test_a_blow_up_that_does_not_fade_is_reported_again_for_the_learning_rate() -> None:
    cfg = default_config()
    stays_up = [4.0, 8.5, 12.4, 9.3, 8.9, 8.8, 7.8, 9.2, 10.8, 9.4] + [8.0] * 60
    events = run(BadStart(cfg), loss_run(stays_up))
    assert steps_of(events) == [WARMUP, cfg.common.baseline_window]
    assert events[1].details["sustained"] and events[1].details["cause"] == "lr_too_high"
    fades = [4.0, 8.5, 12.4, 9.3, 8.9, 8.8, 7.8, 9.2, 10.8, 9.4] + list(
        np.linspace(9.0, 3.5, 30)) + [3.5] * 30
    assert steps_of(run(BadStart(cfg), loss_run(fades))) == [WARMUP]
    # still 1.5x the first loss at step 50, but down to a third of its level at step 10: fading
    fading = [1.0, 20.0, 12.0, 11.0, 10.0, 10.5, 9.5, 10.0, 9.0, 10.0] + list(
        np.linspace(9.0, 3.0, 40)) + [2.5] * 20
    assert steps_of(run(BadStart(cfg), loss_run(fading))) == [WARMUP]
