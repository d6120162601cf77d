"""Temperature-scaled cross-entropy and the loss cap, with their effect on real gradients."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from trainguard.errors import ConfigError, UsageError
from trainguard.recipes import capped_loss, capped_per_sample_loss, temperature_cross_entropy


def logits_grad(logits: torch.Tensor, target: torch.Tensor, temperature: float) -> torch.Tensor:
    logits = logits.clone().requires_grad_(True)
    temperature_cross_entropy(logits, target, temperature).backward()
    return logits.grad


def test_matches_cross_entropy_of_scaled_logits_on_language_model_shapes() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11)
    labels = torch.randint(0, 11, (2, 5))
    labels[0, :2] = -100  # padding, passed through to F.cross_entropy
    expected = F.cross_entropy(logits.view(-1, 11) / 1.3, labels.view(-1), ignore_index=-100)
    got = temperature_cross_entropy(logits, labels, 1.3, ignore_index=-100)
    assert torch.allclose(got, expected)
    probabilities = torch.softmax(torch.randn(2, 5, 11), dim=-1)
    assert torch.allclose(temperature_cross_entropy(logits, probabilities, 2.0),
                          F.cross_entropy(logits.view(-1, 11) / 2.0, probabilities.view(-1, 11)))


def test_gradient_is_softened_softmax_minus_target_over_temperature() -> None:
    torch.manual_seed(0)
    logits, target = torch.randn(8, 5) * 3, torch.randint(0, 5, (8,))
    for temperature in (0.7, 1.0, 2.0, 4.0):
        expected = (torch.softmax(logits / temperature, -1) - F.one_hot(target, 5)) / (
            temperature * 8)
        assert torch.allclose(logits_grad(logits, target, temperature), expected, atol=1e-7)


@pytest.mark.parametrize("temperature", [0.7, 2.0, 4.0])
def test_gradients_scale_by_one_over_temperature(temperature: float) -> None:
    target = torch.tensor([0, 1, 2, 3])
    # Uninformative logits: the softmax is uniform at any temperature, only 1/T remains.
    zero = torch.zeros(4, 6)
    assert torch.allclose(logits_grad(zero, target, temperature),
                          logits_grad(zero, target, 1.0) / temperature)
    # Confidently wrong logits: saturated at any temperature, gradient norm shrinks by 1/T.
    wrong = torch.full((4, 6), -200.0)
    wrong[:, 5] = 200.0
    ratio = logits_grad(wrong, target, temperature).norm() / logits_grad(wrong, target, 1.0).norm()
    assert float(ratio) == pytest.approx(1 / temperature, rel=1e-4)


@pytest.mark.parametrize("temperature", [0, -1.0, math.nan, math.inf, True, "2"])
def test_bad_temperature_is_a_config_error(temperature) -> None:
    with pytest.raises(ConfigError, match="temperature"):
        temperature_cross_entropy(torch.zeros(2, 3), torch.tensor([0, 1]), temperature)


def test_mismatched_shapes_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="does not fit logits"):
        temperature_cross_entropy(torch.zeros(2, 5, 3), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(UsageError, match=r"must be a torch\.Tensor"):
        temperature_cross_entropy([[0.0, 1.0]], torch.tensor([0]))


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        # Piecewise linear, so a scaled-up input gives proportionally larger logits.
        self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))

    def losses(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(self.net(x), y, reduction="none")


def batch(outlier: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Six samples; sample 0 is scaled by `outlier` and labelled with its least likely class."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(6, 4, generator=generator)
    y = torch.randint(0, 3, (6,), generator=generator)
    x[0] *= outlier
    with torch.no_grad():
        y[0] = Classifier().net(x[:1]).argmin()
    return x, y


def grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


def test_capped_loss_below_the_cap_is_unchanged_with_its_gradient() -> None:
    model = Classifier()
    loss = model.losses(*batch()).mean()
    reference = torch.autograd.grad(loss, list(model.parameters()), retain_graph=True)
    capped = capped_loss(loss, cap=100.0)
    assert torch.equal(capped, loss)
    capped.backward()
    assert all(torch.equal(g, r) for g, r in zip(grads(model), reference, strict=True))


def test_capped_loss_above_the_cap_has_zero_gradient_so_learns_nothing() -> None:
    model = Classifier()
    loss = model.losses(*batch(outlier=1e4)).mean()
    assert float(loss.detach()) > 5.0
    capped = capped_loss(loss, cap=5.0)
    assert float(capped.detach()) == 5.0
    capped.backward()
    assert all(float(g.abs().max()) == 0.0 for g in grads(model))


def test_a_capped_step_is_not_a_skipped_step_under_adamw() -> None:
    model = Classifier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    model.losses(*batch()).mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    before = [p.detach().clone() for p in model.parameters()]
    loss = model.losses(*batch(outlier=1e4)).mean()
    assert float(loss.detach()) > 5.0  # the cap is active on this step
    capped_loss(loss, cap=5.0).backward()
    assert all(float(p.grad.abs().max()) == 0.0 for p in model.parameters())
    optimizer.step()  # zero gradients, yet momentum and weight decay still move every weight
    moved = [not torch.equal(p, q) for p, q in zip(model.parameters(), before, strict=True)]
    assert all(moved)


def test_per_sample_cap_silences_only_the_outlier() -> None:
    x, y = batch(outlier=1e4)
    model = Classifier()
    losses = model.losses(x, y)
    assert float(losses[0].detach()) > 50.0 and float(losses[1:].detach().max()) < 50.0
    capped_per_sample_loss(losses, cap=50.0).backward()
    per_sample = grads(model)

    clean = Classifier()
    (clean.losses(x[1:], y[1:]).sum() / 6).backward()  # the batch without the outlier
    assert all(torch.allclose(g, r) for g, r in zip(per_sample, grads(clean), strict=True))
    assert any(float(g.abs().max()) > 0 for g in per_sample)

    whole = Classifier()
    capped_loss(whole.losses(x, y).mean(), cap=float(losses.detach().mean()) / 2).backward()
    assert all(float(g.abs().max()) == 0.0 for g in grads(whole))  # batch cap silences all


def test_per_sample_reductions() -> None:
    losses = torch.tensor([1.0, 200.0, 3.0])
    assert capped_per_sample_loss(losses, 100.0, "none").tolist() == [1.0, 100.0, 3.0]
    assert float(capped_per_sample_loss(losses, 100.0, "sum")) == 104.0
    assert float(capped_per_sample_loss(losses, 100.0)) == pytest.approx(104.0 / 3)
    with pytest.raises(ConfigError, match="reduction"):
        capped_per_sample_loss(losses, 100.0, "max")  # type: ignore[arg-type]


def test_non_finite_losses_are_never_hidden_by_the_cap() -> None:
    values = torch.tensor([math.nan, math.inf, -math.inf, 1e9, 2.0])
    capped = capped_loss(values, 100.0)
    assert math.isnan(capped[0]) and capped[1] == math.inf and capped[2] == -math.inf
    assert capped[3:].tolist() == [100.0, 2.0]
    assert math.isnan(float(capped_per_sample_loss(values[[0, 4]], 100.0)))


@pytest.mark.parametrize("cap", [0, -5.0, math.nan, math.inf, None])
def test_bad_cap_is_a_config_error(cap) -> None:
    with pytest.raises(ConfigError, match="cap"):
        capped_loss(torch.tensor(3.0), cap)
