"""The recover policy's judgement on host signals alone."""

from __future__ import annotations

import math

import numpy as np

from trainguard import DetectorConfig, Event, RecoveryConfig
from trainguard.recovery import RecoveryController
from trainguard.signals import StepSignals


def _signals(step: int, loss: float, grad_norm: float = 1.0) -> StepSignals:
    return StepSignals(step=step, loss=loss, grad_norm=grad_norm,
                       param_grad_norm=np.array([grad_norm]), param_names=["w"])


def _spike(step: int) -> Event:
    return Event(kind="loss_spike", step=step, severity="error", message="spike")


def _controller(**settings: object) -> RecoveryController:
    return RecoveryController(RecoveryConfig(**settings), DetectorConfig(),  # type: ignore[arg-type]
                              sample_every=50)


def _calm(c: RecoveryController, steps: range, loss: float = 2.0) -> None:
    for step in steps:
        assert c.review(_signals(step, loss), []) is None


def test_a_spike_that_settles_costs_one_skipped_update() -> None:
    c = _controller(settle_steps=10)
    _calm(c, range(20))
    verdict = c.review(_signals(20, 50.0), [_spike(20)])
    assert verdict is not None and verdict.action == "skip" and verdict.bad_steps == [20]
    _calm(c, range(21, 40))
    assert c.trouble is None and c.rollbacks == 0


def test_a_jump_told_as_an_outlier_is_skipped_and_watched_all_the_same() -> None:
    """At once a jump is `info` (an outlier batch until the next steps show harm); the recover
    policy keeps its update out and watches, as for any jump. Another `info` event is no
    trouble."""
    c = _controller(settle_steps=10)
    _calm(c, range(20))
    note = Event(kind="lr_change", step=20, severity="info", message="LR noted")
    assert c.review(_signals(20, 2.0), [note]) is None
    outlier = Event(kind="grad_explosion", step=21, severity="info", message="outlier batch")
    verdict = c.review(_signals(21, 2.0, grad_norm=30.0), [outlier])
    assert verdict is not None and verdict.action == "skip" and verdict.bad_steps == [21]
    assert c.trouble is not None and c.trouble.start == 21


def test_a_spike_that_does_not_settle_rolls_back_to_before_it() -> None:
    c = _controller(settle_steps=5)
    _calm(c, range(20))
    c.review(_signals(20, 50.0), [_spike(20)])
    verdicts = [c.review(_signals(s, 4.5), [], applies_update=True) for s in range(21, 26)]
    assert [v.action if v else None for v in verdicts] == [None] * 4 + ["rollback"]
    rollback = verdicts[-1]
    assert rollback.onset == 19  # the update before the spike may be the one that did harm


def test_a_burst_of_bad_batches_is_skipped_whole_then_rolled_back_to_before_it() -> None:
    c = _controller(settle_steps=5)
    _calm(c, range(20))
    c.review(_signals(20, 50.0), [_spike(20)])
    verdicts = [c.review(_signals(s, 60.0), [], applies_update=False) for s in range(21, 26)]
    assert [v.action for v in verdicts] == ["skip"] * 4 + ["rollback"]
    # nothing was applied since the spike, but the update just before it was: the state from
    # before that update is the one to go back to
    assert verdicts[-1].onset == 19 and verdicts[-1].bad_steps == [20]


