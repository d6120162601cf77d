"""The names a trainer gives its training metrics (TRL's GRPO, RLOO, DPO, KTO, ORPO, and older
PPO), and how a detector finds one of them in `StepSignals.trainer_metrics`."""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping
from typing import Any

KL = ("kl", "objective/kl")
"""The KL of the policy to its reference model: per token in GRPO, RLOO and KTO; per sequence
in PPO (`objective/kl`)."""
REWARD_ZERO_STD = "frac_reward_zero_std"
"""The share of groups of completions whose rewards were all alike (GRPO, RLOO)."""
REWARD_STD = ("reward_std", "objective/scores_std")
REWARD_FUNC_STD = re.compile(r"^rewards/(?P<name>.+)/std$")
"""One reward function's spread over the step's completions."""
REWARD_FUNC_MEAN = re.compile(r"^rewards/(?P<name>.+)/mean$")
"""One reward function's mean over the step's completions (GRPO, RLOO)."""
CLIPPED = "completions/clipped_ratio"
"""The share of completions cut at `max_completion_length` before they ended."""
MEAN_LENGTH = "completions/mean_length"
"""The mean length in tokens of the step's completions (GRPO, RLOO)."""
REWARD = ("reward", "objective/scores", "env/reward_mean")
"""The mean reward of the step's completions (GRPO and RLOO; older PPO)."""
CHOSEN_REWARD, REJECTED_REWARD = "rewards/chosen", "rewards/rejected"
"""A preference trainer's implicit rewards, beta times the policy's log-probability ratio to
the reference (DPO, KTO)."""
MARGINS = "rewards/margins"
ACCURACIES = "rewards/accuracies"
"""The share of pairs whose chosen reward is above the rejected one (DPO)."""
CHOSEN_LOGPS = "logps/chosen"
"""The policy's summed log-probability of the chosen completions (DPO, ORPO)."""
ENTROPY = "entropy"
"""The mean entropy of the policy's token distribution over the completions (GRPO, RLOO)."""
RATIO = ("val/ratio", "ppo/val/ratio", "sampling/importance_sampling_ratio/mean")
"""The mean probability ratio of the policy being trained to the one that sampled its data
(older TRL PPO, its logs' `ppo/` prefix, GRPO with a separate generation engine)."""

JUDGED = re.compile(r"(^|/)(kl|reward|rewards|reward_std|logps|logits|entropy|loss|nll_loss|"
                    r"log_odds_ratio|log_odds_chosen|margins|chosen|rejected|objective|policy|"
                    r"scores)(/|$|_)")
"""Metrics of the model's outputs and of what it is trained on: non-finite, they say the step
computed NaN or inf. Others are bookkeeping a trainer may leave NaN by design (the mean length
of terminated completions when none terminated, a clip ratio of no token)."""
NOT_JUDGED = ("completions/", "clip_ratio", "sampling/", "tools/", "num_tokens", "step_time")


def first(metrics: Mapping[str, float], names: tuple[str, ...]) -> tuple[str, float] | None:
    """The first of `names` the step's metrics hold, with its value."""
    for name in names:
        if name in metrics:
            return name, metrics[name]
    return None


def is_judged(name: str) -> bool:
    """Whether a non-finite value of the metric `name` says the step computed NaN or inf."""
    lowered = name.lower()
    return not lowered.startswith(NOT_JUDGED) and JUDGED.search(lowered) is not None


def is_trainer_metric(name: str) -> bool:
    """Whether a column of a log is one of the trainer metrics the detectors read (`analyze`
    hands a log's such columns to them as `StepSignals.trainer_metrics`)."""
    named = (*KL, REWARD_ZERO_STD, *REWARD_STD, CLIPPED, MEAN_LENGTH, CHOSEN_REWARD,
             REJECTED_REWARD, MARGINS, ACCURACIES, CHOSEN_LOGPS, ENTROPY, *RATIO)
    return (name in named or REWARD_FUNC_STD.match(name) is not None
            or REWARD_FUNC_MEAN.match(name) is not None or is_judged(name))


def is_zero(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value == 0.0


class EntropyFall:
    """The policy's entropy where the run started (the median of its first `warmup` values) and
    the lowest since: whether it turned deterministic on the way (under `share` of its start),
    which says that completions grown to their limit, or alike, come from a collapsed policy."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.values: list[float] = []
        """The first `warmup` entropies, then the lowest since."""

    def see(self, metrics: Mapping[str, float]) -> None:
        value = metrics.get(ENTROPY)
        if value is None or not math.isfinite(value):
            return
        if len(self.values) <= self.warmup:
            self.values.append(value)
        else:
            self.values[-1] = min(self.values[-1], value)

    def fell(self, share: float) -> tuple[float, float] | None:
        """(start, lowest) when the lowest entropy since the start is under `share` of it."""
        if len(self.values) <= self.warmup:
            return None
        start, lowest = statistics.median(self.values[:self.warmup]), self.values[-1]
        return (start, lowest) if lowest < share * start else None

    def state_dict(self) -> list[float]:
        return list(self.values)

    def load_state_dict(self, state: Any) -> None:
        self.values = [float(v) for v in state or []]
