"""Typed, validated configuration for the Guard and its detectors.

A `GuardConfig` holds the policy, the sync mode and sections, each a small dataclass: `clip`,
`probes`, `prove`, `detectors`, `recovery`, `distributed`, `checkpoints`, `sinks`. The detectors'
section is a container of one section per detector, named by the kind of event it raises
(`detect/settings.py`), and `common`, the settings they share. Every
threshold lives in one of them with its default and the reason for it, so that one default
configuration serves every run and nothing is a magic number inside a detector.

A section may be given as its type or as a dict (`GuardConfig(clip={"max_grad_norm": 1.0})`); a
bad value is named by its dotted field (`clip.max_grad_norm`). The flat field names of the version
before the sections are still accepted, with a DeprecationWarning, for one release.

A configuration is plain data: clipping rules are held as specs, never as live rules (whose
state belongs to the run), so `GuardConfig.from_dict(config.to_dict()) == config` and
`to_dict()` is JSON-serialisable.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from trainguard import sections
from trainguard.detect.settings import DETECTOR_FLAT_NAMES as DETECTOR_FLAT_NAMES
from trainguard.detect.settings import DetectorConfig
from trainguard.errors import ConfigError

if TYPE_CHECKING:
    from trainguard.remedies import AGC, ClipRule

Policy = Literal["observe", "protect", "halt", "recover"]
POLICIES: tuple[str, ...] = ("observe", "protect", "halt", "recover")
Sync = Literal["blocking", "deferred"]
SYNCS: tuple[str, ...] = ("blocking", "deferred")
SEVERITIES: tuple[str, ...] = ("info", "warning", "error", "critical")
PROVE_MODES: tuple[str, ...] = ("auto", "on", "off")

GUARD_FLAT_NAMES: dict[str, tuple[str, str]] = {
    "max_grad_norm": ("clip", "max_grad_norm"),
    "clip_rule": ("clip", "rule"),
    "agc": ("clip", "agc"),
    "auto_clip_ratio": ("clip", "auto_ratio"),
    "auto_clip_zscore": ("clip", "auto_zscore"),
    "auto_clip_warmup_ratio": ("clip", "auto_warmup_ratio"),
    "auto_clip_alarm_steps": ("clip", "auto_alarm_steps"),
    "sample_every": ("probes", "sample_every"),
    "sample_all_steps": ("probes", "sample_all_steps"),
    "inspect_batches": ("probes", "inspect_batches"),
    "batch_size": ("probes", "batch_size"),
    "preflight": ("probes", "preflight"),
    "activation_probe": ("probes", "activations"),
    "output_probe": ("probes", "outputs"),
    "num_classes": ("probes", "num_classes"),
    "prove": ("prove", "mode"),
    "prove_budget_steps": ("prove", "budget_steps"),
    "halt_severity": ("recovery", "halt_severity"),
    "max_consecutive_skips": ("recovery", "max_consecutive_skips"),
    "snapshot_dir": ("checkpoints", "snapshot_dir"),
    "block_poisoned_checkpoints": ("checkpoints", "block_poisoned"),
    "console": ("sinks", "console"),
    "store": ("sinks", "store"),
    "rank_timeout_s": ("distributed", "rank_timeout_s"),
    "collective_timeout_s": ("distributed", "collective_timeout_s"),
    "desync_every": ("distributed", "desync_every"),
}
"""Where each flat `GuardConfig` field of the version before the sections now lives (`prove`
given as a string is its mode)."""


@dataclass(kw_only=True, slots=True)
class RecoveryConfig:
    """What the Guard does when clipping is not enough: when `halt` stops the run, when
    `protect` gives up skipping, and how `recover` brings a broken run back (the guide's §6
    rescue, automated)."""

    PATH: ClassVar[str] = "recovery"

    halt_severity: str = "error"
    """Under `halt`, the least severe event that stops the run."""
    max_consecutive_skips: int = 25
    """Under `protect`, this many consecutive skipped steps mean the run cannot heal by skipping:
    the Guard halts with a snapshot instead of skipping forever."""

    ring_size: int = 3
    """How many verified-good training states are kept (model, optimizer, scheduler, scaler,
    guard baselines; the RNG states with `restore_rng`), oldest dropped first."""
    ring_every: int = 50
    """The longest interval between good-state candidates (one is also taken before the first
    step). The interval in force is the shortest of 5, 10, 25 and this one at which a capture
    costs at most `ring_budget` of the measured step time (`recovery/cadence.py`)."""
    ring_budget: float | None = 0.02
    """The share of step time the good-state captures may cost: they are taken as often as this
    allows (every 5 steps when a capture is cheap against a step, and in the first `ring_every`
    steps; up to `ring_every`). None: a fixed cadence, every `ring_every` steps, whose rollback
    targets do not depend on the machine's timings."""
    confirm_steps: int = 5
    """A candidate becomes "good" only after this many following steps without an event or a
    skip, and only if its weights and optimizer moments are all finite."""
    settle_steps: int = 10
    """After a loss spike or gradient explosion (whose update is skipped), the loss has this many
    steps to come back near its level from before; otherwise the run is rolled back."""
    settle_ratio: float = 1.5
    """"Back near its level": the median of the last few losses at most this many times the
    median from before the trouble."""
    rollback_after_skips: int = 3
    """This many consecutive non-finite steps mean the state itself is broken: roll back."""
    lr_backoff: float = 0.1
    """On a rollback the learning rate is multiplied by this (the guide: divide it by 10)..."""
    lr_ramp_steps: int = 100
    """...and ramped back linearly over this many steps towards the schedule, never above the
    ceiling (`lr_ceiling`)."""
    lr_ceiling: float = 0.5
    """After a rollback the learning rate never climbs back above this share of the LR in force
    when the trouble began: that LR may be what broke the run, and a ramp back to it would replay
    the same failure. A further rollback lowers the ceiling by `lr_backoff` (of the lower of the
    ceiling and the LR in force when its trouble began), since a fault that comes back is a
    learning rate that is too high, not a bad batch. The ceiling is an LR value, so a schedule
    that comes back down from a spike is not held back by it."""
    max_grad_norm: float = 0.5
    """After a rollback, global clipping is tightened to this limit (the guide's 0.5)."""
    jump_ratio: float = 10.0
    """A loop that raises the LR this many times in one step (an `lr_change` event)..."""
    jump_steps: int = 5
    """...and trouble within this many steps after it (a loss spike, a gradient explosion, a
    non-finite step, an instability warning): the update at the raised LR did the damage, and
    skipping while the loss settles only lets it compound, so the run is rolled back at once to
    a state from before the raise. 0: trouble after a raise is judged as any other."""
    rewind_schedule: bool = False
    """Whether a rollback also puts the LR scheduler back. By default the schedule goes on from
    where it is, as the data does (the batches since the restored state are not replayed), so a
    spike that lives in the schedule itself is not met again; True makes a rollback an exact
    restore (`guard.rollback` with `lr_backoff=1.0`, `lr_ceiling=1.0` and `restore_rng=True`
    then reproduces the run bit for bit)."""
    max_rollbacks: int = 3
    """A run that needs more rollbacks than this halts with a crash snapshot and a diagnosis."""
    restore_rng: bool = False
    """Whether a rollback also puts back the process-wide random number generators (torch, CUDA,
    Python, NumPy) as they were in the restored state. They are shared by everything in the
    process (another model and its Guard, the data pipeline), which a rollback of this run must
    not rewind; and the data is not replayed either. True (with `rewind_schedule` and no backoff)
    makes a rollback an exact restore. Crash snapshots record the RNG states either way."""

    def __post_init__(self) -> None:
        sections.require(self.halt_severity in SEVERITIES, "recovery.halt_severity",
                         f"unknown severity {self.halt_severity!r}; choose one of "
                         f"{', '.join(SEVERITIES)}")
        sections.at_least(self, 1, "max_consecutive_skips", "ring_size", "ring_every",
                          "settle_steps", "rollback_after_skips")
        sections.at_least(self, 0, "confirm_steps", "lr_ramp_steps", "max_rollbacks",
                          "jump_steps")
        sections.flag(self, "rewind_schedule", "restore_rng")
        sections.positive(self, "max_grad_norm")
        if self.ring_budget is not None:
            sections.positive(self, "ring_budget")
        sections.above_one(self, "settle_ratio", "jump_ratio")
        sections.share(self, "lr_backoff", "lr_ceiling")


