"""`RunState`: the one home of a guarded run's runtime state, with one `state_dict`.

Counters, the clipping limit in force, the detectors' baselines, the clip rule's statistics and
the recover policy's judgement live here (or are reached from here), so that a checkpoint, a
resumed job and a rollback all see the same thing. The configuration is plain data and holds no
state; the objects built from it (detectors, rules) are held here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trainguard.detect import Detector
from trainguard.signals import LossCurvature
from trainguard.verdict import LossTrack

if TYPE_CHECKING:
    from trainguard.recovery import Recovery
    from trainguard.remedies import ClipRule


@dataclass(slots=True)
class RunState:
    max_grad_norm: float | None
    """The global clipping limit in force (the recover policy tightens it after a rollback)."""
    detectors: list[Detector] = field(default_factory=list)
    clip_rule: ClipRule | None = None
    """The clip rule built from the config's spec; its statistics are run state."""
    recovery: Recovery | None = None
    step: int = 0
    """Index of the next step (the first step is 0)."""
    consecutive_skips: int = 0
    data_position: int = 0
    """Running position of the next batch (the default data id for the skip list)."""
    sample_next: bool = False
    """The step after an event runs the heavy probes too."""
    curvature: LossCurvature = field(default_factory=LossCurvature)
    """The loss's smoothed second difference, measured every step."""
    losses: LossTrack = field(default_factory=LossTrack)
    """The loss levels the run's verdict compares (start, before the first trouble, final)."""

    # -- detectors -------------------------------------------------------------------------------
    def detector_state(self) -> dict[str, Any]:
        return {d.kind: d.state_dict() for d in self.detectors}

    def restore_detectors(self, state: dict[str, Any]) -> None:
        """Put the detectors' baselines back (on resume, or on a rollback that forgets steps)."""
        for detector in self.detectors:
            if detector.kind in state:
                detector.load_state_dict(state[detector.kind])

    def tighten_clipping(self, limit: float) -> None:
        self.max_grad_norm = limit if self.max_grad_norm is None else min(self.max_grad_norm,
                                                                           limit)

    # -- checkpoints -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain Python types (framework checkpoints load them with weights_only=True). The
        recover policy's saved states are not included: they are as large as a checkpoint."""
        state: dict[str, Any] = {
            "step": self.step, "consecutive_skips": self.consecutive_skips,
            "data_position": self.data_position, "max_grad_norm": self.max_grad_norm,
            "detectors": self.detector_state(), "losses": self.losses.state_dict(),
            "curvature": self.curvature.state_dict()}
        if self.clip_rule is not None:
            state["clip_rule"] = self.clip_rule.state_dict()
        if self.recovery is not None:
            state["recovery"] = self.recovery.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.consecutive_skips = int(state.get("consecutive_skips", 0))
        self.data_position = int(state.get("data_position", self.data_position))
        self.restore_detectors(state.get("detectors", {}))
        if "losses" in state:
            self.losses.load_state_dict(state["losses"])
        if "curvature" in state:
            self.curvature.load_state_dict(state["curvature"])
        if self.clip_rule is not None and "clip_rule" in state:
            self.clip_rule.load_state_dict(state["clip_rule"])
        recovery = state.get("recovery")
        if self.recovery is not None and isinstance(recovery, dict):
            self.recovery.load_state_dict(recovery)
            # only recovery moves the limit away from the configured one (older checkpoints
            # kept it inside the recovery state)
            self.max_grad_norm = state.get("max_grad_norm",
                                           recovery.get("max_grad_norm", self.max_grad_norm))