def test_divergence_rolls_back_at_once_to_before_its_estimated_start() -> None:
    det = DetectorConfig()
    c = _controller()
    event = Event(kind="loss_divergence", step=200, severity="error", message="diverging")
    verdict = c.review(_signals(200, 9.0), [event])
    assert verdict.action == "rollback"
    assert verdict.onset == (200 - det.loss_divergence.patience - det.loss_divergence.window // 2
                             - det.loss_divergence.span // 2)


def test_non_finite_streak_rolls_back_then_the_cap_halts() -> None:
    c = _controller(rollback_after_skips=2, max_rollbacks=1)
    _calm(c, range(5))
    assert c.review(_signals(5, math.nan, math.nan), []).action == "skip"
    assert c.review(_signals(6, math.nan, math.nan), []).action == "rollback"
    c.rolled_back()
    c.review(_signals(7, math.nan, math.nan), [])
    assert c.review(_signals(8, math.nan, math.nan), []).action == "halt"


def test_a_non_finite_trainer_metric_is_skipped_and_a_streak_rolls_back() -> None:
    """A NaN reward or KL under a finite loss: its gradients came from the same NaN."""
    c = _controller(rollback_after_skips=2)
    _calm(c, range(5))
    nan_kl = Event(kind="nonfinite_metric", step=5, severity="error", message="kl is NaN")
    verdict = c.review(_signals(5, 0.1), [nan_kl])
    assert verdict is not None and verdict.action == "skip" and verdict.bad_steps == [5]
    assert "trainer metrics" in verdict.reason
    assert c.review(_signals(6, 0.1), [nan_kl]).action == "rollback"


def test_an_instability_measured_to_come_from_the_lr_rolls_back_to_cut_it() -> None:
    """A KL that left its reference in the first updates names the LR: skipping would keep
    it, the rollback cuts it. One that drifted away at a steady LR names the penalty: no
    action, the LR is not what the run showed wrong."""
    c = _controller()
    _calm(c, range(5))
    early = Event(kind="kl_blowup", step=5, severity="warning", message="kl jumped",
                  details={"cause": "lr_too_high"})
    verdict = c.review(_signals(5, 0.1), [early])
    assert verdict is not None and verdict.action == "rollback" and verdict.onset <= 5
    drift = Event(kind="kl_blowup", step=6, severity="warning", message="kl drifted",
                  details={"cause": "beta_too_low"})
    assert _controller().review(_signals(6, 0.1), [drift]) is None


def test_state_round_trip_in_the_middle_of_trouble() -> None:
    c = _controller()
    _calm(c, range(20))
    c.review(_signals(20, 50.0), [_spike(20)])
    other = _controller()
    other.load_state_dict(c.state_dict())
    assert other.state_dict() == c.state_dict()


def _desync(step: int, **details: object) -> Event:
    return Event(kind="ddp_desync", step=step, severity="error", message="replicas differ",
                 details=dict(details))


def test_a_desync_rolls_back_to_when_the_replicas_last_agreed() -> None:
    c = _controller()
    _calm(c, range(12))
    verdict = c.review(_signals(12, 2.0), [_desync(12, last_agreed_step=8)])
    assert verdict is not None and verdict.action == "rollback" and verdict.onset == 8
    assert "ddp_desync" in verdict.reason
    # without a check that found them equal, back to the start
    assert _controller().review(_signals(12, 2.0), [_desync(12)]).onset == 0


def test_a_desync_under_the_rollback_cap_halts() -> None:
    c = _controller(max_rollbacks=1)
    c.review(_signals(4, 2.0), [_desync(4, last_agreed_step=0)])
    c.rolled_back()
    verdict = c.review(_signals(8, 2.0), [_desync(8, last_agreed_step=4)])
    assert verdict is not None and verdict.action == "halt" and verdict.onset == 4


def _raise(step: int, ratio: float) -> Event:
    """The `lr_change` event of a loop that multiplied the LR by `ratio` at `step`."""
    return Event(kind="lr_change", step=step, severity="info", message=f"LR x{ratio:g}",
                 details={"ratio": ratio})


def _nonfinite(step: int) -> StepSignals:
    return StepSignals(step=step, loss=math.nan, grad_norm=math.nan,
                       param_grad_norm=np.array([math.nan]), param_names=["w"])


def test_trouble_right_after_the_lr_was_raised_tenfold_rolls_back_at_once_to_before_it() -> None:
    c = _controller(settle_steps=10)
    _calm(c, range(20))
    assert c.review(_signals(20, 2.0), [_raise(20, 100.0)]) is None  # the raise alone is no fault
    verdict = c.review(_signals(21, 50.0), [_spike(21)])
    assert verdict is not None and verdict.action == "rollback"
    assert verdict.onset == 20  # a state from before the update at the raised LR
    assert verdict.bad_steps == []  # the LR did it: no batch is blamed
    assert "1 step(s) after the LR was raised x100 at step 20" in verdict.reason
    c.rolled_back()
    assert c.jump is None  # the raise's updates are undone: later trouble is judged afresh


def test_a_warning_or_a_non_finite_step_right_after_a_raise_rolls_back_too() -> None:
    warning = Event(kind="instability_precursor", step=23, severity="warning", message="w")
    c = _controller()
    _calm(c, range(20))
    c.review(_signals(20, 2.0), [_raise(20, 10.0)])
    _calm(c, range(21, 23))
    verdict = c.review(_signals(23, 2.0), [warning])
    assert verdict is not None and verdict.action == "rollback" and verdict.onset == 20
    c = _controller()
    _calm(c, range(20))
    c.review(_signals(20, 2.0), [_raise(20, 10.0)])
    verdict = c.review(_nonfinite(21), [])
    assert verdict is not None and verdict.action == "rollback" and verdict.onset == 20
    # ...but NaN in the batch itself is the batch's: skipped, as without a raise
    c = _controller()
    _calm(c, range(20))
    c.review(_signals(20, 2.0), [_raise(20, 10.0)])
    verdict = c.review(_nonfinite(21), [], bad_input=True)
    assert verdict is not None and verdict.action == "skip"


def test_a_smaller_raise_later_trouble_or_jump_steps_0_judge_the_trouble_as_before() -> None:
    def first_verdict(raise_ratio: float, spike_at: int, **settings: object) -> str | None:
        c = _controller(**settings)
        _calm(c, range(20))
        c.review(_signals(20, 2.0), [_raise(20, raise_ratio)])
        _calm(c, range(21, spike_at))
        verdict = c.review(_signals(spike_at, 50.0), [_spike(spike_at)])
        return verdict.action if verdict is not None else None

    assert first_verdict(100.0, 25) == "rollback"  # within jump_steps (5)
    assert first_verdict(9.0, 21) == "skip"  # below jump_ratio (10)
    assert first_verdict(100.0, 26) == "skip"  # past jump_steps
    assert first_verdict(100.0, 21, jump_steps=0) == "skip"
    assert first_verdict(3.0, 21, jump_ratio=2.5) == "rollback"


def test_an_open_trouble_from_before_the_raise_sets_the_onset() -> None:
    c = _controller(settle_steps=10)
    _calm(c, range(20))
    c.review(_signals(20, 50.0), [_spike(20)])  # skipped, followed
    c.review(_signals(21, 2.1), [_raise(21, 100.0)])
    verdict = c.review(_signals(22, 50.0), [_spike(22)])
    assert verdict is not None and verdict.action == "rollback" and verdict.onset == 19


def test_a_raise_is_remembered_across_a_state_round_trip() -> None:
    c = _controller()
    _calm(c, range(20))
    c.review(_signals(20, 2.0), [_raise(20, 100.0)])
    other = _controller()
    other.load_state_dict(c.state_dict())
    assert other.jump == (20, 100.0)
    verdict = other.review(_signals(21, 50.0), [_spike(21)])
    assert verdict is not None and verdict.action == "rollback"
    state = c.state_dict()
    del state["jump"]  # saved before raises were followed
    other.load_state_dict(state)
    assert other.jump is None


def test_a_bad_start_is_no_trainer_metric_instability() -> None:
    """`bad_start` reads the trainer's metrics only to tell a preference loss: its blame of the
    LR is not acted on as a KL blow-up's is (a rollback with the LR cut at once)."""
    c = _controller()
    _calm(c, range(12))
    start = Event(kind="bad_start", step=12, severity="warning", message="blown up",
                  details={"cause": "lr_too_high"})
    assert c.review(_signals(12, 2.0), [start]) is None