@dataclass(kw_only=True, slots=True)
class ClipConfig:
    """Gradient clipping: the global limit, rules beyond it, the adaptive clip's knobs."""

    PATH: ClassVar[str] = "clip"

    max_grad_norm: float | Literal["auto"] | None = "auto"
    """Global gradient-norm clipping. `"auto"` (the default): under protect, recover and halt a
    step is clipped only when its norm is abnormal for this run (`remedies.RobustClipLimit`: at
    the run's typical norm for `auto_alarm_steps` steps after an explosion or a spike, otherwise
    only beyond a loose backstop, never above `detectors.grad_explosion.abs_threshold`), so
    healthy steps are never touched; under observe nothing is clipped. A number: a fixed limit,
    honoured exactly under every policy (the guide's max_norm=1.0 is `1.0`). None: no clipping."""
    rule: Mapping[str, Any] | ClipRule | None = None
    """An extra clipping rule from `trainguard.remedies` (LayerwiseClip, AdaptiveClip, a chain),
    applied after the global clip to the norms the Guard already measured. Given as a rule or
    its spec dict; kept as the spec (`rule_spec`): the Guard builds its own fresh rule from it,
    whose statistics are the run's state (`guard.state_dict()`)."""
    agc: Mapping[str, Any] | AGC | None = None
    """Adaptive gradient clipping relative to weight norms (`trainguard.remedies.AGC`), applied
    last, on the device. Given as an AGC or its spec dict; kept as the spec (`agc_spec`)."""
    auto_ratio: float = 20.0
    """Under `max_grad_norm="auto"`, once warm: a step is clipped above this many times the
    run's typical norm (loose on purpose: healthy fine-tunes have single steps at 10x their
    median)..."""
    auto_zscore: float = 6.0
    """...and at least this many robust standard deviations (in log space) above it."""
    auto_warmup_ratio: float = 10.0
    """While the first `detectors.common.warmup_steps` norms come in: clipped above this many
    times the median of the norms so far (looser, since a fine-tune's first norms still climb)."""
    auto_alarm_steps: int = 20
    """After a gradient explosion, loss spike or divergence event, this many steps (that one
    included) are clipped at the run's typical norm."""

    def __post_init__(self) -> None:
        if self.max_grad_norm is not None and self.max_grad_norm != "auto":
            sections.require(isinstance(self.max_grad_norm, (int, float)), "clip.max_grad_norm",
                             f"must be a number > 0, 'auto' or None, got "
                             f"{self.max_grad_norm!r}")
            sections.positive(self, "max_grad_norm")
        sections.positive(self, "auto_zscore")
        # a limit below the typical norm would clip healthy steps
        for name in ("auto_ratio", "auto_warmup_ratio"):
            value = getattr(self, name)
            sections.positive(self, name)
            sections.require(value >= 1, f"clip.{name}", f"must be >= 1, got {value!r}")
        sections.at_least(self, 1, "auto_alarm_steps")
        if self.rule is not None:
            from trainguard.remedies import rule_spec

            self.rule = rule_spec(self.rule, where="clip.rule")
        if self.agc is not None:
            from trainguard.remedies import agc_spec

            self.agc = agc_spec(self.agc, where="clip.agc")

    @property
    def fixed(self) -> float | None:
        """The fixed global limit the user set (None under "auto" or with no clipping)."""
        value = self.max_grad_norm
        return None if value is None or value == "auto" else float(value)


