"""`ClipChain` (`remedies/clip_chain.py`): every clipping link in one chain, stepped as a run
steps it, with its state checked after each step (as optax's transforms are tested)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from trainguard import GuardConfig
from trainguard.remedies import AGC, LayerwiseClip
from trainguard.remedies.clip_chain import ClipChain
from trainguard.signals import StepSignals


def _warm(chain: ClipChain, norms: tuple[float, ...]) -> None:
    for norm in norms:
        chain.update(norm, chain.in_force(0))


def test_init_builds_the_links_the_config_names() -> None:
    fixed = ClipChain.init(GuardConfig(clip={"max_grad_norm": 1.0}))
    assert (fixed.fixed_limit, fixed.configured_limit, fixed.adaptive, fixed.rule, fixed.agc) == (
        1.0, 1.0, None, None, None)
    auto = ClipChain.init(GuardConfig(clip={"rule": LayerwiseClip({"*": 2.0}), "agc": AGC(0.1)}))
    assert auto.fixed_limit is None and auto.adaptive is not None
    assert auto.rule is not None and auto.agc is not None
    # observe clips nothing: the adaptive clip is off, as is the fixed limit it would replace
    assert ClipChain.init(GuardConfig(policy="observe")).in_force(0) is None


def test_the_adaptive_link_moves_with_the_steps_and_its_alarm() -> None:
    chain = ClipChain.init(GuardConfig(detectors={"common": {"warmup_steps": 2}}))
    assert chain.adaptive is not None
    assert chain.in_force(0) == chain.adaptive.ceiling  # before the first norm
    _warm(chain, (1.0, 1.0, 1.0))
    assert chain.in_force(3) == pytest.approx(20.0)  # warm: 20x the typical norm
    chain.alarm(3, trouble=True)
    assert chain.in_force(3) == pytest.approx(1.0) and chain.after_trouble(3)
    assert chain.in_force(3 + chain.adaptive.alarm_steps) == pytest.approx(20.0)
    chain.update(math.nan, 1.0)  # a non-finite norm never enters the baseline
    chain.update(500.0, 2.0)  # a clipped step enters at the limit it was clipped to
    assert len(chain.adaptive.baseline) == 4 and chain.adaptive.typical() == pytest.approx(1.0)


def test_a_rollback_tightens_the_fixed_link_beneath_which_the_adaptive_one_stays() -> None:
    chain = ClipChain.init(GuardConfig())
    _warm(chain, tuple([1.0] * 20))
    chain.tighten(0.5)
    assert chain.fixed_limit == 0.5 and chain.in_force(20) == 0.5
    chain.tighten(2.0)  # never raised by a later, looser one
    assert chain.fixed_limit == 0.5
    assert chain.limits(20).adaptive_in_force() is False


def _signals(model: nn.Module) -> StepSignals:
    norms = np.array([float(p.grad.norm()) for p in model.parameters()])  # type: ignore[union-attr]
    return StepSignals(step=0, loss=1.0, grad_norm=float(np.sqrt((norms ** 2).sum())),
                       param_grad_norm=norms, param_names=[n for n, _ in model.named_parameters()])


def _model_with_grads() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    model(torch.randn(16, 4)).pow(2).sum().mul(100.0).backward()
    return model


def test_apply_scales_by_the_global_factor_then_the_rule() -> None:
    model = _model_with_grads()
    params = list(model.parameters())
    signals = _signals(model)
    coef = 0.5
    limit = 0.2 * float(signals.param_grad_norm.min())  # below every scaled norm: all clipped
    rule = LayerwiseClip({"*": limit}, per_parameter=True)
    chain = ClipChain.init(GuardConfig(clip={"max_grad_norm": None, "rule": rule}))
    chain.apply([p.grad for p in params if p.grad is not None], params, signals, coef, step=0)
    after = np.array([float(p.grad.norm()) for p in params])  # type: ignore[union-attr]
    assert after == pytest.approx(np.full(len(params), limit), rel=1e-4)


def test_a_failing_rule_leaves_the_global_clip_standing(caplog: pytest.LogCaptureFixture) -> None:
    model = _model_with_grads()
    params = list(model.parameters())
    before = [p.grad.clone() for p in params]  # type: ignore[union-attr]
    signals = _signals(model)
    rule = LayerwiseClip({"*": 1.0})
    chain = ClipChain.init(GuardConfig(clip={"max_grad_norm": None, "rule": rule}))
    signals.param_names = signals.param_names[:-1]  # the rule refuses norms without names
    chain.apply([p.grad for p in params if p.grad is not None], params, signals, 0.25, step=7)
    for grad, old in zip([p.grad for p in params], before, strict=True):
        assert torch.allclose(grad, old * 0.25)  # type: ignore[arg-type]
    assert "clipping rule failed at step 7" in caplog.text


@pytest.mark.parametrize(("warm_steps", "spread"), [*((n, 1.0) for n in range(78, 86)),
                                                   (80, 0.01)])  # each refresh phase; a tight
def test_a_plans_bound_holds_while_its_steps_admit_norms_under_it(warm_steps: int,  # window
                                                                    spread: float) -> None:
    """`lowest_in_force`: no limit the chain holds over the planned steps falls under it, and
    `catch_up` leaves the chain as `limits` then `update` at each step would."""
    rng = np.random.default_rng(0)
    warm = [float(n) for n in np.exp(rng.normal(0.0, spread, warm_steps))]
    stepped, caught = ClipChain.init(GuardConfig()), ClipChain.init(GuardConfig())
    for chain in (stepped, caught):
        for norm in warm:
            chain.update(norm, chain.limits(0).in_force())
    assert stepped.adaptive is not None and caught.adaptive is not None
    steps = 12
    bound = stepped.lowest_in_force(warm_steps, steps)
    assert bound is not None and 0 < bound < math.inf
    # the lowest norms the run could see: each drags the median down as far as it can go
    norms = [float(n) for n in np.exp(rng.normal(-3.0, 0.1, steps))]
    for i, norm in enumerate(norms):
        limit = stepped.limits(warm_steps + i).in_force()
        assert limit is not None and limit >= bound
        stepped.update(norm, limit)
    caught.catch_up(norms)
    assert caught.adaptive.state_dict() == stepped.adaptive.state_dict()
    for i, norm in enumerate(np.exp(rng.normal(0.0, 1.0, 20)), start=warm_steps + steps):
        assert caught.limits(i) == stepped.limits(i)  # the spread refreshed at the same steps
        for chain in (stepped, caught):
            chain.update(float(norm), chain.in_force(i))


def test_no_plan_while_warming_up_in_an_alarm_or_past_what_the_window_can_tell() -> None:
    chain = ClipChain.init(GuardConfig())
    assert chain.adaptive is not None
    assert chain.lowest_in_force(0, 12) is None  # no norm yet
    _warm(chain, (1.0,) * 50)
    assert chain.lowest_in_force(50, 12) == pytest.approx(20.0)
    assert chain.lowest_in_force(50, 25) is None  # more steps than half the window
    chain.alarm(50, trouble=True)
    assert chain.lowest_in_force(51, 12) is None
    fixed = ClipChain.init(GuardConfig(clip={"max_grad_norm": 1.0}))
    assert fixed.lowest_in_force(0, 12) == 1.0
    assert ClipChain.init(GuardConfig(policy="observe")).lowest_in_force(0, 12) == math.inf
