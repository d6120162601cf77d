"""`reward_hacking` on synthetic series of several reward functions' means and spreads."""

from __future__ import annotations

import math

import pytest

from tests.detect.synth import default_config, signals
from trainguard.detect.reward_hacking import RewardHacking

Series = dict[str, tuple[list[float], float]]
"""A reward function's name: its mean at each step, and its spread over the completions."""


def _events(series: Series) -> list[tuple[int, list[str]]]:
    detector = RewardHacking(default_config())
    steps = len(next(iter(series.values()))[0])
    found = []
    for i in range(steps):
        metrics = {}
        for name, (means, std) in series.items():
            metrics[f"rewards/{name}/mean"] = means[i]
            metrics[f"rewards/{name}/std"] = std
        found += [(e.step, e.details["lagging"])
                  for e in detector.check(signals(i, trainer_metrics=metrics))]
    return found


RISING = [0.1, 0.1, 0.15, 0.3, 0.5, 0.7, 0.8, 0.9, 0.9, 0.9]


@pytest.mark.parametrize(("series", "expected"), [
    # a policy that learns the task raises both rewards
    ({"format": (RISING, 0.3), "accuracy": ([0.0, 0.1, 0.1, 0.2, 0.3, 0.4, 0.5, 0.5, 0.6, 0.6],
                                            0.3)}, []),
    # the format reward climbs, the accuracy reward pays 0 on every step: told once
    ({"format": (RISING, 0.3), "accuracy": ([0.0] * 10, 0.0)}, [(7, ["accuracy"])]),
    # the format reward climbs, the accuracy reward falls well below its start
    ({"format": (RISING, 0.3), "accuracy": ([0.5, 0.5, 0.5, 0.4, 0.2, 0.1, 0.1, 0.05, 0.0, 0.0],
                                            0.2)}, [(7, ["accuracy"])]),
    # a reward that wanders within its own spread is no climb (the accuracy still at 0)
    ({"format": ([0.11, 0.18, 0.14, 0.15, 0.13, 0.19, 0.16, 0.21, 0.17, 0.22], 0.2),
      "accuracy": ([0.0] * 10, 0.0)}, []),
    # one reward function alone: its climb is learning, there is nothing to lag
    ({"format": (RISING, 0.3)}, []),
    # no reward pays at all: reward_dead's, not this
    ({"format": ([0.0] * 10, 0.0), "accuracy": ([0.0] * 10, 0.0)}, []),
    # a NaN mean is left to nonfinite_metric and does not enter the levels
    ({"format": ([math.nan, *RISING], 0.3), "accuracy": ([0.0] * 11, 0.0)}, [(8, ["accuracy"])]),
])
def test_reward_series(series: Series, expected: list[tuple[int, list[str]]]) -> None:
    assert _events(series) == expected


def test_the_event_names_both_rewards() -> None:
    detector = RewardHacking(default_config())
    events = []
    for i, value in enumerate(RISING):
        events += detector.check(signals(i, trainer_metrics={
            "rewards/format/mean": value, "rewards/format/std": 0.3,
            "rewards/accuracy/mean": 0.0, "rewards/accuracy/std": 0.0}))
    [event] = events
    assert "format climbed from 0.1 to 0.7" in event.message
    assert "accuracy never paid (0 on every step)" in event.message
