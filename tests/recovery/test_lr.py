"""LR backoff: a linear ramp on top of the schedule, under a ceiling, whoever sets the LR."""

from __future__ import annotations

import math

import pytest
import torch

from trainguard import UsageError
from trainguard.recovery.lr import LRBackoff, scale_learning_rate

from ..conftest import advance, lambda_setup, lrs


def _optimizer(lr: float = 1.0) -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=lr)


@pytest.mark.parametrize("kind", ["lambda", "step"])
def test_backoff_ramps_linearly_back_to_the_plain_schedule(kind: str) -> None:
    plain_opt, opt = _optimizer(), _optimizer()

    def make(o):
        if kind == "lambda":
            return torch.optim.lr_scheduler.LambdaLR(o, lambda s: 0.99 ** s)
        return torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5)  # chainable

    plain, sched = make(plain_opt), make(opt)
    backoff = LRBackoff([opt], [sched], ramp_steps=4)
    backoff.begin(0.1, [None], applied=[1.0])
    seen = [opt.param_groups[0]["lr"] / plain_opt.param_groups[0]["lr"]]
    for _ in range(8):
        plain_opt.step()  # no gradients: only keeps the schedulers' call-order check quiet
        opt.step()
        plain.step()
        sched.step()  # whoever steps the scheduler (a trainer), the backoff follows after it
        backoff.step()
        seen.append(opt.param_groups[0]["lr"] / plain_opt.param_groups[0]["lr"])
    assert seen[:5] == pytest.approx([0.1, 0.325, 0.55, 0.775, 1.0])
    assert seen[5:] == pytest.approx([1.0] * 4)
    assert not backoff.active  # fully ramped back: no more work per step
    assert opt.param_groups[0]["lr"] == pytest.approx(plain_opt.param_groups[0]["lr"])


def test_a_ceiling_stays_and_survives_a_state_round_trip() -> None:
    opt = _optimizer(0.5)
    backoff = LRBackoff([opt], [], ramp_steps=2)
    backoff.begin(0.1, [0.05], applied=[1.0])
    assert opt.param_groups[0]["lr"] == pytest.approx(0.005)  # the ramp starts under the ceiling
    for _ in range(5):
        backoff.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)
    other = LRBackoff([opt], [], ramp_steps=2)
    other.load_state_dict(backoff.state_dict())
    assert other.active and other.factor() == pytest.approx(0.1)
    assert other.state_dict() == backoff.state_dict()


def test_a_restored_state_that_already_carried_a_factor_is_rescaled_not_compounded() -> None:
    opt = _optimizer(0.2)  # the LR of a state taken while a 0.2 factor was on: 1.0 * 0.2
    backoff = LRBackoff([opt], [], ramp_steps=10)
    backoff.begin(0.1, [None], applied=[0.2])
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)


def _warmup(o: torch.optim.Optimizer, steps: int = 10) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(o, lambda s: min(1.0, (s + 1) / steps))


def test_the_ramp_never_climbs_above_the_ceiling_while_the_schedule_does() -> None:
    plain_opt, opt = _optimizer(), _optimizer()
    plain, sched = _warmup(plain_opt), _warmup(opt)
    backoff = LRBackoff([opt], [sched], ramp_steps=5)
    backoff.begin(0.1, [0.3], applied=[1.0])
    for _ in range(30):
        plain_opt.step()
        opt.step()
        plain.step()
        sched.step()
        backoff.step()
        schedule = plain_opt.param_groups[0]["lr"]
        assert opt.param_groups[0]["lr"] <= 0.3 * (1 + 1e-12)
        assert opt.param_groups[0]["lr"] == pytest.approx(backoff.ramp() * min(schedule, 0.3))
    assert opt.param_groups[0]["lr"] == pytest.approx(0.3)  # the schedule is at 1.0 now
    assert sched.base_lrs[0] == pytest.approx(0.3)  # the factor lives in the base too


