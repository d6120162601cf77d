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
from trainguard.detect import LossSpike

WARMUP = default_config().common.warmup_steps


def smooth(n: int, level: float = 2.3, seed: int = 0, noise: float = 0.01) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return level * np.exp(rng.normal(0.0, noise, n))


def test_a_spike_records_what_the_model_scores_allow_and_says_when_the_loss_is_beyond() -> None:
    detector = LossSpike(default_config())
    bound = {"ce_ceiling": np.array(12.0, dtype=np.float32)}
    assert run(detector, loss_run(smooth(100, 2.3, noise=0.05), precursors=bound)) == []
    # beyond the ceiling no batch of data gets: told at once at its size, no outlier batch
    event, = run(detector, loss_run([2.3e6], start=100, precursors=bound))
    assert (event.severity, event.details["ce_ceiling"]) == ("error", 12.0)
    assert "1.92e+05x the most a cross-entropy of the model's own class scores" in event.message
    assert "outlier" not in event.message and detector.outlier is None
    # within the ceiling (a batch the model misreads): an outlier batch, its ceiling recorded,
    # and told again with it where the loss has not come back
    detector = LossSpike(default_config())
    run(detector, loss_run(smooth(100, 2.3, noise=0.05), precursors=bound))
    event, = run(detector, loss_run([11.0], start=100, precursors=bound))
    assert event.details["ce_ceiling"] == 12.0 and "class scores" not in event.message
    assert event.severity == "info"
    again, = run(detector, loss_run([11.0], start=101,
                                    precursors={"ce_ceiling": np.array(1e9, dtype=np.float32)}))
    assert (again.severity, again.details["jump_step"], again.details["ce_ceiling"]) == (
        "warning", 100, 12.0)
    # the jump's step not measured (the precursor probes' cadence), the next one measured:
    # its scores tell that the loss still stands beyond them
    detector = LossSpike(default_config())
    run(detector, loss_run(smooth(100, 2.3, noise=0.05), precursors=bound))
    event, = run(detector, loss_run([2.3e3], start=100))
    assert event.severity == "info" and "ce_ceiling" not in event.details
    again, = run(detector, loss_run([2.3e3], start=101, precursors=bound))
    assert (again.severity, again.details["ce_ceiling"]) == ("error", 12.0)
    assert "at step 101 the loss 2300 is 192x the most a cross-entropy" in again.message
    # not measured: nothing recorded
    detector = LossSpike(default_config())
    run(detector, loss_run(smooth(100, 2.3, noise=0.05)))
    event, = run(detector, loss_run([2.3e6], start=100))
    assert "ce_ceiling" not in event.details


def test_rocket_launch_is_an_outlier_then_an_error_when_it_stays() -> None:
    """At once the jump is known, its harm is not: an outlier batch (info, naming its step),
    told again at the next step as an error when the loss has not come back."""
    detector = LossSpike(default_config())
    assert run(detector, loss_run(smooth(100, 2.3, noise=0.05))) == []
    event, = run(detector, loss_run([1e8], start=100))
    assert (event.kind, event.step, event.severity) == ("loss_spike", 100, "info")
    assert "the batch of step 100 is an outlier" in event.message
    assert event.value == 1e8
    assert event.details["baseline"] == pytest.approx(2.3, rel=0.05)
    assert event.details["ratio"] == pytest.approx(1e8 / 2.3, rel=0.05)
    again, = run(detector, loss_run([3e7], start=101))
    assert (again.kind, again.step, again.severity) == ("loss_spike", 101, "error")
    assert again.value == 1e8 and again.details["jump_step"] == 100
    assert again.details["ratio"] == pytest.approx(1e8 / 2.3, rel=0.05)
    assert "has not come back: 3e+07 at step 101" in again.message


def test_rocket_launch_is_caught_before_warmup() -> None:
    detector = LossSpike(default_config())
    events = run(detector, loss_run([2.3, 2.31, 2.29, 1e8, 1e8]))
    assert [(e.step, e.severity) for e in events] == [(3, "info"), (4, "error")]


@pytest.mark.parametrize("ratio", [3.0, 50.0, 500.0])
def test_a_one_batch_jump_the_run_comes_back_from_stays_an_outlier(ratio: float) -> None:
    """However far out (a heavy-tailed target, a mislabelled sample), a jump whose next loss is
    back at its level did no lasting harm: it stays an info naming its batch."""
    detector = LossSpike(default_config())
    run(detector, loss_run(smooth(100, 1.2, noise=0.05)))
    events = run(detector, loss_run([ratio * 1.2, *smooth(100, 1.2, seed=1, noise=0.05)],
                                    start=100))
    assert [(e.step, e.severity) for e in events] == [(100, "info")]


@pytest.mark.parametrize("after", [NAN, INF])
def test_a_jump_that_goes_on_to_nan_did_harm(after: float) -> None:
    detector = LossSpike(default_config())
    run(detector, loss_run(smooth(100, 1.2, noise=0.05)))
    events = run(detector, loss_run([4.0, after], start=100))
    assert [(e.step, e.severity) for e in events] == [(100, "info"), (101, "warning")]


