"""AdaptiveClip: ZClip's arithmetic on finite norms, but never poisoned by a NaN step."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch
from torch import nn
from zclip import ZClip

from trainguard.errors import ConfigError, UsageError
from trainguard.remedies.adaptive import AdaptiveClip
from trainguard.remedies.rules import apply_coefficients, clip_factor

NAMES = ["w"]


def coef(rule: AdaptiveClip, norm: float) -> float:
    return float(rule.coefficients(np.array([norm]), norm, NAMES)[0])


class Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(self.body(x), y)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    x = torch.randn(16, 8, generator=gen)
    return x, x.sum(dim=1, keepdim=True).sin()


def global_norm(model: nn.Module) -> float:
    return torch.linalg.vector_norm(
        torch.stack([p.grad.norm() for p in model.parameters()])).item()


def test_equals_zclip_percentile_mode_on_a_real_training_run() -> None:
    torch.manual_seed(0)
    ours_model = Regressor()
    zclip_model = copy.deepcopy(ours_model)
    ours_opt = torch.optim.SGD(ours_model.parameters(), lr=0.05)
    zclip_opt = torch.optim.SGD(zclip_model.parameters(), lr=0.05)
    ours = AdaptiveClip(z_threshold=2.0, alpha=0.9, warmup_steps=10, fallback_max_norm=None)
    zclip = ZClip(alpha=0.9, z_thresh=2.0, max_grad_norm=None, warmup_steps=10,
                  mode="percentile")
    params = list(ours_model.parameters())
    names = [n for n, _ in ours_model.named_parameters()]
    clipped = 0
    for step in range(60):
        scale = 30.0 if step in (25, 40, 41) else 1.0  # spikes after the warm-up
        for model, opt in ((ours_model, ours_opt), (zclip_model, zclip_opt)):
            opt.zero_grad(set_to_none=True)
            (model.loss(*batch(step)) * scale).backward()
        norm = zclip.step(zclip_model)  # clips zclip_model in place, returns the pre-clip norm
        norms = torch.stack([p.grad.norm() for p in params]).numpy()
        coefs = ours.coefficients(norms, norm, names)
        clipped += apply_coefficients(params, coefs) > 0
        for a, b in zip(ours_model.parameters(), zclip_model.parameters(), strict=True):
            assert torch.equal(a.grad, b.grad), step
        if step >= 10:
            assert (ours.mean, ours.var) == (zclip.mean, zclip.var)
        ours_opt.step()
        zclip_opt.step()
    assert clipped >= 3  # the spikes really were clipped, by both


def test_zclip_is_poisoned_by_one_nan_step_and_ours_is_not() -> None:
    torch.manual_seed(0)
    model = Regressor()
    zclip = ZClip(warmup_steps=5, max_grad_norm=None, mode="percentile")
    ours = AdaptiveClip(warmup_steps=5, fallback_max_norm=None)

    def step(i: int, scale: float) -> float:
        model.zero_grad(set_to_none=True)
        (model.loss(*batch(i)) * scale).backward()
        return global_norm(model)

    for i in range(8):
        coef(ours, step(i, 1.0))
        zclip.step(model)
    healthy = ours.state_dict()

    step(8, math.nan)  # one step whose gradients are NaN (the Guard skips it)
    zclip.step(model)
    assert coef(ours, math.nan) == 1.0
    assert ours.state_dict() == healthy
    assert math.isnan(zclip.mean)  # poisoned for good

    spike = step(9, 100.0)
    zclip.step(model)
    assert global_norm(model) == pytest.approx(spike, rel=1e-6)  # zclip no longer clips
    threshold = ours.threshold
    assert threshold is not None and spike > 10 * threshold
    assert coef(ours, spike) == pytest.approx(threshold / spike, rel=1e-6)  # ours still does


def test_zclip_is_poisoned_by_a_nan_during_warm_up_and_ours_is_not() -> None:
    zclip = ZClip(warmup_steps=3, max_grad_norm=None, mode="percentile")
    model = nn.Linear(2, 1)
    ours = AdaptiveClip(warmup_steps=3, fallback_max_norm=None)
    for value in (1.0, math.nan, 1.1, 0.9):
        model.zero_grad(set_to_none=True)
        (model(torch.ones(1, 2)).sum() * value).backward()
        zclip.step(model)
        coef(ours, value)
    assert math.isnan(zclip.mean)
    assert ours.warmed_up and ours.mean == pytest.approx(1.0)


def test_warm_up_uses_the_fallback_then_starts_from_the_warm_up_statistics() -> None:
    rule = AdaptiveClip(z_threshold=2.0, alpha=0.9, warmup_steps=4, fallback_max_norm=1.5)
    warm = [1.0, 2.0, 1.2, 0.8]
    for norm in warm:
        assert rule.threshold is None
        assert coef(rule, norm) == clip_factor(norm, 1.5)  # 2.0 is clipped to 1.5
    assert rule.mean == pytest.approx(np.mean(warm))
    assert rule.var == pytest.approx(np.var(warm))
    assert rule.threshold == pytest.approx(np.mean(warm) + 2.0 * np.std(warm))
    assert coef(rule, 1.9) == 1.0  # after the warm-up the fixed fallback no longer applies


def test_a_clipped_step_updates_the_statistics_with_its_threshold() -> None:
    rule = AdaptiveClip(z_threshold=2.0, alpha=0.9, warmup_steps=4, fallback_max_norm=None)
    for norm in (1.0, 1.1, 0.9, 1.0):
        coef(rule, norm)
    mean, var, threshold = rule.mean, rule.var, rule.threshold
    assert mean is not None and var is not None and threshold is not None
    assert coef(rule, 50.0) == pytest.approx(threshold / 50.0)
    new_mean = 0.9 * mean + 0.1 * threshold
    assert rule.mean == pytest.approx(new_mean)
    assert rule.var == pytest.approx(0.9 * var + 0.1 * (threshold - new_mean) ** 2)
    assert rule.threshold < 1.5  # the spike of 50 did not drag the baseline up


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_nonfinite_norms_never_touch_the_statistics(bad: float) -> None:
    rule = AdaptiveClip(warmup_steps=2)
    coef(rule, 1.0)
    assert coef(rule, bad) == 1.0
    assert rule.state_dict() == {"buffer": [1.0], "mean": None, "var": None}
    coef(rule, 2.0)
    before = rule.state_dict()
    assert coef(rule, bad) == 1.0
    assert rule.state_dict() == before


@pytest.mark.parametrize("saved_at", [3, 12])  # during and after the warm-up
def test_state_round_trips_through_json(saved_at: int) -> None:
    rng = np.random.default_rng(0)
    norms = rng.lognormal(0.0, 0.5, size=30)
    norms[[15, 22]] *= 40  # spikes
    rule = AdaptiveClip(warmup_steps=8)
    for norm in norms[:saved_at]:
        coef(rule, float(norm))
    restored = AdaptiveClip(warmup_steps=8)
    restored.load_state_dict(json.loads(json.dumps(rule.state_dict())))
    assert restored.describe() == rule.describe()
    for norm in norms[saved_at:]:
        assert coef(restored, float(norm)) == coef(rule, float(norm))
    assert restored.state_dict() == rule.state_dict()


@pytest.mark.parametrize(("state", "message"), [
    ({"buffer": []}, "expected keys buffer, mean, var"),
    ({"buffer": [], "mean": 1.0, "var": None}, "both be set or both be None"),
    ({"buffer": [], "mean": 1.0, "var": math.nan}, "non-finite"),
    ({"buffer": [], "mean": 1.0, "var": -1.0}, "negative variance"),
    ({"buffer": ["x"], "mean": None, "var": None}, "must be numbers"),
])
def test_a_bad_state_is_a_usage_error(state: dict, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        AdaptiveClip().load_state_dict(state)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"z_threshold": -1.0}, "AdaptiveClip.z_threshold: must be a finite number > 0"),
    ({"alpha": 1.0}, "AdaptiveClip.alpha: must be a number strictly between 0 and 1"),
    ({"alpha": 0}, "AdaptiveClip.alpha"),
    ({"warmup_steps": 0}, "AdaptiveClip.warmup_steps: must be an integer >= 1"),
    ({"warmup_steps": 2.5}, "AdaptiveClip.warmup_steps"),
    ({"fallback_max_norm": -0.5}, "AdaptiveClip.fallback_max_norm: must be a finite number"),
])
def test_bad_arguments_are_config_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        AdaptiveClip(**kwargs)


def test_every_parameter_gets_the_global_coefficient() -> None:
    rule = AdaptiveClip(warmup_steps=1, fallback_max_norm=None)
    rule.coefficients(np.array([0.6, 0.8]), 1.0, ["a", "b"])
    coefs = rule.coefficients(np.array([6.0, 8.0]), 10.0, ["a", "b"])
    assert coefs[0] == coefs[1] == pytest.approx(1.0 / 10.0, rel=1e-6)
    assert "clips above 1" in rule.describe()