def test_a_schedule_that_falls_below_the_ceiling_is_followed_again() -> None:
    plain_opt, opt = _optimizer(), _optimizer()

    def decay(o: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LambdaLR:
        return torch.optim.lr_scheduler.LambdaLR(o, lambda s: 0.8 ** s)

    plain, sched = decay(plain_opt), decay(opt)
    backoff = LRBackoff([opt], [sched], ramp_steps=2)
    backoff.begin(0.5, [0.4], applied=[1.0])
    for _ in range(12):
        for o, s in ((plain_opt, plain), (opt, sched)):
            o.step()
            s.step()
        backoff.step()
    assert plain_opt.param_groups[0]["lr"] < 0.4
    assert opt.param_groups[0]["lr"] == pytest.approx(plain_opt.param_groups[0]["lr"])


def test_a_loop_that_writes_its_own_lr_every_step_still_gets_the_backoff() -> None:
    opt = _optimizer(1.0)
    backoff = LRBackoff([opt], [], ramp_steps=4)
    backoff.begin(0.1, [0.5], applied=[1.0])
    seen = []
    for step in range(8):
        opt.param_groups[0]["lr"] = 2.0 if step < 4 else 0.2  # the loop's own schedule
        backoff.enforce()  # when the step is measured, before its update
        seen.append(opt.param_groups[0]["lr"])
        backoff.step()
    ramp = [0.1, 0.325, 0.55, 0.775, 1.0, 1.0, 1.0, 1.0]
    expected = [r * min(v, 0.5) for r, v in zip(ramp, [2.0] * 4 + [0.2] * 4, strict=True)]
    assert seen == pytest.approx(expected)
    backoff.enforce()  # nothing written since: left alone, not scaled twice
    assert opt.param_groups[0]["lr"] == pytest.approx(0.2)


def test_a_loop_that_writes_its_lr_over_a_scheduler_is_not_scaled_twice() -> None:
    opt = _optimizer(1.0)
    sched = _warmup(opt, steps=1)  # constant 1.0
    backoff = LRBackoff([opt], [sched], ramp_steps=0)
    backoff.begin(0.1, [0.25], applied=[1.0])
    for _ in range(3):
        opt.step()
        sched.step()
        backoff.step()
        assert opt.param_groups[0]["lr"] == pytest.approx(0.25)
        opt.param_groups[0]["lr"] = 1.0  # and the loop writes its own value on top
        backoff.enforce()
        assert opt.param_groups[0]["lr"] == pytest.approx(0.25)


def test_a_tensor_lr_is_kept_under_its_ceiling_with_the_transferred_value() -> None:
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))], lr=torch.tensor(1.0))
    backoff = LRBackoff([opt], [], ramp_steps=0)
    backoff.begin(0.1, [0.2], applied=[1.0])
    backoff.observe([float(opt.param_groups[0]["lr"])])  # the value the step's transfer brought
    assert isinstance(opt.param_groups[0]["lr"], torch.Tensor)
    assert float(opt.param_groups[0]["lr"]) == pytest.approx(0.2)
    backoff.step()
    assert float(opt.param_groups[0]["lr"]) == pytest.approx(0.2)  # keeps its share


def test_each_group_has_its_own_ceiling() -> None:
    params = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))]
    opt = torch.optim.SGD([{"params": [params[0]], "lr": 1.0},
                           {"params": [params[1]], "lr": 0.01}])
    backoff = LRBackoff([opt], [], ramp_steps=0)
    backoff.begin(0.1, [0.5, None], applied=[1.0, 1.0])
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.5, 0.01])


def test_a_state_saved_when_the_ceiling_was_a_factor_still_loads() -> None:
    opt = _optimizer(0.55)  # 1.0 under a ramp halfway from 0.1 to 1.0
    backoff = LRBackoff([opt], [], ramp_steps=10)
    backoff.load_state_dict({"start": 0.1, "ceiling": 1.0, "progress": 5, "active": True})
    assert backoff.factor() == pytest.approx(0.55) and backoff.ceiling() is None
    for _ in range(5):
        backoff.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(1.0)