@dataclass(kw_only=True, slots=True)
class ProbesConfig:
    """What the Guard measures beyond the step's loss and gradients, and the checks it makes."""

    PATH: ClassVar[str] = "probes"

    sample_every: int = 50
    """Heavy probes (weights, update ratio, activations, optimizer state) run every this many
    steps (or a multiple of it, under `sample_budget`), and on the step after any event."""
    sample_budget: float | None = 0.01
    """The share of the run's time the heavy probes may cost: on steps so short that sampling
    every `sample_every` steps costs more, they run every 2, 4 or 8 times `sample_every` steps
    instead (after a run's first 500 steps, or its first 10 samples; `probes/sample_cadence.py`).
    None (and every run under torch.distributed): every `sample_every` steps exactly, whatever
    the timings."""
    sample_all_steps: bool = False
    """Run the heavy probes on every step (for debugging; costs more)."""
    inspect_batches: bool = True
    """Inspect the batch given to `guard.step` on the first step, on sampled steps and on any
    step with an event (range, non-finite values, token ids, masks, outliers)."""
    batch_size: int | None = None
    """The configured batch size. Batches smaller than it for two steps in a row are reported
    (silent truncation, §3.4.2); None takes the first batch's size as the reference."""
    preflight: bool = True
    """Audit the model, optimizer and scheduler when the Guard starts (trainguard.preflight)."""
    activations: bool = True
    """Attach forward hooks on sampled steps: activation range, sparsity and non-finite share."""
    outputs: bool = True
    """Watch the model's output on sampled steps: predicted classes and their spread, the
    output's scale (`output_collapse`)."""
    num_classes: int | None = None
    """Classes of the task, for judging evaluation accuracy against chance (`metric_collapse`);
    None: inferred from the width of the model's class scores."""
    samples_every: int = 50
    """With a `sample_fn` given to the Guard: make and judge samples after every this many steps
    at most (`probes/samples.py`)..."""
    samples_budget: float = 0.02
    """...and further apart when one call costs more than this share of the training time
    between two calls."""

    def __post_init__(self) -> None:
        sections.at_least(self, 1, "sample_every", "samples_every")
        sections.share(self, "samples_budget")
        if self.sample_budget is not None:
            sections.share(self, "sample_budget")
        sections.flag(self, "sample_all_steps", "inspect_batches", "preflight", "activations",
                      "outputs")
        if self.batch_size is not None:
            sections.at_least(self, 1, "batch_size")
        if self.num_classes is not None:
            sections.at_least(self, 2, "num_classes")


