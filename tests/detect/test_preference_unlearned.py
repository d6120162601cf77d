"""`preference_unlearned` on synthetic preference metrics: rewards pinned at 0."""

from __future__ import annotations

import math
from typing import Any

from tests.detect.synth import default_config, signals
from trainguard.detect.preference_unlearned import PreferenceUnlearned

LN2 = math.log(2)


def _run(chosen: list[float], rejected: list[float], lr: float | None = 1e-4) -> list[Any]:
    detector = PreferenceUnlearned(default_config())
    return [e for i, (c, r) in enumerate(zip(chosen, rejected, strict=True))
            for e in detector.check(signals(i, loss=LN2, lr=lr, trainer_metrics={
                "rewards/chosen": c, "rewards/rejected": r, "rewards/margins": c - r}))]


def test_a_policy_that_learns_moves_its_rewards_at_once() -> None:
    chosen = [0.0] + [0.01 * i for i in range(1, 40)]
    assert _run(chosen, [-c for c in chosen]) == []


def test_rewards_pinned_at_zero_at_lr_0() -> None:
    found = _run([0.0] * 30, [0.0] * 30, lr=0.0)
    assert [(e.step, e.details["cause"]) for e in found] == [(9, "lr_too_low")]
    assert "0.6931" in found[0].message


def test_rewards_pinned_at_zero_while_the_policy_trains() -> None:
    found = _run([0.0] * 12, [0.0] * 12, lr=5e-4)
    assert [e.details["cause"] for e in found] == ["reference_is_policy"]


def test_one_reward_zero_is_not_enough() -> None:
    assert _run([0.0] * 20, [-0.3] * 20) == []
