"""`reward_dead` on synthetic reward series: groups that all score alike for steps in a row."""

from __future__ import annotations

from typing import Any

from tests.detect.synth import default_config, signals
from trainguard.detect.reward_dead import RewardDead


def _run(rows: list[dict[str, float]]) -> list[Any]:
    detector = RewardDead(default_config())
    return [e for i, row in enumerate(rows)
            for e in detector.check(signals(i, trainer_metrics=row))]


def test_a_reward_that_tells_completions_apart_is_quiet() -> None:
    rows = [{"frac_reward_zero_std": 0.5 if i % 3 else 1.0, "reward_std": 0.1} for i in range(30)]
    assert _run(rows) == []


def test_a_constant_reward_is_told_once_naming_the_function() -> None:
    rows = [{"frac_reward_zero_std": 1.0, "reward_std": 0.0, "rewards/accuracy/std": 0.0,
             "rewards/format/std": 0.0, "completions/clipped_ratio": 0.3}] * 12
    found = _run(rows)
    assert [(e.step, e.details["cause"]) for e in found] == [(4, "reward_constant")]
    assert found[0].details["reward_functions"] == ["accuracy", "format"]


def test_completions_all_cut_point_at_max_completion_length() -> None:
    rows = [{"frac_reward_zero_std": 1.0, "completions/clipped_ratio": 1.0}] * 6
    assert [e.details["cause"] for e in _run(rows)] == ["max_completion_length_too_small"]


def test_completions_all_cut_after_the_policy_collapsed_point_at_the_lr() -> None:
    """Cut at the limit as the entropy fell from 1.2 to 0.05: the policy stopped ending its
    answers; with the entropy kept, the completions need more room."""
    learning = [{"frac_reward_zero_std": 0.2, "reward_std": 0.1, "entropy": e,
                 "completions/clipped_ratio": 0.2} for e in (1.2, 1.25, 1.2, 0.6, 0.05)]
    cut = [{"frac_reward_zero_std": 1.0, "reward_std": 0.0, "entropy": 0.08,
            "completions/clipped_ratio": 1.0}] * 6
    [event] = _run(learning + cut)
    assert event.details["cause"] == "lr_too_high" and "fell from 1.2 to 0.05" in event.message
    kept = [dict(row, entropy=1.1) for row in learning[3:] + cut]
    assert [e.details["cause"] for e in _run(learning[:3] + kept)] == [
        "max_completion_length_too_small"]


def test_reward_std_alone_and_a_streak_that_breaks() -> None:
    rows = [{"reward_std": 0.0}] * 4 + [{"reward_std": 0.2}] + [{"reward_std": 0.0}] * 4
    assert _run(rows) == []  # never five in a row
    assert [e.step for e in _run([{"reward_std": 0.0}] * 5)] == [4]


def test_steps_without_a_reward_do_not_count() -> None:
    rows = [{"frac_reward_zero_std": 1.0}, {}, {}, {"frac_reward_zero_std": 1.0}]
    assert _run(rows) == []


def test_a_reward_that_dies_after_telling_completions_apart_is_the_policys_collapse() -> None:
    """Scores that varied for ten steps come from no constant function: the completions became
    alike (a policy collapsed by updates too large), and the LR is named, not the reward."""
    alive = [{"frac_reward_zero_std": 0.25, "reward_std": 0.3}] * 10
    dead = [{"frac_reward_zero_std": 1.0, "reward_std": 0.0, "completions/clipped_ratio": 0.2}]
    [event] = _run(alive + dead * 6)
    assert (event.step, event.details["cause"], event.details["told_apart"]) == (
        14, "lr_too_high", 9)
    assert "until step 9" in event.message


def test_what_the_reward_told_apart_survives_a_checkpoint() -> None:
    detector = RewardDead(default_config())
    detector.check(signals(0, trainer_metrics={"reward_std": 0.3}))
    restored = RewardDead(default_config())
    restored.load_state_dict(detector.state_dict())
    found = [e for i in range(1, 7)
             for e in restored.check(signals(i, trainer_metrics={"reward_std": 0.0}))]
    assert [e.details["cause"] for e in found] == ["lr_too_high"]
