"""`completions_truncated` on synthetic clipped-ratio series: the share cut at
`max_completion_length` rising to most of them mid-run, its cause read from the reward."""

from __future__ import annotations

import math

import pytest

from tests.detect.synth import default_config, signals
from trainguard.detect.completions_truncated import CompletionsTruncated
from trainguard.events import Event


def _events(clipped: list[float], reward: list[float] | None = None,
            entropy: list[float] | None = None) -> list[Event]:
    detector = CompletionsTruncated(default_config())
    found = []
    for i, value in enumerate(clipped):
        metrics = {"completions/clipped_ratio": value}
        if reward is not None:
            metrics["reward"] = reward[i]
        if entropy is not None:
            metrics["entropy"] = entropy[i]
        found += detector.check(signals(i, trainer_metrics=metrics))
    return found


@pytest.mark.parametrize(("clipped", "expected"), [
    # a few cut, wandering: quiet
    ([0.1, 0.0, 0.2, 0.4, 0.3, 0.6, 0.5, 0.7, 0.4], []),
    # most cut for two steps only: no trend
    ([0.1, 0.1, 0.1, 0.95, 1.0, 0.5, 0.2], []),
    # the policy stopped ending its answers: told once, at the third step in a row
    ([0.1, 0.0, 0.2, 0.5, 0.9, 1.0, 1.0, 1.0, 1.0], [6]),
    # cut from the start: reward_dead's or the user's choice, not a change mid-run
    ([1.0, 1.0, 0.9, 1.0, 1.0, 1.0, 1.0], []),
    # a NaN ratio (no completion sampled) is skipped
    ([0.1, math.nan, 0.1, 0.1, 1.0, 1.0, 1.0], [6]),
])
def test_clipped_series(clipped: list[float], expected: list[int]) -> None:
    assert [e.step for e in _events(clipped)] == expected


def test_lengths_that_grew_with_the_reward_need_more_room() -> None:
    clipped = [0.1, 0.1, 0.2, 0.5, 0.9, 1.0, 1.0]
    rising = _events(clipped, [0.2, 0.25, 0.2, 0.4, 0.5, 0.6, 0.7])
    assert [e.details["cause"] for e in rising] == ["max_completion_length_too_small"]
    assert "reward rose (0.2 -> 0.6)" in rising[0].message
    flat = _events(clipped, [0.16, 0.18, 0.17, 0.08, 0.17, 0.12, 0.17])
    assert [e.details["cause"] for e in flat] == ["lr_too_high"]
    assert "did not rise" in flat[0].message
    negative = _events(clipped, [-1.0, -1.1, -0.9, -0.5, -0.3, -0.2, -0.1])
    assert [e.details["cause"] for e in negative] == ["max_completion_length_too_small"]


def test_lengths_that_grew_as_the_policy_turned_deterministic_are_the_lr() -> None:
    """The reward of a toy task that pays for longer answers rises as the policy collapses to
    run-on ones: the entropy falling under a tenth of its start says which it is."""
    clipped = [0.1, 0.2, 0.2, 0.5, 0.9, 1.0, 1.0]
    reward = [0.2, 0.25, 0.2, 0.4, 0.5, 0.6, 0.7]
    collapsed = _events(clipped, reward, [1.2, 1.3, 1.2, 0.5, 0.09, 0.2, 0.3])
    assert [e.details["cause"] for e in collapsed] == ["lr_too_high"]
    assert "entropy fell from 1.2 to 0.09" in collapsed[0].message
    exploring = _events(clipped, reward, [1.2, 1.3, 1.2, 1.1, 1.0, 0.9, 0.9])
    assert [e.details["cause"] for e in exploring] == ["max_completion_length_too_small"]


def test_without_a_reward_or_an_entropy_no_cause_is_named() -> None:
    [event] = _events([0.1, 0.1, 0.2, 0.9, 1.0, 1.0])
    assert event.details["cause"] is None and "no reward or entropy" in event.message
