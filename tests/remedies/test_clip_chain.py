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
