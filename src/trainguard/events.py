"""What the Guard tells its users: events (something happened) and step reports (what it did)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from trainguard.vocabulary import Action as Action  # re-exported: events.Action stays valid

if TYPE_CHECKING:
    from trainguard.signals import StepSignals

Severity = Literal["info", "warning", "error", "critical"]
SEVERITY_RANK: dict[str, int] = {"info": 0, "warning": 1, "error": 2, "critical": 3}



def at_least(severity: str, threshold: str) -> bool:
    """True when `severity` is as bad as `threshold` or worse."""
    return SEVERITY_RANK[severity] >= SEVERITY_RANK[threshold]


NO_TROUBLE_TO_COME_BACK_FROM = frozenset({"no_progress", "lr_at_zero", "model_in_eval_mode"})
"""Warnings that mark no trouble a loss comes back from: `no_progress` says the loss is not
coming down, `lr_at_zero` that nothing trains, which the verdict judges apart (`stalled`), and
`model_in_eval_mode` how the model trains from then on; a run that learned on after it did not
`recover` from anything."""


def marks_trouble(event: Event) -> bool:
    """Whether the run verdict counts `event`'s step as trouble (a warning or worse that a loss
    can come back from)."""
    return (at_least(event.severity, "warning")
            and event.kind not in NO_TROUBLE_TO_COME_BACK_FROM)


@dataclass(slots=True)
class Event:
    """One finding at one step. `kind` is a stable code (for example `nonfinite_grad`)."""

    kind: str
    step: int
    severity: Severity
    message: str
    param: str | None = None
    """Qualified name of the parameter (or module) the event is about, when there is one."""
    value: float | None = None
    """The measured value that triggered the event (a norm, a loss, a ratio)."""
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "step": self.step, "severity": self.severity,
                "message": self.message, "param": self.param, "value": self.value,
                "details": self.details}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Event:
        return cls(kind=data["kind"], step=int(data["step"]), severity=data["severity"],
                   message=data["message"], param=data.get("param"), value=data.get("value"),
                   details=dict(data.get("details") or {}))

    def __str__(self) -> str:
        return f"[step {self.step}] {self.severity.upper()} {self.kind}: {self.message}"


@dataclass(slots=True)
class StepReport:
    """What happened at one optimizer step."""

    step: int
    loss: float | None
    grad_norm: float
    """Global gradient norm before clipping (NaN or inf when gradients were non-finite)."""
    action: Action
    events: list[Event] = field(default_factory=list)
    lr: float | None = None
    loss_scale: float | None = None
    clip_coef: float = 1.0
    """The factor gradients were multiplied by (1.0 when not clipped)."""
    sampled: bool = False
    """Whether the heavy probes ran on this step."""
    loss_curvature: float | None = None
    """The smoothed second difference of the log loss at this step (None early on)."""
    signals: StepSignals | None = field(default=None, repr=False, compare=False)
    """The host measurements behind the report (per-parameter gradient norms, sampled
    statistics that arrived with this step), for sinks that record more than the scalars."""

    @property
    def skipped(self) -> bool:
        return self.action == "skipped"


ActionKind = Literal["skip", "clip", "rollback", "lr_change", "halt", "snapshot", "clip_takeover",
                     "watch", "checkpoint_kept", "report_to", "kl_penalty"]


@dataclass(frozen=True, slots=True)
class ActionRecord:
    """Something trainguard did to the run (as opposed to something it saw)."""

    kind: ActionKind
    step: int
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "step": self.step, "message": self.message,
                "details": self.details}


@dataclass(frozen=True, slots=True)
class RunInfo:
    """What a sink hears when a run starts."""

    run_dir: str | None
    config: dict[str, Any]
    """`GuardConfig.to_dict()`: plain data."""
    param_names: list[str]
    param_shapes: list[list[int]]
    trainguard_version: str
    integration: str = ""
    """"" for the plain Guard, else the trainer (e.g. "transformers.Trainer")."""
    distributed: dict[str, Any] = field(default_factory=dict)
    """Rank, world size and backend under torch.distributed (empty for one process)."""
    resume: bool = False
    """True when the run continues an earlier one (`Guard(resume=True)`)."""
    preflight: bool = False
    """True when the preflight audit runs before the first step: the first `on_findings` call
    is then its findings (possibly none); every later call comes from a check during the run."""


@dataclass(frozen=True, slots=True)
class RunError:
    """The exception that ended a run (a sink hears it before the run's status): its type's
    name and the first line of its message."""

    type: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "message": self.message}
