"""`reward_dead`: the reward no longer tells one completion from another.

GRPO and RLOO learn from the differences between the rewards of completions of one prompt.
When every group scores alike (`frac_reward_zero_std` at 1, or a reward spread of 0) for
`detectors.reward_dead.steps` steps in a row, every advantage is 0 and so is the policy
gradient: the run trains nothing, whatever its loss says. What the step shows says why:
completions all cut at `max_completion_length` (`completions/clipped_ratio` at 1) cannot
reach what the reward looks for, unless the policy's entropy fell under a tenth of its start on
the way (`detectors.entropy_collapse.share`): then a collapsed policy stopped ending its answers
(updates too large for it); a reward that told completions apart at an earlier step is no
constant function: the policy's completions of a prompt became alike (it collapsed, as updates
too large make it); otherwise the reward function gives everything the same score (the reward
functions whose own spread is 0 are named). Reported once per episode.
"""

from __future__ import annotations

from typing import Any

from trainguard.detect.base import UnlearnedStreak
from trainguard.detect.trainer_metrics import (
    CLIPPED,
    REWARD_FUNC_STD,
    REWARD_STD,
    REWARD_ZERO_STD,
    EntropyFall,
    first,
    is_zero,
)
from trainguard.events import Event
from trainguard.signals import StepSignals


class RewardDead(UnlearnedStreak):
    kind = "reward_dead"
    reads = frozenset({"trainer_metrics"})
    idle_without = frozenset({"trainer_metrics"})
    unlearned = "every group of completions scored alike (no advantage, no policy gradient)"

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.told_apart: int | None = None
        """The last step whose reward told a prompt's completions apart."""
        self.entropy = EntropyFall(config.entropy_collapse.warmup)

    @property
    def needed(self) -> int:
        return self.config.reward_dead.steps

    def check(self, signals: StepSignals) -> list[Event]:
        metrics = signals.trainer_metrics
        settings = self.config.reward_dead
        share = metrics.get(REWARD_ZERO_STD)
        spread = first(metrics, REWARD_STD)
        if share is None and spread is None:
            return []  # no reward computed at this step
        self.entropy.see(metrics)
        dead = (share >= settings.zero_std_share if share is not None
                else spread is not None and is_zero(spread[1]))
        if not dead:
            self.told_apart = signals.step
        if not self.count(dead):
            return []
        clipped = metrics.get(CLIPPED)
        flat = sorted(match["name"] for name, value in metrics.items()
                      if (match := REWARD_FUNC_STD.match(name)) and is_zero(value))
        named = f" (reward function {', '.join(flat)} gives every completion one score)" \
            if flat else ""
        fell = self.entropy.fell(self.config.entropy_collapse.share)
        if clipped is not None and clipped >= settings.zero_std_share and fell is not None:
            cause = "lr_too_high"
            why = ("every completion was cut at max_completion_length before it ended "
                   f"(completions/clipped_ratio {clipped:.3g}) after the policy's entropy fell "
                   f"from {fell[0]:.3g} to {fell[1]:.3g}: a collapsed policy stopped ending its "
                   "answers")
        elif clipped is not None and clipped >= settings.zero_std_share:
            cause = "max_completion_length_too_small"
            why = ("every completion was cut at max_completion_length before it ended "
                   f"(completions/clipped_ratio {clipped:.3g}): none reaches what the reward "
                   "looks for")
        elif self.told_apart is not None:
            cause = "lr_too_high"
            why = (f"the reward told completions apart until step {self.told_apart}: the "
                   "policy's completions of a prompt became alike (it collapsed), not the reward")
        else:
            cause = "reward_constant"
            why = "the reward gives every completion of a prompt the same score"
        return [self.event(
            signals.step, "warning",
            f"every group of completions got the same reward for {self.streak} steps"
            f"{named}: the advantages and the policy gradient are 0, nothing is learned; {why}",
            value=share if share is not None else None, cause=cause, steps=self.streak,
            clipped_ratio=clipped, reward_functions=flat, told_apart=self.told_apart)]

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "told_apart": self.told_apart,
                "entropies": self.entropy.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.entropy.load_state_dict(state.get("entropies"))
        told = state.get("told_apart")
        self.told_apart = int(told) if told is not None else None
