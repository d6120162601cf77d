"""The global clipping limit in force: the one computation of it, from the links that set it.

    fixed      the user's `max_grad_norm`, or the lower one a rollback tightened it to
    adaptive   the adaptive default clip's (`remedies/robust.py`): its typical norm while in
               an alarm
    fallback   the configured fixed limit, in force when the run holds neither

The limit in force is the lowest of the fixed and the adaptive ones, else the fallback. Their
state lives in the clip chain (`remedies/clip_chain.py`, `RunState.clip`: the fixed limit, and
the adaptive clip, rewound with the detectors' baselines); `ClipChain.limits` gathers them into
`ClipLimits` for a step, and every reader of a limit (the step's decision, the device's clip under
`sync="deferred"`, an unguarded step, a rollback's event, the preflight) takes it from there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainguard.remedies.robust import RobustClipLimit


@dataclass(frozen=True, slots=True)
class ClipLimits:
    """The global clipping limits the run holds for one step."""

    fixed: float | None
    """The fixed limit (the configured one, or a rollback's tighter one; None: none)."""
    fallback: float | None = None
    """The configured fixed limit, in force when the run holds no other."""
    adaptive: float | None = None
    """The adaptive clip's limit for the step (None: no adaptive clip)."""
    alarmed: float | None = None
    """The adaptive clip's limit once in an alarm (the typical norm)."""
    device: float | None = None
    """The limit the device already clipped the step at (`sync="deferred"`)."""

    def _lowest(self, alarm: bool) -> float | None:
        adaptive = self.alarmed if alarm and self.adaptive is not None else self.adaptive
        if adaptive is None or self.fixed is None:  # read every step: no list built
            return self.fixed if adaptive is None else adaptive
        return min(self.fixed, adaptive)

    def in_force(self, alarm: bool = False) -> float | None:
        """The step's limit (None: no clipping); `alarm`: the step puts the adaptive clip in
        alarm."""
        lowest = self._lowest(alarm)
        return self.fallback if lowest is None else lowest

    def adaptive_in_force(self, alarm: bool = False) -> bool:
        """Whether the limit in force is the adaptive clip's (for the reason a clip gives)."""
        return self.adaptive is not None and self._lowest(alarm) != self.fixed


def clip_limits(fixed: float | None, auto: RobustClipLimit | None, fallback: float | None,
                step: int) -> ClipLimits:
    """The limits in force for `step` from the fixed limit and the adaptive clip's state."""
    return ClipLimits(fixed=fixed, fallback=fallback,
                      adaptive=None if auto is None else auto.limit(step),
                      alarmed=None if auto is None else auto.alarm_limit())
