"""`StepContext`: what one optimizer step carries from its check to its settling, and the
typed results the stages hand each other.

The stages before the update return what they produce (`measure` a `Measured`, `detect` a
`Detected`, `explain` the ranked causes, `decide` the `Decision`), and `StepPipeline` hands each
result to the stages that read it. The context keeps the caller's inputs (the loss, the batch,
the step index) and what passes from before the update to after it: the measurement, the
step's events and findings, the decision, what `act` did. Only `record` hands what the step
found to the sinks. Events enter through `raise_event` (any stage up to `act` may raise one), and
the decision is set once, by the pipeline, through `decide`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from trainguard.diagnose import Finding
from trainguard.events import Action, ActionRecord, Event, StepReport
from trainguard.pipeline.policy import Decision, applies
from trainguard.pipeline.rewind import ScheduleMark
from trainguard.probes.packing import DevicePack, PendingPack
from trainguard.remedies.limit import ClipLimits
from trainguard.signals import StepSignals

BATCH_KEY = "batch"
"""Name of the batch statistics among the extra tensors of the step's transfer."""
TARGET_KEY = "diffusion_target"
"""Name of the diffusion prediction's errors against each target among the extra tensors."""


@dataclass(slots=True)
class PendingStats:
    """Device-side heavy-probe results of `step`, waiting for the next transfer."""

    step: int
    per_param: dict[str, torch.Tensor] = field(default_factory=dict)
    module_names: list[str] = field(default_factory=list)
    per_module: dict[str, torch.Tensor] = field(default_factory=dict)
    output: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass(slots=True)
class PackedStep:
    """One step's values gathered on the device, before they cross to the host."""

    pack: DevicePack
    loss: torch.Tensor | None
    global_norm: torch.Tensor
    lrs: list[Any]
    pending: list[PendingStats]
    """The heavy-probe results of earlier steps in the pack."""
    extra: list[str]
    """The names of the extra tensors in the pack (`x:<name>`)."""
    grads: list[torch.Tensor] = field(default_factory=list)
    """The present gradients (local shards under FSDP2), for the remedies to scale in place."""
    batch_stats: Any = None
    """The batch's on-device statistics (sampled steps), read back by `detect`."""
    fingerprint: bool = False
    """Under torch.distributed: the step's all-reduce carries the replicas' weight fingerprint."""
    ring_wish: int | None = None
    """Under torch.distributed and `recover`: the good-state interval this rank asks for."""
    attention: list[str] = field(default_factory=list)
    """The attention layers whose largest logits are in the pack (`att:attn_logit_max`)."""
    batch_elements: int | None = None
    """The batch's size in elements, read from its shape at packing (`StepSignals`)."""
    grads_absent: tuple[int, ...] = ()
    """The watched parameters with no gradient tensor at this step (`StepSignals`)."""


@dataclass(frozen=True, slots=True)
class Measured:
    """What `measure` brought to the host, for the stages after it."""

    signals: StepSignals
    grads: list[torch.Tensor] = field(default_factory=list)
    """The present gradients (local shards under FSDP2), for the remedies to scale in place."""
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    """Host copies of the extra tensors that rode along with the step's transfer."""
    batch_stats: Any = None
    """The batch's on-device statistics (sampled steps), read back by `detect`."""
    limits: ClipLimits | None = None
    """The clip limits the run held when the step was measured, before its own events, which
    `decide` reads again (the chain moves only after it); None: `decide` asks the chain."""


@dataclass(frozen=True, slots=True)
class Detected:
    """What `detect` found at a step: its events and findings, and the batch's look."""

    events: list[Event] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    """Findings made at this step (the first loss, the held `warmup` one decided)."""
    fired: bool = False
    """A detector raised an event on this step (the batch is inspected in full, and the next
    step is sampled)."""
    nonfinite_input: bool = False
    """This rank's batch holds NaN/inf (as long as batches do; the event is raised once)."""


@dataclass(frozen=True, slots=True)
class Settled:
    """What `settle` leaves: the step's report, and the heavy-probe results measured after its
    update, for the next step's transfer."""

    report: StepReport
    queued: list[PendingStats] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class TakenOnDevice:
    """The device skipped or clipped the step at `limit` and its optimizer step was taken before
    the host judges it (`measure_on_device`): no state from before its update is left to replay
    on, and the next step's forward pass has run."""

    limit: float | None


