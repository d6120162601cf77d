"""Learning-rate warmup followed by cosine (or linear) decay, as a resumable LambdaLR.

The guide traces most unstable fine-tuning runs to the learning-rate schedule and recommends a
linear warmup (500 steps in its example) followed by cosine annealing. This module gives that curve
as a pure function (`warmup_cosine_factor`, reusable anywhere the exact curve is needed) and as a
`torch.optim.lr_scheduler.LambdaLR` whose schedule survives `state_dict()` / `load_state_dict()`.

Step convention. `step` counts optimizer updates from 0, as `LambdaLR.last_epoch` does: step s is
the LR used by update s. During warmup update s uses `start + (1 - start) * (s + 1) / warmup`, so
the very first update already moves (1/warmup of the peak when `warmup_start_ratio` is 0) and the
last warmup update (s = warmup - 1) reaches the peak. The common alternative, `s / warmup`, gives
LR 0 at step 0: that first update changes nothing but the optimizer's moment estimates, and a
schedule that looks like it starts at zero hides how large the second step already is. The decay
then follows `transformers.get_cosine_schedule_with_warmup` exactly (peak at s = warmup, progress
`(s - warmup) / (total - warmup)`), so the final update s = total - 1 is still above the floor and
the LR sits at `min_lr_ratio` from s = total on (it never rises again past the end).
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from trainguard.errors import ConfigError, UsageError

Shape = Literal["cosine", "linear"]
SHAPES: tuple[str, ...] = ("cosine", "linear")


def _check_int(value: object, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name}: must be an integer >= {minimum}, got {value!r}")
    return value


def _check_ratio(value: object, name: str) -> float:
    # `not 0 <= x <= 1` is True for NaN, so a NaN ratio is rejected too.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ConfigError(f"{name}: must be a number in [0, 1], got {value!r}")
    return float(value)


class WarmupSchedule:
    """The LR multiplier as a callable object, so LambdaLR saves and restores its parameters.

    LambdaLR's `state_dict` keeps a schedule only when it is an object (it stores the object's
    `__dict__`); a closure or lambda would be silently dropped and a resumed run would keep
    whatever schedule its script happened to rebuild. Attributes are plain numbers and a string,
    so the state loads with `torch.load(weights_only=True)`.
    """

    def __init__(self, *, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.0,
                 warmup_start_ratio: float = 0.0, shape: Shape = "cosine") -> None:
        self.warmup_steps = _check_int(warmup_steps, "warmup_steps", 0)
        self.total_steps = _check_int(total_steps, "total_steps", 1)
        if warmup_steps > total_steps:
            raise ConfigError(f"warmup_steps: {warmup_steps} is more than total_steps "
                              f"{total_steps}; the warmup must fit in the run")
        self.min_lr_ratio = _check_ratio(min_lr_ratio, "min_lr_ratio")
        self.warmup_start_ratio = _check_ratio(warmup_start_ratio, "warmup_start_ratio")
        if shape not in SHAPES:
            raise ConfigError(f"shape: must be one of {', '.join(SHAPES)}, got {shape!r}")
        self.shape = shape

    def __call__(self, step: int) -> float:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise UsageError(f"step must be an integer >= 0, got {step!r}")
        warmup, total = self.warmup_steps, self.total_steps
        if step < warmup:
            start = self.warmup_start_ratio
            return start + (1.0 - start) * (step + 1) / warmup
        if step >= total:
            return self.min_lr_ratio
        progress = (step - warmup) / (total - warmup)  # total > step >= warmup: no division by 0
        decay = 0.5 * (1.0 + math.cos(math.pi * progress)) if self.shape == "cosine" \
            else 1.0 - progress
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * decay

    def __repr__(self) -> str:
        return (f"WarmupSchedule(warmup_steps={self.warmup_steps}, total_steps="
                f"{self.total_steps}, min_lr_ratio={self.min_lr_ratio}, warmup_start_ratio="
                f"{self.warmup_start_ratio}, shape={self.shape!r})")


def warmup_cosine_factor(step: int, *, warmup_steps: int, total_steps: int,
                         min_lr_ratio: float = 0.0, warmup_start_ratio: float = 0.0) -> float:
    """Multiplier of the base LR at update `step` (0-based): linear warmup, then cosine decay."""
    return WarmupSchedule(warmup_steps=warmup_steps, total_steps=total_steps,
                          min_lr_ratio=min_lr_ratio, warmup_start_ratio=warmup_start_ratio)(step)


def warmup_linear_factor(step: int, *, warmup_steps: int, total_steps: int,
                         min_lr_ratio: float = 0.0, warmup_start_ratio: float = 0.0) -> float:
    """Multiplier of the base LR at update `step` (0-based): linear warmup, then linear decay."""
    return WarmupSchedule(warmup_steps=warmup_steps, total_steps=total_steps,
                          min_lr_ratio=min_lr_ratio, warmup_start_ratio=warmup_start_ratio,
                          shape="linear")(step)


def _scheduler(optimizer: torch.optim.Optimizer, schedule: WarmupSchedule,
               ) -> torch.optim.lr_scheduler.LambdaLR:
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UsageError(f"optimizer must be a torch.optim.Optimizer, got "
                         f"{type(optimizer).__name__}")
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


def warmup_cosine(optimizer: torch.optim.Optimizer, *, warmup_steps: int, total_steps: int,
                  min_lr_ratio: float = 0.0, warmup_start_ratio: float = 0.0,
                  ) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup over `warmup_steps` updates, then cosine decay to `min_lr_ratio` x base LR.

    Call `scheduler.step()` once after each `optimizer.step()`. Every parameter group follows the
    same curve relative to its own LR. Raises ConfigError on inconsistent arguments.
    """
    return _scheduler(optimizer, WarmupSchedule(
        warmup_steps=warmup_steps, total_steps=total_steps, min_lr_ratio=min_lr_ratio,
        warmup_start_ratio=warmup_start_ratio))


def warmup_linear(optimizer: torch.optim.Optimizer, *, warmup_steps: int, total_steps: int,
                  min_lr_ratio: float = 0.0, warmup_start_ratio: float = 0.0,
                  ) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup over `warmup_steps` updates, then linear decay to `min_lr_ratio` x base LR.

    The guide's own example (`get_linear_schedule_with_warmup` with 500 warmup steps), with the
    same step convention as `warmup_cosine`.
    """
    return _scheduler(optimizer, WarmupSchedule(
        warmup_steps=warmup_steps, total_steps=total_steps, min_lr_ratio=min_lr_ratio,
        warmup_start_ratio=warmup_start_ratio, shape="linear"))