@dataclass(kw_only=True, slots=True)
class ProveConfig:
    """Proving causes: a bad step replayed under each candidate fix (needs the Guard's
    `replay_fn`)."""

    PATH: ClassVar[str] = "prove"

    mode: Literal["auto", "on", "off"] = "auto"
    """`auto`: at the step that halts (under `halt`; also from the state before the loop's last
    LR jump of 10x or more, a copy the run keeps then) and at the first rollback (under
    `recover`). `on`: also at the first steps with an error-level event or a loss or gradient
    jump, and at the first warning before any bad step (`instability_precursor`, `bad_start`),
    under every policy (the state is put back exactly; without a recover ring the run keeps two
    good states in host memory to replay from). `off`: never. Healthy steps never pay for a
    replay."""
    budget_steps: float = 20.0
    """A proof stops trying interventions after about this many training steps' time."""

    def __post_init__(self) -> None:
        sections.require(self.mode in PROVE_MODES, "prove.mode",
                         f"must be 'auto', 'on' or 'off', got {self.mode!r}")
        sections.positive(self, "budget_steps")


@dataclass(kw_only=True, slots=True)
class DistributedConfig:
    """Under torch.distributed: the start's wait, trainguard's own collectives, the desync
    check."""

    PATH: ClassVar[str] = "distributed"

    rank_timeout_s: float = 60.0
    """How long a rank waits at the start for every other rank to start trainguard with the same
    configuration before it stops with a message naming the rank missing (a rank without
    trainguard would otherwise make the others hang in its collectives)."""
    collective_timeout_s: float = 300.0
    """With gloo, how long one of trainguard's own collectives waits for the other ranks before
    the run stops with `PeerLost` (they run on a process group of trainguard's own with this
    timeout, so a rank that hangs does not hold the others for the default group's 30 minutes).
    Keep it above the longest time one rank may legitimately spend outside its steps while the
    others wait (an evaluation or a checkpoint on one rank only). Under NCCL trainguard uses the
    default group, and its timeout and NCCL's watchdog apply."""
    desync_every: int = 5
    """Every this many steps a fingerprint of each rank's replicated weights (one fused norm
    pass) rides the step's all-reduce (the guide's §3.4.1 desync check); when the ranks'
    fingerprints part, a second check names the parameters that drifted."""

    def __post_init__(self) -> None:
        sections.positive(self, "rank_timeout_s", "collective_timeout_s")
        sections.at_least(self, 1, "desync_every")