@dataclass(slots=True)
class OnDevice:
    """`sync="deferred"` (`pipeline/deferred.py`): what a step's device half leaves for its
    judgement at the next step. Read by the mode's own stages, the run and the Guard only."""

    packed: PackedStep | None = None
    in_flight: PendingPack | None = None
    """The pack and its copy on the way to the host."""
    found_inf: torch.Tensor | None = None
    """1.0 on the device when the update is to be skipped (None under observe without a
    GradScaler: every update goes ahead)."""
    mid_step: bool = True
    """Judged at the next `guard.step` (its gradients made, a GradScaler's unscale done), not
    between two steps (a checkpoint's `flush`, the close)."""
    dropped: bool = False
    """Under `recover`: the step before was rolled back when this one was due, and this step's
    gradients were made on the weights the rollback undid: its update is dropped, nothing
    measured."""
    report: StepReport | None = None
    """A dropped step's own report, which the caller gets after the step before's."""


@dataclass(slots=True)
class StepContext:
    step: int
    """Index of this step (the first is 0)."""
    loss: Any
    """The loss as the caller passed it (a scalar tensor, a number or None)."""
    batch: Any = None
    forward_rng: Any = None
    """The RNG state the step's last training forward started from (`diagnose/step_rng.py`;
    None when not kept): a proof of this step replays its dropout masks."""
    data_ids: Any = None
    metrics: dict[str, float | torch.Tensor] = field(default_factory=dict)
    """The trainer's own training metrics of this step, as the caller handed them: host numbers,
    or one-value tensors that ride the step's transfer (`StepSignals.trainer_metrics`)."""
    sampled: bool = False
    """Whether the heavy probes run on this step (decided before its forward pass)."""
    carried: list[PendingStats] = field(default_factory=list)
    """Heavy-probe results of earlier steps, to ride this step's transfer (`measure` takes
    them; what it did not take goes on to the next step)."""
    premeasured: Measured | None = None
    """The step as the calm lane measured it before finding it was not calm
    (`pipeline/calm.py`): `measure` hands it on (None: `measure` measures)."""
    late: list[Event] = field(default_factory=list)
    """What the detectors raised on the steps the calm lane took since the last full step
    (`pipeline/calm.py`), each with its own step: `detect` adds them to this step's."""

    on_device: OnDevice | None = None
    """`sync="deferred"`: the step's skip and clip were decided on the device, and its summary
    is read on the host at the next step, after its update (None: the step is judged before
    its update). The shared stages read what the mode changes (`taken_on_device`), never
    this."""

    taken_on_device: TakenOnDevice | None = None
    """Set by `measure_on_device`: the update was taken before the step is judged, at the limit
    the device clipped at (None: the step is judged before its update)."""
    new_params: ActionRecord | None = None
    """The parameters the optimizer gained at this step (now watched), for the sinks."""

    # what passes from the check to the settling
    measured: Measured | None = None
    """What `measure` brought to the host (settle reads its signals and extras)."""
    events: list[Event] = field(default_factory=list)
    """The step's events: `detect`'s, then the decision's and what `act` raised."""
    findings: list[Finding] = field(default_factory=list)
    """Findings made at this step, for the sinks."""
    fired: bool = False
    """A detector raised an event on this step (its post-update probes are measured)."""
    decision: Decision | None = None
    outcome: Action | None = None
    """What `act` carried out: the decision's action, or `halted` when a rollback failed."""
    actions: list[ActionRecord] = field(default_factory=list)
    snapshot_path: str | None = None
    schedule_mark: ScheduleMark | None = None
    """Where a trainer's schedulers were before it stepped them past this skipped update
    (`pipeline/rewind.py`); `settle` puts them back."""
    unguarded: BaseException | None = None
    """Set when trainguard itself failed on this step: it was applied unguarded."""

    def raise_event(self, event: Event) -> None:
        self.events.append(event)

    @property
    def signals(self) -> StepSignals | None:
        """The step's signals, once measured."""
        return None if self.measured is None else self.measured.signals

    def detected(self, found: Detected) -> None:
        """Take in what `detect` found (the pipeline calls this)."""
        self.events.extend(found.events)
        self.findings.extend(found.findings)
        self.fired = found.fired

    def decide(self, decision: Decision) -> None:
        """Set the step's decision; only the pipeline calls this, once, with `decide`'s."""
        if self.decision is not None:
            raise RuntimeError(f"step {self.step} was already decided ({self.decision.action})")
        self.decision = decision
        self.outcome = decision.action
        for event in decision.events:
            self.raise_event(event)

    def act(self, kind: Any, message: str, **details: Any) -> None:
        """Note something trainguard did to the run (sinks hear it at `record`)."""
        self.actions.append(ActionRecord(kind=kind, step=self.step, message=message,
                                         details=details))

    @property
    def applied(self) -> bool:
        """Whether the optimizer step really applies this step's update."""
        return applies(self.outcome)