def test_a_step_without_a_loss_leaves_the_outlier_waiting() -> None:
    detector = LossSpike(default_config())
    run(detector, loss_run(smooth(100, 1.2, noise=0.05)))
    events = run(detector, [*loss_run([4.0], start=100), signals(101, loss=None),
                            *loss_run([4.2], start=102)])
    assert [(e.step, e.severity) for e in events] == [(100, "info"), (102, "warning")]


def test_threefold_jump_on_a_smooth_curve_is_a_warning_when_it_stays() -> None:
    detector = LossSpike(default_config())
    losses = smooth(200, 1.2)
    assert run(detector, loss_run(losses)) == []
    jump = 3.0 * float(losses[-50:].max())  # 3x every recent loss
    event, again = run(detector, loss_run([jump, jump], start=200))
    assert (event.step, event.severity, again.step, again.severity) == (
        200, "info", 201, "warning")
    assert event.details["ratio"] >= 3.0


def test_threefold_jump_on_a_slowly_declining_curve_is_a_warning_when_it_stays() -> None:
    found = {}
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        losses = 2.3 * np.exp(-0.0009 * np.arange(300) + rng.normal(0.0, 0.01, 300))
        detector = LossSpike(default_config())
        assert run(detector, loss_run(losses)) == []
        jump = 3.0 * float(losses[-1])
        events = run(detector, loss_run([jump, jump], start=300))
        found[seed] = [(e.step, e.severity) for e in events]
    assert found == {seed: [(300, "info"), (301, "warning")] for seed in SEEDS}


def test_spike_is_admitted_to_the_baseline_winsorised() -> None:
    detector = LossSpike(default_config())
    run(detector, loss_run(smooth(100, 1.0, noise=0.05)))
    median = detector.baseline.recent_median(default_config().loss_spike.level_window)
    run(detector, loss_run([1e8], start=100))
    assert detector.baseline.values[-1] == pytest.approx(
        median + math.log(default_config().loss_spike.ratio))


def test_threefold_fluctuation_on_a_very_noisy_curve_is_not_a_spike() -> None:
    rng = np.random.default_rng(0)
    losses = 2.0 * np.exp(rng.normal(0.0, 0.5, 200))
    detector = LossSpike(default_config())
    assert run(detector, loss_run(losses)) == []
    median = float(np.median(losses[-50:]))
    assert run(detector, loss_run([3.0 * median, 3.5 * median], start=200)) == []


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("noise", [0.02, 0.1, 0.3, 0.5])
def test_silent_on_a_healthy_run(seed: int, noise: float) -> None:
    losses = healthy_losses(HEALTHY_STEPS, seed, noise=noise)
    assert run(LossSpike(default_config()), loss_run(losses)) == []


def test_silent_on_a_fast_initial_drop() -> None:
    losses = 0.5 + 10.0 * np.exp(-np.arange(300) / 10.0)
    assert run(LossSpike(default_config()), loss_run(losses)) == []


@pytest.mark.parametrize("bad", [NAN, INF, -INF, 0.0, -1.5, None])
def test_bad_losses_neither_crash_nor_poison_the_baseline(bad: float | None) -> None:
    detector = LossSpike(default_config())
    run(detector, loss_run(smooth(100, 1.0, noise=0.05)))
    before = (len(detector.baseline), detector.baseline.stats())
    assert run(detector, [signals(100 + i, loss=bad) for i in range(30)]) == []
    assert (len(detector.baseline), detector.baseline.stats()) == before
    assert run(detector, loss_run(smooth(20, 1.0, seed=1, noise=0.05), start=130)) == []
    event, = run(detector, loss_run([5.0], start=150))
    assert (event.step, event.severity) == (150, "info")


def test_no_threefold_event_before_warmup() -> None:
    early = LossSpike(default_config())
    assert run(early, loss_run([*smooth(WARMUP - 1, 1.0), 3.5])) == []
    warm = LossSpike(default_config())
    assert steps_of(run(warm, loss_run([*smooth(WARMUP, 1.0), 3.5]))) == [WARMUP]


def test_nonfinite_losses_do_not_count_towards_warmup() -> None:
    detector = LossSpike(default_config())
    losses = list(smooth(WARMUP - 1, 1.0)) + [NAN] * 20 + [3.5]
    assert run(detector, loss_run(losses)) == []


def test_one_event_per_sustained_episode_and_rearmed_after_recovery() -> None:
    detector = LossSpike(default_config())
    losses = np.concatenate([smooth(100, 1.0, seed=0, noise=0.05),
                             smooth(10, 10.0, seed=1, noise=0.05),   # sustained 10x
                             smooth(50, 1.0, seed=2, noise=0.05),    # recovery
                             smooth(3, 8.0, seed=3, noise=0.05)])    # second episode
    # each: an outlier at once, a warning at the next step, where it has not come back
    assert [(e.step, e.severity) for e in run(detector, loss_run(losses))] == [
        (100, "info"), (101, "warning"), (160, "info"), (161, "warning")]


