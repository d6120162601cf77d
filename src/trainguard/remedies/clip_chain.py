"""`ClipChain`: every clipping link of a run in one chain that owns the limit, its state in
`RunState.clip`.

    fixed      the configured `clip.max_grad_norm`, lowered by a rollback (`tighten`)
    adaptive   the adaptive default clip (`remedies/robust.py`, `clip.max_grad_norm="auto"`):
               the run's own norm baseline, in alarm after an explosion or a spike
    rule       the clip rule built from `clip.rule` (its statistics are run state)
    agc        adaptive gradient clipping from `clip.agc` (keeps no state)

As an optax chain, it is made once from the configuration (`init`) and each link keeps its own
state, moved on by the run's steps: `alarm` (the step's decision put the adaptive clip in
alarm), `update` (an applied step's norm and the limit it was clipped at), `tighten` (a
rollback). The global limit in force is computed in one place (`limits`, `remedies/limit.py`),
from the fixed and adaptive links; `apply` carries a decision's clip out, link by link: the
global factor, then the rule on the norms as the global clip left them, then AGC. Everything
runs on the host from the norms the step already measured, as cheaply as the limits alone.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from trainguard.config import GuardConfig
from trainguard.remedies.agc import AGC
from trainguard.remedies.clip import scale_grads
from trainguard.remedies.limit import ClipLimits, clip_limits
from trainguard.remedies.robust import RobustClipLimit
from trainguard.remedies.rules import ClipRule, apply_coefficients
from trainguard.remedies.spec import build_agc, build_rule
from trainguard.signals import StepSignals

log = logging.getLogger("trainguard")


@dataclass(slots=True)
class ClipChain:
    fixed_limit: float | None
    """The fixed global limit (the user's, or the lower one a rollback tightened it to); None:
    none."""
    configured_limit: float | None = None
    """The configured fixed limit, in force when the run holds no other."""
    adaptive: RobustClipLimit | None = None
    rule: ClipRule | None = None
    agc: AGC | None = None

    @classmethod
    def init(cls, config: GuardConfig) -> ClipChain:
        """The chain `config.clip` describes, every link fresh."""
        clip = config.clip
        return cls(fixed_limit=clip.fixed, configured_limit=clip.fixed,
                   adaptive=RobustClipLimit(config) if config.adaptive_clip else None,
                   rule=build_rule(clip.rule) if clip.rule is not None else None,
                   agc=build_agc(clip.agc) if clip.agc is not None else None)

    # -- the global limit --------------------------------------------------------------------------
    def limits(self, step: int) -> ClipLimits:
        """The global limits the links hold for `step`."""
        return clip_limits(self.fixed_limit, self.adaptive, self.configured_limit, step)

    def lowest_in_force(self, step: int, steps: int) -> float | None:
        """A limit no higher than the one in force at any of the `steps` steps from `step`,
        while each applies a norm under it and its `update` waits (`RobustClipLimit.
        lowest_limit`); math.inf without clipping. None: no such bound is known."""
        fixed = self.fixed_limit
        if self.adaptive is None:
            limit = fixed if fixed is not None else self.configured_limit
            return math.inf if limit is None else limit
        adaptive = self.adaptive.lowest_limit(step, steps)
        if adaptive is None:
            return None
        return adaptive if fixed is None else min(fixed, adaptive)

    def catch_up(self, norms: Sequence[float]) -> None:
        """The `update`s of applied steps whose norms were under the limit in force, each of
        which read the limit first, made at once (as `limits` then `update` at each)."""
        if self.adaptive is not None and norms:
            self.adaptive.baseline.admit_all(
                np.array([math.log(norm) for norm in norms]), stats_first=True)

    def in_force(self, step: int) -> float | None:
        """The global limit in force for `step` before its own events (None: no clipping)."""
        return self.limits(step).in_force()

    def alarm(self, step: int, trouble: bool) -> None:
        """The step's decision put the adaptive clip in alarm: on `trouble` (an explosion, a
        spike, a divergence), or only a precursor."""
        if self.adaptive is not None:
            self.adaptive.alarm(step, trouble=trouble)

    def after_trouble(self, step: int) -> bool:
        """Whether trouble (not a precursor) alarmed the adaptive clip within its alarm."""
        return self.adaptive is not None and self.adaptive.after_trouble(step)

    def update(self, norm: float, limit: float | None) -> None:
        """An applied step's pre-clip global norm and the limit it was clipped at."""
        if self.adaptive is not None:
            self.adaptive.observe(norm, limit if limit is not None else math.inf)

    def tighten(self, limit: float) -> None:
        """After a rollback: a fixed limit at `limit` (`RecoveryConfig.max_grad_norm`, the guide's
        0.5), below any earlier one; the adaptive clip stays on beneath it. (Clipping at the run's
        own typical norm instead was measured too: it recovered no more faults and let a run
        whose LR stays too high settle at a worse loss.)"""
        self.fixed_limit = limit if self.fixed_limit is None else min(self.fixed_limit, limit)

    # -- the gradients -----------------------------------------------------------------------------
    def apply(self, grads: list[torch.Tensor], params: Sequence[torch.Tensor],
              signals: StepSignals | None, coef: float, step: int) -> bool:
        """Carry a decision's clip out: `grads` scaled by the global factor `coef`, then the rule
        and AGC on the norms as the global clip left them (no second pass over the gradients).
        A failing rule or AGC is logged and leaves the global clip standing. Returns whether
        every gradient was scaled by `coef` alone (what a probe that measured them before can
        follow: no rule or AGC may have scaled one on its own)."""
        scale_grads(grads, coef)
        rule, agc = self.rule, self.agc
        if (rule is None and agc is None) or signals is None:
            return rule is None and agc is None
        try:
            if rule is not None:
                coefs = rule.coefficients(signals.param_grad_norm * coef,
                                          signals.grad_norm * coef, signals.param_names)
                apply_coefficients(params, coefs)
            if agc is not None:
                agc.apply(params, signals.param_names,
                          grad_norms=signals.param_grad_norm * coef if rule is None else None)
        except Exception as exc:  # a remedy bug must not kill the run; the global clip stands
            log.error("trainguard: clipping rule failed at step %d (%s: %s)", step,
                      type(exc).__name__, exc)
        return False
