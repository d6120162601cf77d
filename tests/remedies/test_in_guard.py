"""Clipping rules configured on a Guard act on the gradients of a real training step."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainguard import ConfigError, Guard, GuardConfig
from trainguard.remedies import AGC, LayerwiseClip


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def _grads_after_guard_step(config: GuardConfig) -> tuple[nn.Module, list[torch.Tensor]]:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: only the gradients change
    guard = Guard(model, optimizer, config=config)
    x = torch.randn(32, 6, generator=torch.Generator().manual_seed(1)) * 30
    loss = nn.functional.cross_entropy(model(x), torch.zeros(32, dtype=torch.long))
    loss.backward()
    guard.step(loss)
    grads = [p.grad.clone() for p in model.parameters()]
    guard.close()
    return model, grads


def _raw_grads() -> list[torch.Tensor]:
    model = _model()
    x = torch.randn(32, 6, generator=torch.Generator().manual_seed(1)) * 30
    nn.functional.cross_entropy(model(x), torch.zeros(32, dtype=torch.long)).backward()
    return [p.grad.clone() for p in model.parameters()]


def test_layerwise_rule_clips_each_group_after_the_global_clip() -> None:
    rule = LayerwiseClip({"0.*": 0.3}, default=0.1)
    _, grads = _grads_after_guard_step(GuardConfig(sinks={"console": False},
                                                   clip={"max_grad_norm": None, "rule": rule}))
    raw = _raw_grads()
    first = torch.nn.utils.get_total_norm(raw[:2])
    second = torch.nn.utils.get_total_norm(raw[2:])
    assert first > 0.3 and second > 0.1  # both groups needed clipping
    assert torch.nn.utils.get_total_norm(grads[:2]) == pytest.approx(0.3, rel=1e-5)
    assert torch.nn.utils.get_total_norm(grads[2:]) == pytest.approx(0.1, rel=1e-5)
    for g, r in zip(grads, raw, strict=True):  # direction kept, only scaled
        assert torch.allclose(g / g.norm(), r / r.norm(), atol=1e-6)


def test_agc_limits_gradients_relative_to_weights() -> None:
    model, grads = _grads_after_guard_step(GuardConfig(sinks={"console": False},
                                                       clip={"max_grad_norm": None,
                                                             "agc": AGC(clipping=0.01,
                                                                        exclude=())}))
    for param, grad in zip(model.parameters(), grads, strict=True):
        if param.dim() < 2:
            continue
        ratio = grad.norm(dim=1) / param.detach().norm(dim=1).clamp_min(1e-3)
        assert ratio.max() <= 0.01 * (1 + 1e-4)


def test_rules_are_checked_and_stored_as_specs() -> None:
    with pytest.raises(ConfigError, match=r"clip\.rule"):
        GuardConfig(clip={"rule": "layerwise"})
    with pytest.raises(ConfigError, match=r"clip\.agc"):
        GuardConfig(clip={"agc": 0.01})
    config = GuardConfig(clip={"rule": LayerwiseClip({"*attn*": 1.0}, default=0.5), "agc": AGC()})
    plain = config.to_dict()
    assert plain["clip"]["rule"] == {"type": "layerwise", "limits": {"*attn*": 1.0},
                                          "default": 0.5, "per_parameter": False}
    assert plain["clip"]["agc"]["type"] == "agc"
    assert GuardConfig.from_dict(plain) == config


def test_float64_models_are_guarded() -> None:
    model = _model().double()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = Guard(model, optimizer, config=GuardConfig(sinks={"console": False}))
    loss = model(torch.randn(4, 6, dtype=torch.float64)).square().mean()
    loss.backward()
    report = guard.step(loss)
    assert report.grad_norm > 0 and not any(e.kind == "monitor_error" for e in report.events)