def test_an_episode_hovering_around_the_threshold_is_one_event() -> None:
    steps_by_seed = {}
    for seed in SEEDS:
        losses = np.concatenate([smooth(100, 1.0, seed=seed, noise=0.05),
                                 smooth(20, 3.3, seed=seed + 1, noise=0.1),
                                 smooth(50, 1.0, seed=seed + 2, noise=0.05)])
        steps_by_seed[seed] = steps_of(run(LossSpike(default_config()), loss_run(losses)))
    assert steps_by_seed == {seed: [100, 101] for seed in SEEDS}


def test_severity_follows_the_error_ratio() -> None:
    detector = LossSpike(default_config())
    run(detector, loss_run(smooth(100, 1.0, noise=0.05)))
    _, warning = run(detector, loss_run([50.0, 40.0], start=100))
    run(detector, loss_run(smooth(50, 1.0, seed=1, noise=0.05), start=102))
    _, error = run(detector, loss_run([500.0, 40.0], start=152))
    assert (warning.severity, error.severity) == ("warning", "error")


def test_state_round_trip_preserves_behaviour() -> None:
    config = default_config()
    original = LossSpike(config)
    prefix = loss_run([*smooth(100, 1.0, noise=0.05), 10.0, 11.0])
    assert steps_of(run(original, prefix)) == [100, 101]
    clone = restored(original)
    assert clone.state_dict() == original.state_dict()
    continuation = loss_run([12.0, *smooth(5, 1.0, seed=1, noise=0.05), 4.0,
                             *smooth(20, 1.0, seed=2, noise=0.05)], start=102)
    events = assert_same_decisions(original, clone, continuation)
    assert [(e.step, e.severity) for e in events] == [(108, "info")]
    # the state matters: a fresh detector (not warm) lets the 4x jump pass
    assert run(LossSpike(config), continuation) == []
    assert math.isclose(events[0].details["baseline"], 1.0, rel_tol=0.1)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_loss_converged_to_float_noise_makes_no_spike(seed: int) -> None:
    """Jumps of 10x and more between 1e-15 and 1e-13 in a run that started at 1 are rounding."""
    assert run(LossSpike(default_config()), loss_run(converged_to_noise(1000, seed))) == []


def test_a_real_jump_from_float_noise_is_still_a_spike() -> None:
    losses = np.concatenate([converged_to_noise(1000, 0), [0.5, 0.5]])
    events = run(LossSpike(default_config()), loss_run(losses))
    assert [(e.step, e.severity) for e in events] == [(1000, "info"), (1001, "error")]


@pytest.mark.parametrize("after", [4.0, 1.0], ids=["stays up", "comes back"])
def test_an_outlier_waiting_for_its_next_step_survives_a_state_round_trip(after: float) -> None:
    original = LossSpike(default_config())
    run(original, loss_run([*smooth(100, 1.0, noise=0.05), 4.0]))
    clone = restored(original)
    events = assert_same_decisions(original, clone, loss_run([after], start=101))
    assert [(e.step, e.severity) for e in events] == ([(101, "warning")] if after > 2 else [])


@pytest.mark.parametrize("policy, action", [("observe", "applied"), ("protect", "clipped")])
def test_a_heavy_tailed_regression_that_absorbs_a_far_out_target_is_told_it_as_an_outlier(
        policy: str, action: str) -> None:
    """A real MLP regression on Student-t targets (3 degrees of freedom) whose batch of step 120
    holds one target 150 away from its fit: the loss jumps about 200x and the gradient about
    15x for that step, and the next steps are back where they were. Before the outlier's harm
    was judged from the steps after it, this run got a `loss_spike` error and a
    `grad_explosion` warning there. `protect` clips the outlier's step all the same (the jump
    puts the adaptive clip in its alarm whatever its severity); `observe` changes nothing."""
    import torch
    from torch import nn

    import trainguard

    generator = torch.Generator().manual_seed(0)
    weights = torch.randn(16, 1, generator=generator) / 4
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    guard = trainguard.Guard(model, optimizer,
                             config=trainguard.GuardConfig(policy=policy, sinks={"console": False}))
    losses, actions = [], []
    for step in range(140):
        x = torch.randn(32, 16, generator=generator)
        chi2 = (torch.randn(32, 3, generator=generator) ** 2).sum(1, keepdim=True)
        y = x @ weights + torch.sin(x[:, :1] * 2) + torch.randn(
            32, 1, generator=generator) / torch.sqrt(chi2 / 3)
        if step == 120:
            y[0, 0] += 150.0
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        report = guard.step(loss, batch={"x": x, "y": y})
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        actions.append(None if report is None else report.action)
    guard.close()
    assert actions[120] == action
    assert losses[120] > 100 * np.median(losses[100:120])  # far out, and back the step after
    assert losses[121] < 2 * np.median(losses[100:120])
    assert [(e.step, e.message) for e in guard.events if e.severity != "info"] == []
    told = [e for e in guard.events if e.kind == "loss_spike"]
    assert [(e.step, e.severity) for e in told] == [(120, "info")]
    assert "the batch of step 120 is an outlier" in told[0].message
    verdict = guard.verdict
    assert verdict is not None and verdict.verdict == "healthy"
