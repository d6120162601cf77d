"""`RunState`: the one home of a guarded run's runtime state, with one `state_dict`.

Counters, the clipping limit in force, the detectors' baselines, the clip rule's statistics,
metric collapse's best values, the batch watch's memory, the sampling schedule, the recover
policy's judgement, the journal of findings and the prover's record live here (or are reached
from here), each a `Stateful` under a stable key (`components`), so that a checkpoint, a resumed
job and a rollback all see the same thing. The configuration is plain data and holds no state;
the objects built from it (detectors, rules) are held here, and `Services` holds none.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trainguard.detect import Detector
from trainguard.detect.instability_precursor import InstabilityPrecursor
from trainguard.detect.on_duty import OnDuty
from trainguard.probes.sample_cadence import SampleCadence
from trainguard.signals import LossCurvature, StepSignals
from trainguard.stateful import Stateful, gather, restore
from trainguard.verdict import LossTrack

if TYPE_CHECKING:
    from trainguard.detect.metric_collapse import MetricCollapse
    from trainguard.diagnose.anchor import ProofAnchor
    from trainguard.diagnose.batch_watch import BatchWatch
    from trainguard.diagnose.incidents import IncidentProver
    from trainguard.finding import Finding
    from trainguard.pipeline.journal import Journal
    from trainguard.recovery import Recovery
    from trainguard.recovery.brake import PrecursorBrake
    from trainguard.recovery.kl_penalty import KLPenalty
    from trainguard.recovery.ring import GoodStateRing
    from trainguard.remedies.clip_chain import ClipChain


AUTO_CLIP = "auto_clip"
"""The adaptive clip's entry among the detectors' baselines."""

REWOUND = ("detectors",)
"""The components a rollback puts back with the weights: the baselines the bad steps fed (the
detectors' and the adaptive clip's). The others describe the data and the evaluations seen, which
a rollback does not undo (a bad batch stays bad, a collapsed metric was seen), what was said and
proved (the journal's findings, the prover's record, whose baseline holds healthy steps only), or,
as recovery's judgement, are what decided the rollback."""


