"""The chance level every part of trainguard measures a loss against."""

from __future__ import annotations

import math

import torch

from trainguard.chance_level import chance_loss


def test_chance_loss_is_the_cross_entropy_of_a_uniform_guess() -> None:
    for classes in (2, 10, 50257):
        flat = torch.zeros(4, classes)  # the same scores for every class: a uniform guess
        targets = torch.arange(4) % classes
        measured = torch.nn.functional.cross_entropy(flat, targets).item()
        assert math.isclose(chance_loss(classes), measured, rel_tol=1e-6)


def test_one_class_costs_nothing() -> None:
    assert chance_loss(1) == 0.0