@dataclass(kw_only=True, slots=True)
class CheckpointsConfig:
    """Crash snapshots and checkpoints saved with non-finite state."""

    PATH: ClassVar[str] = "checkpoints"

    snapshot_dir: str | os.PathLike[str] | None = None
    """Where `halt` writes crash snapshots; defaults to the run_dir (or ./trainguard_snapshots).
    A path object is kept as its string."""
    block_poisoned: bool | None = None
    """A checkpoint saved with non-finite weights or optimizer moments is always marked
    `poisoned` in its `trainguard.json` sidecar, with a warning naming it. True: it is also
    renamed `<name>.poisoned`, so that a trainer's resume logic (`get_last_checkpoint`,
    `ckpt_path="last"`) never picks it. None (the default): True under `recover`, False under
    the other policies."""

    def __post_init__(self) -> None:
        if self.block_poisoned is not None:
            sections.flag(self, "block_poisoned")
        if self.snapshot_dir is not None:
            sections.require(isinstance(self.snapshot_dir, (str, os.PathLike)),
                             "checkpoints.snapshot_dir",
                             f"must be a path, got {self.snapshot_dir!r}")
            self.snapshot_dir = os.fspath(self.snapshot_dir)


@dataclass(kw_only=True, slots=True)
class SinksConfig:
    """Where the run's events go besides the sinks passed to the Guard."""

    PATH: ClassVar[str] = "sinks"

    console: bool = True
    """Print events as they happen (through the `trainguard` logger and stderr)."""
    store: bool = True
    """Write the embedded run store when a run_dir is given."""
    trackers: bool = True
    """Report to the experiment trackers the run already reports to (an active W&B or MLflow
    run, a trainer's `report_to` or loggers naming them: `sinks/trackers.py`), said once."""

    def __post_init__(self) -> None:
        sections.flag(self, "console", "store", "trackers")


