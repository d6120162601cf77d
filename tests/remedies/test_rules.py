"""The ClipRule interface, global-norm clipping, chaining and applying coefficients."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn

from trainguard.demo import MarkovLanguage, TinyCausalLM
from trainguard.errors import ConfigError, UsageError
from trainguard.remedies.adaptive import AdaptiveClip
from trainguard.remedies.layerwise import LayerwiseClip
from trainguard.remedies.rules import (
    ClipRule,
    GlobalNormClip,
    apply_coefficients,
    clip_factor,
)
from trainguard.remedies.spec import chain

from .helpers import Measured, grad_copy, grads, measure


def tiny_lm(seed: int = 0) -> tuple[TinyCausalLM, torch.optim.Optimizer, MarkovLanguage]:
    torch.manual_seed(seed)
    model = TinyCausalLM(vocab_size=32, d_model=32, n_layer=2, n_head=2, max_len=32)
    return model, torch.optim.SGD(model.parameters(), lr=0.1), MarkovLanguage(32, seed=seed)


def backward(model: TinyCausalLM, language: MarkovLanguage, scale: float = 1.0) -> torch.Tensor:
    model.zero_grad(set_to_none=True)
    loss = model.loss(language.batch(8, 17))
    (loss * scale).backward()
    return loss


@pytest.mark.parametrize("max_norm", [1e-3, 0.05, 0.3, 1e3])
def test_global_clip_equals_clip_grad_norm_bit_for_bit(max_norm: float) -> None:
    model, optimizer, language = tiny_lm()
    for _ in range(3):  # a few real steps, so the norms are not those of a fresh model
        loss = backward(model, language, scale=5.0)
        seen = measure(model, optimizer, loss)
        reference = copy.deepcopy(model)
        grad_copy(model, reference)
        coefs = GlobalNormClip(max_norm).coefficients(seen.norms, seen.global_norm, seen.names)
        scaled = apply_coefficients(seen.params, coefs)
        torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm)
        for ours, theirs in zip(grads(model), grads(reference), strict=True):
            assert ours is not None and theirs is not None
            assert torch.equal(ours, theirs)
        clipped = seen.global_norm > max_norm
        assert scaled == (len(seen.params) if clipped else 0)
        assert np.all(coefs < 1) if clipped else np.all(coefs == 1.0)
        optimizer.step()


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_global_clip_leaves_nonfinite_steps_alone(bad: float) -> None:
    norms = np.array([1.0, bad, 2.0])
    coefs = GlobalNormClip(0.1).coefficients(norms, bad, ["a", "b", "c"])
    assert np.array_equal(coefs, np.ones(3))


def test_clip_factor_matches_torch_float32_arithmetic() -> None:
    rng = np.random.default_rng(0)
    for norm in rng.lognormal(0.0, 3.0, size=2000).astype(np.float32):
        max_norm = float(rng.lognormal(0.0, 1.0))
        expected = torch.clamp(max_norm / (torch.tensor(norm) + 1e-6), max=1.0).item()
        assert clip_factor(float(norm), max_norm) == expected


def test_apply_coefficients_scales_only_what_is_below_one() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2), nn.Linear(2, 2))
    model(torch.randn(5, 3)).sum().backward()
    params = list(model.parameters())
    params[3].grad = None  # a parameter without gradient is skipped, not an error
    before = [None if p.grad is None else p.grad.clone() for p in params]
    coefs = np.array([0.5, 1.0, 0.25, 0.1, math.nan, 1.0])
    assert apply_coefficients(params, coefs) == 2
    assert torch.equal(params[0].grad, before[0] * 0.5)
    assert torch.equal(params[1].grad, before[1])
    assert torch.equal(params[2].grad, before[2] * 0.25)
    assert params[3].grad is None
    assert torch.equal(params[4].grad, before[4])  # a NaN coefficient takes the safe branch
    assert torch.equal(params[5].grad, before[5])


def test_apply_coefficients_groups_mixed_dtypes() -> None:
    full = nn.Linear(4, 3)
    half = nn.Linear(4, 3).to(torch.bfloat16)
    full(torch.randn(2, 4)).sum().backward()
    half(torch.randn(2, 4, dtype=torch.bfloat16)).sum().backward()
    params = [full.weight, half.weight, full.bias, half.bias]
    before = [p.grad.clone() for p in params]
    coefs = np.array([0.5, 0.25, 0.75, 0.125])
    assert apply_coefficients(params, coefs) == 4
    for param, old, coef in zip(params, before, coefs, strict=True):
        assert param.grad.dtype == old.dtype
        assert torch.equal(param.grad, old * float(coef))


def test_apply_coefficients_rejects_a_wrong_length() -> None:
    model = nn.Linear(2, 2)
    with pytest.raises(UsageError, match="one coefficient per parameter"):
        apply_coefficients(list(model.parameters()), np.array([0.5]))


def test_coefficients_reject_norms_that_do_not_match_the_names() -> None:
    with pytest.raises(UsageError, match="one gradient norm per parameter"):
        GlobalNormClip(1.0).coefficients(np.ones(3), 1.0, ["a", "b"])


def test_chain_feeds_each_rule_the_norms_the_previous_left() -> None:
    norms = np.array([3.0, 4.0])
    names = ["enc.attn.weight", "enc.mlp.weight"]
    layer_first = chain(LayerwiseClip({"*attn*": 1.0}), GlobalNormClip(2.0))
    # attention 3 -> 1; the global rule then sees sqrt(1 + 16) and scales both to norm 2
    after_layer = 1.0 / (3.0 + 1e-6)
    global_coef = 2.0 / (math.sqrt((3.0 * after_layer) ** 2 + 16.0) + 1e-6)
    expected = np.array([after_layer * global_coef, global_coef])
    assert np.allclose(layer_first.coefficients(norms, 5.0, names), expected, rtol=1e-6)

    global_first = chain(GlobalNormClip(2.0), LayerwiseClip({"*attn*": 1.0}))
    # global 5 -> 2 scales by 0.4: attention 3 -> 1.2, then clipped to 1 by the layer rule
    expected = np.array([0.4 * 1.0 / 1.2, 0.4])
    got = global_first.coefficients(norms, 5.0, names)
    assert np.allclose(got, expected, rtol=1e-6)
    assert not np.allclose(got, layer_first.coefficients(norms, 5.0, names), rtol=1e-3)


def test_chain_of_one_rule_is_that_rule() -> None:
    norms = np.array([0.5, 2.0, 7.0], dtype=np.float32)
    names = ["a", "b", "c"]
    alone = GlobalNormClip(1.5).coefficients(norms, 7.3, names)
    assert np.array_equal(chain(GlobalNormClip(1.5)).coefficients(norms, 7.3, names), alone)


def test_chained_rules_hold_every_limit_on_a_real_model() -> None:
    model, optimizer, language = tiny_lm(seed=1)
    loss = backward(model, language, scale=50.0)
    seen: Measured = measure(model, optimizer, loss)
    rule = chain(LayerwiseClip({"*self_attn*": 0.2}), GlobalNormClip(0.3))
    apply_coefficients(seen.params, rule.coefficients(seen.norms, seen.global_norm, seen.names))
    attn = [p.grad for n, p in zip(seen.names, seen.params, strict=True) if "self_attn" in n]
    everything = [p.grad for p in seen.params]
    assert torch.linalg.vector_norm(torch.stack(torch._foreach_norm(attn))) <= 0.2 * (1 + 1e-5)
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(everything)))
    assert 0.3 * (1 - 1e-4) <= total <= 0.3 * (1 + 1e-5)


def test_chain_state_round_trips_through_its_rules() -> None:
    norms = np.ones(2)
    names = ["a", "b"]
    rule = chain(GlobalNormClip(1.0), AdaptiveClip(warmup_steps=3))
    for value in (1.0, 1.2, 0.9, 1.1, 5.0):
        rule.coefficients(norms * value, value * math.sqrt(2), names)
    restored = chain(GlobalNormClip(1.0), AdaptiveClip(warmup_steps=3))
    restored.load_state_dict(rule.state_dict())
    assert restored.state_dict() == rule.state_dict()
    for value in (3.0, 0.5, 8.0):
        assert np.array_equal(restored.coefficients(norms * value, value, names),
                              rule.coefficients(norms * value, value, names))
    with pytest.raises(UsageError, match="2 entries"):
        restored.load_state_dict({"rules": [{}]})


def test_rules_follow_the_protocol_and_describe_themselves() -> None:
    rules = [GlobalNormClip(1.0), LayerwiseClip({"*attn*": 1.0}, default=0.5), AdaptiveClip(),
             chain(GlobalNormClip(1.0))]
    for rule in rules:
        assert isinstance(rule, ClipRule)
        assert rule.describe()
    assert GlobalNormClip(1.0).state_dict() == {}
    assert chain(LayerwiseClip({"*attn*": 1.0}), GlobalNormClip(2.0)).describe() == (
        "layer-wise (per group): '*attn*' <= 1, others untouched -> global norm <= 2")
    with pytest.raises(UsageError, match="keeps no state"):
        GlobalNormClip(1.0).load_state_dict({"mean": 1.0})


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, True, "1.0", None])
def test_global_clip_rejects_a_bad_limit(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"GlobalNormClip.max_norm: must be a finite number > 0"):
        GlobalNormClip(bad)  # type: ignore[arg-type]


def test_chain_rejects_nothing_and_non_rules() -> None:
    with pytest.raises(ConfigError, match="at least one clip rule"):
        chain()
    with pytest.raises(ConfigError, match="rule 1 must be a clip rule"):
        chain(GlobalNormClip(1.0), 1.0)  # type: ignore[arg-type]
