"""`completions_truncated`: most completions came to be cut at `max_completion_length` mid-run.

A trainer that samples its own completions (GRPO, RLOO) logs the share of them cut at
`max_completion_length` before they ended (`completions/clipped_ratio`). A run that started with
few cut (the median of its first `detectors.completions_truncated.warmup` values under
`start_below`) and then has `share` or more cut for `steps` logged steps in a row is rewarded on
answers it never saw end. A run cut from its start is `reward_dead`'s when its reward dies, and
the user's choice when it does not.

What the policy and the reward did says why. Completions that grew in a run whose policy's
entropy fell under `detectors.entropy_collapse.share` of its start at some step come from a
policy turned deterministic, and ones that grew while the reward did not rise (a fifth above
where it started) from a policy that stopped ending its answers: updates too large for it (or a
KL penalty too weak to hold it). Ones that grew while the reward rose, the entropy still there,
learned to need more room: `max_completion_length` is too small. The event carries that cause
(`details["cause"]`). Reported once per episode.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from trainguard.detect.base import FromStartLevel
from trainguard.detect.trainer_metrics import CLIPPED, REWARD, EntropyFall, first
from trainguard.events import Event
from trainguard.signals import StepSignals

REWARD_ROSE = 0.2
"""A reward this share of its starting magnitude above its start (or above 0 from a start of
0) rose with the lengths."""


class CompletionsTruncated(FromStartLevel):
    kind = "completions_truncated"
    reads = frozenset({"trainer_metrics"})
    idle_without = frozenset({"trainer_metrics"})

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.rewards: list[float] = []
        """The first rewards (their median is where the reward started) and then the last
        `steps` ones."""
        self.entropy = EntropyFall(config.completions_truncated.warmup)

    def check(self, signals: StepSignals) -> list[Event]:
        metrics = signals.trainer_metrics
        value = metrics.get(CLIPPED)
        if value is None or not math.isfinite(value):
            return []  # a step that sampled nothing; NaN is bookkeeping here
        settings = self.config.completions_truncated
        reward = first(metrics, REWARD)
        if reward is not None and math.isfinite(reward[1]):
            self.rewards.append(reward[1])
            del self.rewards[settings.warmup:-settings.steps]
        self.entropy.see(metrics)
        start = self.start_level(value, settings.warmup)
        if start is None or start >= settings.start_below:
            return []
        if not self.held(value >= settings.share, settings.steps):
            return []
        cause, why = self._cause(settings.warmup, settings.steps)
        return [self.event(
            signals.step, "warning",
            f"{value:.0%} of the completions were cut at max_completion_length "
            f"({self.streak} logged step(s) in a row; {start:.0%} at the start): {why}",
            param=CLIPPED, value=value, start=start, cause=cause)]

    def _cause(self, warmup: int, steps: int) -> tuple[str | None, str]:
        fell = self.entropy.fell(self.config.entropy_collapse.share)
        if fell is not None:
            return ("lr_too_high",
                    f"the policy's entropy fell from {fell[0]:.3g} to {fell[1]:.3g} on the way: "
                    "it turned deterministic and stopped ending its answers")
        if len(self.rewards) > warmup:
            start = statistics.median(self.rewards[:warmup])
            recent = statistics.fmean(self.rewards[warmup:][-steps:])
            if recent > start + REWARD_ROSE * abs(start):
                return ("max_completion_length_too_small",
                        f"they grew while the reward rose ({start:.3g} -> {recent:.3g}): "
                        "the answers the policy learned need more room")
            return ("lr_too_high",
                    f"they grew while the reward did not rise ({start:.3g} -> {recent:.3g}): "
                    "the policy stopped ending its answers")
        return None, ("the policy stopped ending its answers, or its answers need more room "
                      "(the log holds no reward or entropy to tell)")

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "rewards": list(self.rewards),
                "entropies": self.entropy.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.rewards = [float(v) for v in state.get("rewards", [])]
        self.entropy.load_state_dict(state.get("entropies"))