@sections.accept_flat_names(GUARD_FLAT_NAMES)
@dataclass(kw_only=True, slots=True)
class GuardConfig:
    """How the Guard watches and protects a run.

    Every field is a keyword with a default. Two are plain values: `policy` and `sync`. The
    rest are sections, each given as its type or as a dict of its fields:

    - `clip` (`ClipConfig`): the global limit (`max_grad_norm`, "auto" by default), a clip rule,
      AGC, the adaptive clip's knobs;
    - `probes` (`ProbesConfig`): the heavy probes' cadence (`sample_every`), batch inspection,
      preflight, activation and output probes;
    - `prove` (`ProveConfig`): when a bad step is replayed to prove its causes;
    - `detectors` (`DetectorConfig`): one section per detector, and `common`, whose baseline
      window, warm-up and noise floor the adaptive clip shares;
    - `recovery` (`RecoveryConfig`): halting, giving up skipping, the `recover` policy;
    - `distributed` (`DistributedConfig`): torch.distributed's timeouts and desync check;
    - `checkpoints` (`CheckpointsConfig`): crash snapshots, poisoned checkpoints;
    - `sinks` (`SinksConfig`): the console and the run store.
    """

    policy: Policy = "protect"
    """`observe`: record and warn only. `protect`: clip, and skip steps whose loss or gradients
    are non-finite without touching optimizer state. `halt`: on an event of
    `recovery.halt_severity` or worse, write a crash snapshot and raise `TrainingDiverged`.
    `recover`: as protect, and roll back to the last good state (LR backed off, clipping
    tightened) when skipping does not heal the run; see `RecoveryConfig`."""
    sync: Sync = "blocking"
    """`blocking`: every step's summary is read on the host before its update is decided (one
    host sync per step on an accelerator). `deferred`: the step's skip (non-finite loss or
    gradients) and global clip are decided on the device, through `found_inf` for PyTorch's fused
    Adam, AdamW and SGD, and its summary crosses to the host without a wait, to be judged at the
    next step: detectors, events, sinks and halts run one step late. Taken by the plain-loop
    `Guard` with a fused optimizer (a GradScaler alongside), no clip rule or AGC, under any
    policy (a `recover` rollback judged late also drops the next step's update), and under
    torch.distributed when the collectives run on the model's device; otherwise the run says why
    once and runs blocking. docs/deferred.md says what one step late changes."""
    clip: ClipConfig = field(default_factory=ClipConfig)
    """Gradient clipping."""
    probes: ProbesConfig = field(default_factory=ProbesConfig)
    """What is measured beyond the loss and gradients, and the checks made."""
    prove: ProveConfig = field(default_factory=ProveConfig)
    """When causes are proved by replay."""
    detectors: DetectorConfig = field(default_factory=DetectorConfig)
    """The built-in detectors' settings."""
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    """Halting, skipping, and the `recover` policy (its good-state ring is kept only under
    `recover`)."""
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    """torch.distributed."""
    checkpoints: CheckpointsConfig = field(default_factory=CheckpointsConfig)
    """Crash snapshots and poisoned checkpoints."""
    sinks: SinksConfig = field(default_factory=SinksConfig)
    """The console and the run store."""

    def __post_init__(self) -> None:
        sections.require(self.policy in POLICIES, "policy",
                         f"unknown policy {self.policy!r}; choose one of {', '.join(POLICIES)}")
        sections.require(self.sync in SYNCS, "sync",
                         f"unknown sync {self.sync!r}; choose one of {', '.join(SYNCS)}")
        sections.build_sections(self)

    @property
    def adaptive_clip(self) -> bool:
        """Whether the adaptive default clip is in force (`clip.max_grad_norm="auto"`, a policy
        that protects)."""
        return self.clip.max_grad_norm == "auto" and self.policy != "observe"

    @property
    def blocks_poisoned_checkpoints(self) -> bool:
        """Whether a poisoned checkpoint is renamed `<name>.poisoned`
        (`checkpoints.block_poisoned`, by default only under `recover`)."""
        if self.checkpoints.block_poisoned is None:
            return self.policy == "recover"
        return self.checkpoints.block_poisoned

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-serialisable data (nested dicts, rules as their specs), a copy."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GuardConfig:
        """The config `to_dict` gave, or one an older version stored in the flat shape (read
        without a warning: the store is not the user's code). Fields left out take their
        defaults; unknown fields, at any level, are a ConfigError naming them. A config stored
        by an older version described its clip rule or AGC in words (a string): such a rule
        cannot be rebuilt and is dropped."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"GuardConfig: expected a dict of fields, got "
                              f"{type(data).__name__}")
        fields = {f.name for f in dataclasses.fields(cls)}
        data = {k: v for k, v in data.items()
                if not (k in ("clip_rule", "agc") and isinstance(v, str))}
        data = sections.move_flat_names(data, GUARD_FLAT_NAMES, fields)
        detectors = data.get("detectors")
        if isinstance(detectors, Mapping):
            data["detectors"] = DetectorConfig.from_dict(detectors)
        clip = data.get("clip")
        if isinstance(clip, Mapping):
            data["clip"] = {k: v for k, v in clip.items()
                            if not (k in ("rule", "agc") and isinstance(v, str))}
        unknown = sorted(str(k) for k in set(data) - fields)
        if unknown:
            raise ConfigError(f"GuardConfig: unknown field(s) {', '.join(unknown)}")
        return cls(**data)
