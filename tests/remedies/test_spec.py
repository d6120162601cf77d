"""A rule rebuilt from its spec behaves exactly like the rule; its state is carried apart."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import nn

from trainguard.remedies import (
    AGC,
    AdaptiveClip,
    ClipRule,
    GlobalNormClip,
    LayerwiseClip,
    build_agc,
    build_rule,
    chain,
    rule_spec,
)

NAMES = ["enc.attn.weight", "enc.attn.bias", "enc.mlp.weight", "enc.mlp.bias", "head.weight"]


def norm_sequence(steps: int = 60, seed: int = 0) -> list[np.ndarray]:
    """Per-parameter norms of a run: noise around a level, spikes and a few non-finite steps."""
    rng = np.random.default_rng(seed)
    out = []
    for step in range(steps):
        norms = rng.lognormal(0.0, 0.3, size=len(NAMES)) * np.array([1.0, 0.1, 2.0, 0.2, 0.5])
        if step in (20, 35, 36):
            norms = norms * 50.0
        if step == 28:
            norms[2] = math.nan
        if step == 44:
            norms[0] = math.inf
        out.append(norms)
    return out


RULES: dict[str, Callable[[], ClipRule]] = {
    "global_norm": lambda: GlobalNormClip(0.8),
    "layerwise": lambda: LayerwiseClip({"*attn*": 0.5, "*mlp*": 1.0}, default=0.3),
    "layerwise_untouched_rest": lambda: LayerwiseClip({"*attn*": 0.5}),
    "layerwise_per_parameter": lambda: LayerwiseClip({"*.weight": 0.7}, default=0.05,
                                                     per_parameter=True),
    "adaptive": lambda: AdaptiveClip(z_threshold=2.0, alpha=0.9, warmup_steps=10),
    "adaptive_no_fallback": lambda: AdaptiveClip(warmup_steps=5, fallback_max_norm=None),
    "chain": lambda: chain(LayerwiseClip({"*attn*": 0.5}), AdaptiveClip(warmup_steps=8),
                           GlobalNormClip(1.5)),
    "nested_chain": lambda: chain(chain(AdaptiveClip(warmup_steps=4), GlobalNormClip(3.0)),
                                  LayerwiseClip({"head.*": 0.2}, default=2.0)),
}


def run(rule: ClipRule, sequence: list[np.ndarray]) -> list[np.ndarray]:
    coefs = []
    for norms in sequence:
        with np.errstate(invalid="ignore", over="ignore"):
            global_norm = float(np.sqrt(np.sum(np.square(norms))))
        coefs.append(rule.coefficients(norms, global_norm, NAMES))
    return coefs


@pytest.mark.parametrize("name", list(RULES))
def test_a_rule_rebuilt_from_its_spec_gives_the_same_coefficients(name: str) -> None:
    rule = RULES[name]()
    spec = json.loads(json.dumps(rule.spec()))  # as a stored config gives it back
    rebuilt = build_rule(spec)
    assert type(rebuilt) is type(rule)
    assert rebuilt.spec() == rule.spec() == rule_spec(rule)
    sequence = norm_sequence()
    ours, theirs = run(rule, sequence), run(rebuilt, sequence)
    for a, b in zip(ours, theirs, strict=True):
        assert np.array_equal(a, b)
    assert rebuilt.state_dict() == rule.state_dict()
    assert any(np.any(c < 1.0) for c in ours)  # the sequence did make the rule clip


@pytest.mark.parametrize("name", list(RULES))
def test_state_carried_apart_from_the_spec_resumes_the_rule(name: str) -> None:
    rule = RULES[name]()
    sequence = norm_sequence(seed=1)
    run(rule, sequence[:30])
    resumed = build_rule(rule)  # fresh: the spec holds no statistics
    resumed.load_state_dict(json.loads(json.dumps(rule.state_dict())))
    assert resumed.state_dict() == rule.state_dict()
    for a, b in zip(run(rule, sequence[30:]), run(resumed, sequence[30:]), strict=True):
        assert np.array_equal(a, b)


def test_a_rule_rebuilt_from_a_warm_rule_starts_cold() -> None:
    rule = AdaptiveClip(warmup_steps=3)
    run(rule, norm_sequence()[:10])
    assert rule.warmed_up
    rebuilt = build_rule(rule)
    assert rebuilt is not rule and not rebuilt.warmed_up  # type: ignore[attr-defined]
    assert run(rebuilt, norm_sequence()[:10])[0].tolist() == run(
        AdaptiveClip(warmup_steps=3), norm_sequence()[:10])[0].tolist()


@pytest.mark.parametrize("agc", [AGC(0.01, exclude=()), AGC(0.05, 1e-4, unitwise=False),
                                 AGC(0.02, exclude=("2.*",))], ids=repr)
def test_agc_rebuilt_from_its_spec_clips_identically(agc: AGC) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.LayerNorm(16), nn.Linear(16, 3))
    x = torch.randn(32, 6) * 30
    nn.functional.cross_entropy(model(x), torch.zeros(32, dtype=torch.long)).backward()
    twin = copy.deepcopy(model)
    for param, other in zip(model.parameters(), twin.parameters(), strict=True):
        other.grad = param.grad.clone()
    names = [n for n, _ in model.named_parameters()]
    rebuilt = build_agc(json.loads(json.dumps(agc.spec())))
    assert rebuilt is not agc and rebuilt.spec() == agc.spec()
    raw = [p.grad.clone() for p in model.parameters()]
    agc.apply(list(model.parameters()), names)
    rebuilt.apply(list(twin.parameters()), names)
    changed = False
    for ours, theirs, before in zip(model.parameters(), twin.parameters(), raw, strict=True):
        assert torch.equal(ours.grad, theirs.grad)
        changed = changed or not torch.equal(ours.grad, before)
    assert changed  # the gradients were large enough to be clipped