def test_scale_learning_rate_takes_one_factor_per_group() -> None:
    params = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))]
    opt = torch.optim.SGD([{"params": [params[0]]}, {"params": [params[1]]}], lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    scale_learning_rate(opt, [sched], [0.5, 0.25])
    assert [g["lr"] for g in opt.param_groups] == [0.5, 0.25]
    assert sched.base_lrs == [0.5, 0.25]
    with pytest.raises(UsageError, match="per parameter group"):
        scale_learning_rate(opt, [sched], [0.5])


def test_scale_learning_rate_survives_the_next_lambda_step() -> None:
    optimizer, scheduler = lambda_setup()
    advance(optimizer, scheduler)
    scale_learning_rate(optimizer, [scheduler], 0.5)
    assert lrs(optimizer) == pytest.approx([0.5 * 0.1 / 2])
    advance(optimizer, scheduler)
    assert lrs(optimizer) == pytest.approx([0.5 * 0.1 / 3])

    unscaled_optimizer, unscaled = lambda_setup()
    advance(unscaled_optimizer, unscaled)
    unscaled_optimizer.param_groups[0]["lr"] *= 0.5  # what a naive change does
    advance(unscaled_optimizer, unscaled)
    assert lrs(unscaled_optimizer) == pytest.approx([0.1 / 3]), "LambdaLR undid the change"


@pytest.mark.parametrize("factor", [0.0, -1.0, math.nan, math.inf, True, "0.5"])
def test_scale_learning_rate_rejects_bad_factors(factor: object) -> None:
    optimizer, scheduler = lambda_setup()
    with pytest.raises(UsageError, match="factor"):
        scale_learning_rate(optimizer, [scheduler], factor)  # type: ignore[arg-type]


def test_a_floor_lifts_the_cut_while_the_schedule_is_far_below_the_lr_that_failed() -> None:
    """The loop raised its LR from 1 to 100; a rollback took place while it was still up, under
    a ceiling of 50 and a floor of 5 (0.1 x the ceiling: where the ramp starts). At 100 the
    ramp's cut stands; back at 1 (under the floor) there is none; up at 100 again, the cut is
    back as far as the ramp has come; in between, the LR is never cut below the floor."""
    opt = _optimizer(100.0)
    backoff = LRBackoff([opt], [], ramp_steps=10)
    backoff.begin(0.1, [50.0], applied=[1.0], floors=[5.0])
    assert lrs(opt) == pytest.approx([0.1 * 50.0])  # the ramp under the ceiling
    opt.param_groups[0]["lr"] = 1.0  # the loop puts its own LR back
    backoff.enforce()
    assert lrs(opt) == pytest.approx([1.0]) and backoff.factor() == pytest.approx(1.0)
    for _ in range(4):
        backoff.step()
        backoff.enforce()
    assert lrs(opt) == pytest.approx([1.0])
    opt.param_groups[0]["lr"] = 100.0  # the loop raises it again, 4 updates into the ramp
    backoff.enforce()
    ramp = 0.1 + 0.9 * 4 / 10
    assert lrs(opt) == pytest.approx([ramp * 50.0])
    opt.param_groups[0]["lr"] = 8.0  # the ramp would give 3.7: cut to the floor, no further
    backoff.enforce()
    assert lrs(opt) == pytest.approx([5.0])
    opt.param_groups[0]["lr"] = 20.0  # the ramp's 9.2 is above the floor: the ramp's
    backoff.enforce()
    assert lrs(opt) == pytest.approx([ramp * 20.0])
    other = LRBackoff([opt], [], ramp_steps=10)
    other.load_state_dict(backoff.state_dict())
    assert other.state_dict() == backoff.state_dict()


def test_without_a_floor_the_backoff_is_as_before_and_old_states_load() -> None:
    plain, floored = _optimizer(2.0), _optimizer(2.0)
    a, b = LRBackoff([plain], [], ramp_steps=4), LRBackoff([floored], [], ramp_steps=4)
    a.begin(0.1, [1.0], applied=[1.0])
    b.begin(0.1, [1.0], applied=[1.0], floors=[0.1])  # 0.1 x the ceiling, which the schedule
    # (2.0) is above: the floor changes nothing
    for _ in range(5):
        assert lrs(plain) == pytest.approx(lrs(floored))
        a.step()
        b.step()
    state = a.state_dict()
    del state["floors"], state["lifts"]  # saved before floors existed
    other = LRBackoff([plain], [], ramp_steps=4)
    other.load_state_dict(state)
    assert other.floors == [None] and other.lifts == [0.0]


def test_a_loop_that_scales_a_cut_lr_is_told_and_never_put_above_what_it_wrote() -> None:
    """`lr /= 100` on an LR the backoff had cut divides the cut too: the run cannot tell it
    from a value meant as such, takes it as the schedule's (never above it) and says so; a
    value of the loop's own is taken so without a word."""
    opt = _optimizer(1.0)
    backoff = LRBackoff([opt], [], ramp_steps=4)
    backoff.begin(0.2, [None], applied=[1.0])
    assert opt.param_groups[0]["lr"] == pytest.approx(0.2)
    opt.param_groups[0]["lr"] /= 100  # the loop undoes a raise it made, relative to what it read
    said = backoff.enforce()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.2 * 0.002)  # the schedule, cut again
    assert len(said) == 1 and "x0.01 the 0.2 it read" in said[0] and "is 0.01;" in said[0]
    for _ in range(4):
        backoff.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.002)
    opt.param_groups[0]["lr"] = 0.0123  # a value of the loop's own, the cut ramped out
    assert backoff.enforce() == []
    fresh = _optimizer(1.0)
    absolute = LRBackoff([fresh], [], ramp_steps=4)
    absolute.begin(0.2, [None], applied=[1.0])
    fresh.param_groups[0]["lr"] = 0.0123
    assert absolute.enforce() == []
    assert fresh.param_groups[0]["lr"] == pytest.approx(0.2 * 0.0123)


@pytest.mark.parametrize(("read", "written", "ratio"), [
    (0.0086, 0.0086 / 100, 0.01), (0.0086, 0.0086 * 2, 2.0), (1e-3, 0.5e-3, 0.5),
    (0.0086, 1e-3, None), (1e-3, 1e-3, None), (1e-3, 1.5e-3, None), (0.0, 1e-3, None)])
def test_a_scaling_is_a_whole_number_times_or_parts(read: float, written: float,
                                                     ratio: float | None) -> None:
    from trainguard.recovery.lr import scaling

    found = scaling(read, written)
    assert (found is None) if ratio is None else found == pytest.approx(ratio)