@dataclass(slots=True)
class RunState:
    clip: ClipChain
    """Every clipping link (fixed, adaptive, clip rule, AGC) and the one computation of the
    limit in force (`remedies/clip_chain.py`)."""
    batches: BatchWatch
    """The batch inspector's memory: reference size, typical magnitudes, runs of bad batches."""
    journal: Journal
    """The run's events and findings, and the sinks that hear them (`pipeline/journal.py`)."""
    prover: IncidentProver
    """Proves the causes of an incident by replaying its step (`diagnose/incidents.py`)."""
    detectors: list[Detector] = field(default_factory=list)
    recovery: Recovery | None = None
    brake: PrecursorBrake | None = None
    """The LR brake an `instability_precursor` warning pulls (every policy but observe)."""
    kl_penalty: KLPenalty | None = None
    """The KL penalty a drift the penalty did not hold raises (under recover, when the run's
    `beta` is known: `recovery/kl_penalty.py`)."""
    anchor: ProofAnchor | None = None
    """Good states a proof starts from, without a recover ring (`diagnose/anchor.py`)."""
    step: int = 0
    """Index of the next step (the first step is 0)."""
    consecutive_skips: int = 0
    data_position: int = 0
    """Running position of the next batch (the default data id for the skip list)."""
    sample_next: bool = False
    """The step after an event runs the heavy probes too."""
    sampled_now: bool = False
    """Whether the step about to be measured runs the heavy probes (decided before its forward
    pass, by `Run.schedule_sampling`)."""
    cadence: SampleCadence = field(default_factory=lambda: SampleCadence(50, None))
    """The heavy probes' interval in force, as their cost allows (`probes/sample_cadence.py`)."""
    precursors_due: bool = True
    """Whether the step about to be measured runs the precursor probes (Adam's ratio, log Z),
    decided before its forward pass with the sampling (`InstabilityPrecursor.due`)."""
    ratio_due: bool = True
    """Whether it measures Adam's ratio too (`InstabilityPrecursor.ratio_due`): log Z alone when
    not."""
    curvature: LossCurvature = field(default_factory=LossCurvature)
    """The loss's smoothed second difference, measured every step."""
    losses: LossTrack = field(default_factory=LossTrack)
    """The loss levels the run's verdict compares (start, before the first trouble, final)."""
    metric_watch: MetricCollapse | None = None
    """`metric_collapse` on the evaluation metrics handed over: their best values, episodes."""
    output_classes: int | None = None
    """Width of the model's class scores, as the output probe last saw it (chance level for
    `metric_collapse`)."""
    duty: OnDuty | None = None
    """Which of `detectors` each shape of step concerns (`detect/on_duty.py`), built at the
    first step."""

    def good_states(self) -> GoodStateRing | None:
        """The ring of good states a proof replays from: the recover ring, else the proof
        anchor's (None: neither is kept)."""
        if self.recovery is not None:
            return self.recovery.ring
        return self.anchor.good_states if self.anchor is not None else None

    # -- every component with state ----------------------------------------------------------------
    def components(self) -> dict[str, Stateful | None]:
        """Every component with state, under its key in `state_dict` (None: not in this run)."""
        return {"detectors": _Baselines(self), "losses": self.losses,
                "curvature": self.curvature, "clip_rule": self.clip.rule,
                "recovery": self.recovery, "metric_collapse": self.metric_watch,
                "batch_watch": self.batches, "sampling": _Sampling(self),
                "brake": self.brake, "kl_penalty": self.kl_penalty, "journal": self.journal,
                "prover": self.prover}

    def evidence_findings(self, step_findings: Iterable[Finding] = (),
                          closed: bool = False) -> list[Finding]:
        """The findings a diagnosis weighs: the run's, those of the step under way (not yet
        recorded), and the runs of consecutive bad batches seen so far (added to the run's
        findings when it closes)."""
        findings = self.journal.findings
        if closed:
            return list(findings)
        return findings + list(step_findings) + self.batches.run_findings()

    # -- detectors -------------------------------------------------------------------------------
    def on_duty(self, signals: StepSignals) -> list[Detector]:
        """The detectors `signals` concern: the others' checks would be no-ops."""
        return self._duty().of(signals)

    def precursor(self) -> InstabilityPrecursor | None:
        """The `instability_precursor` detector (None: not among the run's)."""
        return self._duty().precursor

    def _duty(self) -> OnDuty:
        if self.duty is None or self.duty.detectors is not self.detectors:
            self.duty = OnDuty(self.detectors)
        return self.duty

    def detector_state(self) -> dict[str, Any]:
        """The detectors' baselines, and the adaptive clip's (`auto_clip`), which is one too."""
        state = {d.kind: d.state_dict() for d in self.detectors}
        if self.clip.adaptive is not None:
            state[AUTO_CLIP] = self.clip.adaptive.state_dict()
        return state

    def restore_detectors(self, state: dict[str, Any]) -> None:
        """Put the detectors' baselines back (on resume, or on a rollback that forgets steps)."""
        for detector in self.detectors:
            if detector.kind in state:
                detector.load_state_dict(state[detector.kind])
        if self.clip.adaptive is not None and AUTO_CLIP in state:
            self.clip.adaptive.load_state_dict(state[AUTO_CLIP])

    def clip_limit(self) -> float | None:
        """The global clipping limit in force for the next step, before its own events, as the
        clip chain computes it (None: no clipping)."""
        return self.clip.in_force(self.step)

    # -- checkpoints -----------------------------------------------------------------------------
    def rewind_state(self) -> dict[str, Any]:
        """The state a good-state capture keeps for a rollback to put back (`REWOUND`)."""
        components = self.components()
        return gather({key: components[key] for key in REWOUND})

    def rewind(self, state: dict[str, Any]) -> None:
        """Put back what a good state kept (`rewind_state`)."""
        components = self.components()
        restore({key: components[key] for key in REWOUND}, state)

    # -- checkpoints -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain Python types (framework checkpoints load them with weights_only=True). The
        recover policy's saved states are not included: they are as large as a checkpoint."""
        return {"step": self.step, "consecutive_skips": self.consecutive_skips,
                "data_position": self.data_position, "max_grad_norm": self.clip.fixed_limit,
                "output_classes": self.output_classes, **gather(self.components())}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load a `state_dict`, from this version or an older one: a component whose key is
        missing keeps its fresh state."""
        self.step = int(state["step"])
        self.consecutive_skips = int(state.get("consecutive_skips", 0))
        self.data_position = int(state.get("data_position", self.data_position))
        classes = state.get("output_classes")
        self.output_classes = None if classes is None else int(classes)
        restore(self.components(), state)
        recovery = state.get("recovery")
        if self.recovery is not None and isinstance(recovery, dict):
            # only recovery moves the limit away from the configured one (older checkpoints
            # kept it inside the recovery state)
            self.clip.fixed_limit = state.get("max_grad_norm",
                                        recovery.get("max_grad_norm", self.clip.fixed_limit))


class _Baselines:
    """The detectors' baselines and the adaptive clip's (`auto_clip`), under one key (the
    format checkpoints have always had)."""

    def __init__(self, state: RunState) -> None:
        self.state = state

    def state_dict(self) -> dict[str, Any]:
        return self.state.detector_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state.restore_detectors(state)


class _Sampling:
    """The sampling schedule's memory: whether the step after an event runs the heavy probes,
    and the interval in force (the rest follows from the step and the configuration)."""

    def __init__(self, state: RunState) -> None:
        self.state = state

    def state_dict(self) -> dict[str, Any]:
        # between steps the next step's sampling is already decided (`sampled_now`): a resumed
        # job must sample it too, whether by the schedule or after an event; and it goes on at
        # the interval in force (a checkpoint from before the budget: the shortest)
        return {"sample_next": self.state.sample_next or self.state.sampled_now,
                "multiple": self.state.cadence.multiple}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state.sample_next = bool(state.get("sample_next", False))
        self.state.cadence.load(state.get("multiple", 1))
