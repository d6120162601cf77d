"""Layer-wise clipping against torch.nn.utils.clip_grad_norm_ applied group by group."""

from __future__ import annotations

import copy
import logging
import math

import numpy as np
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from trainguard.errors import ConfigError
from trainguard.remedies.layerwise import LayerwiseClip
from trainguard.remedies.rules import apply_coefficients

from .helpers import Measured, grad_copy, measure


def gpt2_step(scale: float = 20.0, seed: int = 0) -> tuple[GPT2LMHeadModel, Measured]:
    """A real two-block GPT-2 (built from a config) after one backward pass."""
    torch.manual_seed(seed)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 64, (4, 16))
    loss = model(input_ids=ids, labels=ids).loss
    (loss * scale).backward()
    return model, measure(model, optimizer, loss)


def group_norm(params: list[torch.Tensor]) -> float:
    return torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params])).item()


def test_guide_example_on_a_gpt2_block_equals_clipping_each_group() -> None:
    model, seen = gpt2_step()
    rule = LayerwiseClip({"*attn*": 1.0}, default=0.5)
    groups = rule.groups(seen.names)
    attn = [i for i, n in enumerate(seen.names) if ".attn." in n]
    assert sorted(attn) == sorted(np.flatnonzero(groups == 0).tolist())
    assert len(attn) == 8  # c_attn and c_proj weight and bias of both blocks
    assert np.all(np.delete(groups, attn) == 1)

    reference = copy.deepcopy(model)
    grad_copy(model, reference)
    ref_params = list(reference.parameters())
    ref_attn = [ref_params[i] for i in attn]
    ref_rest = [p for i, p in enumerate(ref_params) if i not in attn]
    assert group_norm(ref_attn) > 1.0 and group_norm(ref_rest) > 0.5  # both really clip
    torch.nn.utils.clip_grad_norm_(ref_attn, 1.0)
    torch.nn.utils.clip_grad_norm_(ref_rest, 0.5)

    coefs = rule.coefficients(seen.norms, seen.global_norm, seen.names)
    assert apply_coefficients(seen.params, coefs) == len(seen.params)
    for ours, theirs in zip(seen.params, ref_params, strict=True):
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-6, atol=0)
    assert group_norm([seen.params[i] for i in attn]) == pytest.approx(1.0, rel=1e-5)
    rest = [p for i, p in enumerate(seen.params) if i not in attn]
    assert group_norm(rest) == pytest.approx(0.5, rel=1e-5)


def test_default_none_leaves_unmatched_parameters_untouched() -> None:
    _, seen = gpt2_step()
    coefs = LayerwiseClip({"*mlp*": 0.1}).coefficients(seen.norms, seen.global_norm, seen.names)
    mlp = np.array([".mlp." in n for n in seen.names])
    assert np.all(coefs[mlp] < 1)
    assert np.all(coefs[~mlp] == 1.0)


def test_per_parameter_clips_each_parameter_to_its_limit() -> None:
    model, seen = gpt2_step()
    rule = LayerwiseClip({"*attn*": 0.3}, default=0.05, per_parameter=True)
    reference = copy.deepcopy(model)
    grad_copy(model, reference)
    for name, param in reference.named_parameters():
        torch.nn.utils.clip_grad_norm_([param], 0.3 if ".attn." in name else 0.05)
    coefs = rule.coefficients(seen.norms, seen.global_norm, seen.names)
    assert 0 < apply_coefficients(seen.params, coefs) < len(seen.params)  # some were small enough
    for ours, theirs in zip(seen.params, reference.parameters(), strict=True):
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-6, atol=0)


def test_the_first_matching_pattern_wins() -> None:
    names = ["h.0.attn.c_proj.weight", "h.0.attn.c_attn.weight", "h.0.mlp.c_proj.weight"]
    rule = LayerwiseClip({"*attn.c_proj*": 0.1, "*attn*": 10.0, "*c_proj*": 0.5})
    assert rule.groups(names).tolist() == [0, 1, 2]
    coefs = rule.coefficients(np.array([1.0, 1.0, 1.0]), math.sqrt(3), names)
    assert coefs == pytest.approx([0.1, 1.0, 0.5], rel=1e-6)


def test_a_nonfinite_member_leaves_only_its_group_alone() -> None:
    names = ["attn.q", "attn.k", "mlp.up", "mlp.down"]
    norms = np.array([3.0, math.nan, 3.0, 4.0])
    coefs = LayerwiseClip({"attn*": 1.0}, default=1.0).coefficients(norms, math.nan, names)
    assert coefs[:2].tolist() == [1.0, 1.0]  # the step will be skipped, never scaled by NaN
    assert coefs[2:] == pytest.approx([0.2, 0.2], rel=1e-6)
    norms[1] = math.inf
    coefs = LayerwiseClip({"attn*": 1.0}, default=1.0).coefficients(norms, math.inf, names)
    assert coefs[:2].tolist() == [1.0, 1.0]


def test_assignment_follows_a_changed_names_list(caplog: pytest.LogCaptureFixture) -> None:
    rule = LayerwiseClip({"*attn*": 1.0, "*typo*": 2.0}, default=0.5)
    names = ["a.attn.w", "a.mlp.w"]
    with caplog.at_level(logging.WARNING, logger="trainguard"):
        assert rule.groups(names).tolist() == [0, 2]
        assert rule.groups(list(names)).tolist() == [0, 2]
    assert sum("'*typo*'" in r.getMessage() for r in caplog.records) == 1  # warned once
    names[1] = "a.attn.v"  # edited in place: not served from a stale cache
    assert rule.groups(names).tolist() == [0, 0]
    assert rule.groups(["x", "y.attn", "z"]).tolist() == [2, 0, 2]


def test_describe_reads_like_the_configuration() -> None:
    text = LayerwiseClip({"*attn*": 1.0}, default=0.5).describe()
    assert text == "layer-wise (per group): '*attn*' <= 1, others <= 0.5"
    text = LayerwiseClip({"*attn*": 1.0}, per_parameter=True).describe()
    assert text == "layer-wise (each parameter): '*attn*' <= 1, others untouched"


@pytest.mark.parametrize(("limits", "default", "message"), [
    ({"*attn*": -1.0}, 0.5, r"limits\['\*attn\*'\]: must be a finite number > 0"),
    ({"*attn*": 0.0}, None, r"limits\['\*attn\*'\]: must be a finite number > 0"),
    ({"*attn*": math.nan}, None, "must be a finite number > 0"),
    ({"*attn*": 1.0}, -0.5, r"LayerwiseClip.default: must be a finite number > 0"),
    ({}, None, "would clip nothing"),
    ({"": 1.0}, None, "non-empty string"),
    ([("*attn*", 1.0)], None, "must be a mapping"),
])
def test_bad_configuration_is_a_config_error(limits: object, default: object,
                                             message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        LayerwiseClip(limits, default)  # type: ignore[arg-type]


def test_empty_map_with_a_default_is_a_group_of_everything() -> None:
    norms = np.array([3.0, 4.0])
    coefs = LayerwiseClip({}, default=1.0).coefficients(norms, 5.0, ["a", "b"])
    assert coefs == pytest.approx([0.2, 0.2], rel=1e-6)
    with pytest.raises(ConfigError, match="per_parameter: must be True or False"):
        LayerwiseClip({}, default=1.0, per_parameter="yes")  # type: ignore[arg-type]
