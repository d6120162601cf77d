"""The adaptive default clip: a step is clipped only when its norm is abnormal for this run.

A fixed `clip.max_grad_norm=1.0` (the Hugging Face Trainer's default, and the guide's) clips *every*
step of a run whose healthy global gradient norm sits above 1: a classifier head, a diffusion
UNet at a higher LR, a model trained in fp16 with large norms. That slows healthy training, and a
guard that slows healthy training gets switched off. `RobustClipLimit` instead keeps the run's own
robust baseline of the global norm (median and MAD of recent log-norms, as `grad_explosion`
does) and gives the limit in force for each step:

    in an alarm                    the typical norm (the median), for `alarm_steps` (20) steps
                                   from a gradient explosion, loss spike or loss divergence
                                   event (the step that raised it included)
    warm (>= warmup_steps norms)   exp(median + max(ln ratio, zscore * robust std)): 20x the
                                   typical norm and six robust standard deviations out
    warming up (1..warmup_steps)   warmup_ratio (10) x the median of the norms so far
    first step                     the ceiling
    always                         at most `ceiling` (the guide's absolute limit, 1000)

So what clips is the run's own detectors: a step they call an explosion (or a loss spike) is cut
down to the run's typical norm, and so are the next 20, as the guide's fixed clip at 1.0 does for
a run whose norm sits near 1; a run that stays unstable keeps re-arming it. The warm limit is only
a backstop, loose on purpose: healthy fine-tunes were measured with single steps at up to 10x
their median norm (a BERT classifier while its new head learns), which a tighter rule would
clip. During warm-up the rule is looser still relative to the few norms seen, since the first
norms of a fine-tune, LoRA's especially, still climb. A clipped step enters the baseline at the
limit it was clipped to, so a spike cannot drag the baseline up; skipped and rolled-back steps and
non-finite norms never enter it. Everything runs on the host from the norm the Guard already
measured and from the agreed events, so every rank computes the same limit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from trainguard.config import GuardConfig
from trainguard.errors import UsageError
from trainguard.signals import RobustBaseline

AUTO = "auto"
"""`GuardConfig(clip={"max_grad_norm": "auto"})`: the adaptive default."""


class RobustClipLimit:
    """The clipping limit in force for the next step, from this run's own norms."""

    def __init__(self, config: GuardConfig | None = None) -> None:
        """Its knobs from `config.clip` (`auto_*`), its baseline window, warm-up and noise floor
        from `config.detectors.common` (the detectors' own), its ceiling the absolute explosion
        limit (`config.detectors.grad_explosion.abs_threshold`)."""
        config = config or GuardConfig()
        clip, common = config.clip, config.detectors.common
        self.ratio = float(clip.auto_ratio)
        self.zscore = float(clip.auto_zscore)
        self.warmup_ratio = float(clip.auto_warmup_ratio)
        self.ceiling = float(config.detectors.grad_explosion.abs_threshold)
        self.min_log_scale = float(common.min_log_scale)
        self.window = common.baseline_window
        self.alarm_steps = clip.auto_alarm_steps
        self.warmup_steps = min(max(common.warmup_steps, 1), self.window)
        self.baseline = RobustBaseline(self.window, self.min_log_scale)
        self.alarm_until = -1
        """Steps before this one are in an alarm: clipped above the typical norm."""
        self.trouble_until = -1
        """The alarm's end counted from its last trouble, not a precursor (`after_trouble`)."""

    @property
    def warm(self) -> bool:
        return len(self.baseline) >= self.warmup_steps

    def limit(self, step: int | None = None) -> float:
        """The norm above which step `step` is clipped (to this value)."""
        if not len(self.baseline):
            return self.ceiling
        if step is not None and step < self.alarm_until:
            return self.alarm_limit()
        if not self.warm:
            return min(self.ceiling, self.warmup_ratio * math.exp(self.baseline.median()))
        median, scale = self.baseline.stats()
        return min(self.ceiling, math.exp(median + max(math.log(self.ratio),
                                                       self.zscore * scale)))

    def lowest_limit(self, step: int, steps: int) -> float | None:
        """A limit no higher than any this clip holds for the `steps` steps from `step` while
        each of them admits a norm under it (the calm lane's plan: their `observe`s may then
        wait, `RobustBaseline.admit_all` catching up exactly): each admitted value moves the
        median down one place at most, and the warm limit is at least `ratio` times the median.
        None: warming up, an alarm within those steps, or a window too short for the bound."""
        if not self.warm or step < self.alarm_until:
            return None
        median = self.baseline.lowest_median(steps)
        if median is None:
            return None
        return min(self.ceiling, math.exp(median) * self.ratio) * (1.0 - 1e-9)

    def alarm_limit(self) -> float:
        """The limit while in an alarm: the typical norm (the ceiling before the first norm)."""
        if not len(self.baseline):
            return self.ceiling
        return min(self.ceiling, math.exp(self.baseline.median()))

    def alarm(self, step: int, trouble: bool = True) -> None:
        """The run shows instability at `step` (a gradient explosion, a loss spike or a
        divergence): from this step on, for `alarm_steps` steps, clip above the typical norm, as
        the guide's fixed clip does for a run whose norm sits near 1. A lasting instability keeps
        re-arming it; a healthy run never raises one."""
        self.alarm_until = max(self.alarm_until, step + self.alarm_steps)
        if trouble:
            self.trouble_until = max(self.trouble_until, step + self.alarm_steps)

    def after_trouble(self, step: int) -> bool:
        """Whether a gradient explosion, loss spike or divergence (not a precursor warning, which
        alarms the clip too) came within the last `alarm_steps` steps, this one included."""
        return step < self.trouble_until

    def observe(self, norm: float, limit: float) -> None:
        """An applied step's pre-clip global norm, and the limit that was in force for it."""
        if not math.isfinite(norm) or norm <= 0:
            return
        self.baseline.admit(math.log(min(norm, limit)))

    def typical(self) -> float | None:
        """The run's typical norm (the baseline's median), None before the first step."""
        return math.exp(self.baseline.median()) if len(self.baseline) else None

    def state_dict(self) -> dict[str, Any]:
        return {"baseline": self.baseline.state_dict(), "alarm_until": self.alarm_until,
                "trouble_until": self.trouble_until}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping) or not isinstance(state.get("baseline"), Mapping):
            raise UsageError(f"RobustClipLimit.load_state_dict: expected a 'baseline' entry, "
                             f"got {state!r:.200}")
        values = state["baseline"].get("values")
        if not isinstance(values, list) or not all(
                isinstance(v, (int, float)) and math.isfinite(v) for v in values):
            raise UsageError("RobustClipLimit.load_state_dict: the baseline's values must be a "
                             "list of finite numbers")
        self.baseline.load_state_dict(dict(state["baseline"]))
        alarm = state.get("alarm_until", -1)
        self.alarm_until = int(alarm) if isinstance(alarm, int) else -1
        trouble = state.get("trouble_until", -1)
        self.trouble_until = int(trouble) if isinstance(trouble, int) else -1

    def describe(self) -> str:
        typical = self.typical()
        if typical is None:
            return f"adaptive (no norm seen yet: clips above {self.ceiling:g})"
        phase = "" if self.warm else (f", warming up {len(self.baseline)}/"
                                      f"{self.warmup_steps}")
        return (f"adaptive (typical norm {typical:.3g}{phase}: clips above "
                f"{self.limit():.3g})")
