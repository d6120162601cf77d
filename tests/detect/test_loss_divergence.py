from __future__ import annotations

import math

import numpy as np
import pytest

from tests.detect.synth import (
    HEALTHY_STEPS,
    INF,
    NAN,
    SEEDS,
    assert_same_decisions,
    converged_to_noise,
    default_config,
    healthy_losses,
    loss_run,
    restored,
    run,
    signals,
    steps_of,
)
from trainguard.detect import LossDivergence

WARMUP = default_config().common.warmup_steps


def plateau(n: int, level: float = 1.0, seed: int = 0, noise: float = 0.1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return level * np.exp(rng.normal(0.0, noise, n))


def settle_then_climb(seed: int, settle: int = 200, climb: int = 150,
                      rate: float = 0.01) -> np.ndarray:
    """A healthy decline that settles, then the loss rises `rate` per step (with noise)."""
    rng = np.random.default_rng(seed + 100)
    first = healthy_losses(settle, seed, tau=40.0)
    rising = 0.7 * (1 + rate) ** np.arange(1, climb + 1) * np.exp(rng.normal(0.0, 0.1, climb))
    return np.concatenate([first, rising])


@pytest.mark.parametrize("seed", SEEDS)
def test_slow_sustained_climb_fires_once(seed: int) -> None:
    detector = LossDivergence(default_config())
    events = run(detector, loss_run(settle_then_climb(seed)))
    event, = events
    assert (event.kind, event.severity) == ("loss_divergence", "error")
    # 1%/step needs ~41 steps to reach 1.5x, plus the median's lag (5) and the patience (10)
    assert 240 <= event.step <= 270
    assert event.details["ratio"] >= 1.5
    assert event.details["best"] == pytest.approx(0.7, rel=0.1)
    assert event.value == pytest.approx(event.details["ratio"] * event.details["best"])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("noise", [0.05, 0.1, 0.2, 0.3])
def test_silent_on_a_noisy_plateau(seed: int, noise: float) -> None:
    losses = np.concatenate([healthy_losses(100, seed, tau=20.0),
                             plateau(HEALTHY_STEPS - 100, 0.7, seed + 1, noise)])
    assert run(LossDivergence(default_config()), loss_run(losses)) == []


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("noise", [0.02, 0.1, 0.3, 0.5])
def test_silent_on_a_healthy_declining_run(seed: int, noise: float) -> None:
    losses = healthy_losses(HEALTHY_STEPS, seed, noise=noise)
    assert run(LossDivergence(default_config()), loss_run(losses)) == []


def test_a_low_first_loss_on_a_plateau_is_not_divergence() -> None:
    fired = {}
    for seed in SEEDS:
        losses = plateau(HEALTHY_STEPS, 1.0, seed, noise=0.2)
        losses[0] = 0.5  # the first batch happened to be easy
        fired[seed] = steps_of(run(LossDivergence(default_config()), loss_run(losses)))
    assert fired == {seed: [] for seed in SEEDS}


def test_noisy_plateaus_from_the_first_step_are_silent() -> None:
    fired = [seed for seed in range(40)
             if run(LossDivergence(default_config()), loss_run(plateau(500, 1.0, seed, 0.3)))]
    assert fired == []


def test_a_single_rocket_launch_spike_is_not_divergence() -> None:
    losses = np.concatenate([healthy_losses(300, 0), [1e8], plateau(100, 0.75, 1, 0.1)])
    assert run(LossDivergence(default_config()), loss_run(losses)) == []


def test_a_single_huge_spike_is_not_divergence() -> None:
    losses = np.concatenate([healthy_losses(300, 0), [1e12], plateau(100, 0.75, 1, 0.1)])
    assert run(LossDivergence(default_config()), loss_run(losses)) == []


@pytest.mark.parametrize("bad", [NAN, INF, -INF, 0.0, -2.0, None])
def test_bad_losses_neither_crash_nor_change_the_state(bad: float | None) -> None:
    detector = LossDivergence(default_config())
    losses = settle_then_climb(0)
    run(detector, loss_run(losses[:200]))
    before = detector.state_dict()
    assert run(detector, [signals(200 + i, loss=bad) for i in range(40)]) == []
    assert detector.state_dict() == before
    # the climb that follows is still found, on the same step (offset by the 40 bad steps)
    reference = LossDivergence(default_config())
    expected = steps_of(run(reference, loss_run(losses)))
    assert steps_of(run(detector, loss_run(losses[200:], start=240))) \
        == [s + 40 for s in expected]


def test_no_event_before_warmup() -> None:
    config = default_config(loss_divergence={"patience": 1})
    # the loss is 10x higher from step 1 on: without warm-up this fires around step 5
    losses = [1.0] + [10.0] * 100
    fired = steps_of(run(LossDivergence(config), loss_run(losses)))
    assert len(fired) == 1
    assert fired[0] >= WARMUP


def test_nonfinite_losses_do_not_count_towards_warmup() -> None:
    config = default_config(loss_divergence={"patience": 1})
    losses = [1.0] + [10.0] * 4 + [NAN] * 20 + [10.0] * 100
    fired = steps_of(run(LossDivergence(config), loss_run(losses)))
    assert len(fired) == 1
    assert fired[0] >= WARMUP + 20  # the 20 NaN steps did not count


def test_one_event_per_episode_and_rearmed_after_recovery() -> None:
    first = settle_then_climb(0)
    recovery = plateau(200, 0.7, seed=7)
    second = 0.7 * 1.01 ** np.arange(1, 151)
    losses = np.concatenate([first, recovery, second])
    events = run(LossDivergence(default_config()), loss_run(losses))
    assert len(events) == 2
    assert 240 <= events[0].step <= 320
    assert 550 + 40 <= events[1].step <= 550 + 120


def test_state_round_trip_preserves_behaviour() -> None:
    config = default_config()
    losses = settle_then_climb(1)
    fires_at, = steps_of(run(LossDivergence(config), loss_run(losses)))
    cut = fires_at - 8  # in the middle of the patience count
    original = LossDivergence(config)
    assert run(original, loss_run(losses[:cut])) == []
    assert original.above > 0
    clone = restored(original)
    assert clone.state_dict() == original.state_dict()
    continuation = loss_run(losses[cut:], start=cut)
    events = assert_same_decisions(original, clone, continuation)
    assert steps_of(events) == [fires_at]
    # the state matters: a fresh detector has no best value from before the climb, so it takes
    # longer to see one
    assert all(step > fires_at for step in steps_of(run(LossDivergence(config), continuation)))


def test_state_is_json_safe_before_the_first_loss() -> None:
    clone = restored(LossDivergence(default_config()))
    assert clone.seen == 0 and clone.best == math.inf
    assert steps_of(run(clone, loss_run(settle_then_climb(2)))) != []


def test_a_blow_up_in_the_first_steps_that_stays_up_is_divergence() -> None:
    """The warm-up's median counts as a best level: a run that goes from 4 to 7 just after its
    first ten steps and stays there is diverging, though it never improved after warm-up."""
    rng = np.random.default_rng(0)
    losses = np.concatenate([np.full(10, 4.0), np.linspace(4.0, 7.0, 4), np.full(80, 7.0)])
    losses = losses * np.exp(rng.normal(0.0, 0.03, losses.size))
    events = run(LossDivergence(default_config()), loss_run(losses))
    assert len(events) == 1 and events[0].step < 60


@pytest.mark.parametrize("seed", SEEDS)
def test_a_loss_converged_to_float_noise_is_not_divergence(seed: int) -> None:
    """A regression at 1e-14 that wobbles up to 1e-13 rises 10x over its best, but by 1e-13 of
    a run that started at 1: rounding, which must not halt a healthy run."""
    losses = converged_to_noise(1000, seed)
    assert max(losses[600:]) / min(losses[500:600]) > 10  # the ratio alone would fire
    assert run(LossDivergence(default_config()), loss_run(losses)) == []


def test_a_real_divergence_after_converging_to_float_noise_still_fires() -> None:
    climb = 1e-14 * 1.2 ** np.arange(1, 151)  # from the noise floor up to ~1e-2
    losses = np.concatenate([converged_to_noise(1000, 0), climb])
    event, = run(LossDivergence(default_config()), loss_run(losses))
    assert (event.kind, event.severity) == ("loss_divergence", "error")
    assert event.step >= 1000 and event.value > 1e-7  # once the rise is beyond float noise


def test_the_start_scale_survives_a_state_round_trip() -> None:
    losses = converged_to_noise(1000, 1)
    detector = LossDivergence(default_config())
    run(detector, loss_run(losses[:600]))
    assert run(restored(detector), loss_run(losses[600:], start=600)) == []


@pytest.mark.parametrize("seed", SEEDS)
def test_a_lane_plan_admits_no_loss_that_could_count_towards_a_divergence(seed: int) -> None:
    """`calm_plan`: while every step keeps the plan, `check` (run on the same steps) never
    counts one above its best; a climb is refused at the step `check` starts counting."""
    detector = LossDivergence(default_config())
    assert detector.calm_plan() is None  # nothing seen
    steps = loss_run(healthy_losses(200, seed))
    run(detector, steps)
    plan = detector.calm_plan()
    assert plan is not None
    climb = np.concatenate([plateau(40, level=0.7, seed=seed),
                            0.7 * np.exp(np.linspace(0.0, 1.5, 80))])
    climb[20] *= 40.0  # one outlier batch: the moving average takes it winsorised
    refused = None
    for i, loss in enumerate(climb):
        if not plan.admits(float(loss)):
            refused = i
            break
        assert run(detector, loss_run([float(loss)], start=200 + i)) == []
        assert detector.above == 0
        assert (plan.raw, plan.seen, plan.best) == (detector.raw, detector.seen, detector.best)
    assert refused is not None and refused >= 40  # the plateau kept it, the climb did not
    run(detector, loss_run([float(climb[refused])], start=200 + refused))
    assert detector.above == 1  # refused where `check` starts counting, not before
    assert plan.admits(math.nan) and plan.admits(0.0)  # no log: `check` passes over it
