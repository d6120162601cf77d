"""Typed, validated configuration for the Guard and its detectors.

Every threshold a detector uses lives here with its default and the reason for it, so that one
default configuration serves every run and nothing is a magic number inside a detector.

A configuration is plain data: clipping rules are held as specs, never as live rules (whose
state belongs to the run), so `GuardConfig.from_dict(config.to_dict()) == config` and
`to_dict()` is JSON-serialisable.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from trainguard.errors import ConfigError

if TYPE_CHECKING:
    from trainguard.remedies import AGC, ClipRule

Policy = Literal["observe", "protect", "halt", "recover"]
POLICIES: tuple[str, ...] = ("observe", "protect", "halt", "recover")
Sync = Literal["blocking", "deferred"]
SYNCS: tuple[str, ...] = ("blocking", "deferred")
SEVERITIES: tuple[str, ...] = ("info", "warning", "error", "critical")


def _require(condition: bool, field_name: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{field_name}: {message}")


def _positive(value: float, name: str) -> None:
    _require(isinstance(value, (int, float)) and not isinstance(value, bool)
             and math.isfinite(value) and value > 0, name,
             f"must be a finite number > 0, got {value!r}")


def _flag(value: bool, name: str) -> None:
    # a hand-edited "false" would otherwise be truthy
    _require(isinstance(value, bool), name, f"must be True or False, got {value!r}")


def _section(cls: type, value: Any, name: str) -> Any:
    """A nested config given as a dict (e.g. from `to_dict`) built with its unknown keys named."""
    if not isinstance(value, Mapping):
        return value
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(str(k) for k in set(value) - known)
    if unknown:
        raise ConfigError(f"{name}: unknown field(s) {', '.join(unknown)}")
    return cls(**value)


def _at_least(value: int, minimum: int, name: str) -> None:
    _require(isinstance(value, int) and not isinstance(value, bool) and value >= minimum, name,
             f"must be an integer >= {minimum}, got {value!r}")


@dataclass(kw_only=True, slots=True)
class DetectorConfig:
    """Thresholds of the built-in detectors. Defaults are meant to stay silent on healthy runs."""

    grad_norm_abs_threshold: float = 1000.0
    """The guide's rule of thumb (§2.1): a pre-clip global gradient norm above this explodes."""
    grad_norm_ratio: float = 10.0
    """Adaptive rule: a norm this many times the run's robust baseline (median of recent steps)."""
    grad_norm_error_ratio: float = 100.0
    """An adaptive explosion this many times the baseline is reported as an error, not a warning."""
    grad_norm_abs_min_ratio: float = 2.0
    """Once the baseline is warm, the absolute rule also needs the norm to be this many times the
    run's typical norm (and outside its noise), so a run whose normal norm is near 1000 is not
    flagged by noise."""
    grad_norm_zscore: float = 6.0
    """...and also this many robust standard deviations above it in log space (noise guard)."""

    loss_spike_ratio: float = 2.5
    """A loss this many times the recent median is a spike. Below 3 so that a 3x jump (§2.2) is
    caught even on a falling curve, where the median trails the newest losses."""
    loss_spike_level_window: int = 10
    """The spike baseline is the median of this many most recent steps (short, so it follows a
    falling curve); the noise scale comes from the longer `baseline_window`."""
    loss_spike_zscore: float = 6.0
    """...and also this many robust standard deviations above it in log space (noise guard)."""
    loss_spike_early_ratio: float = 5.0
    """Before the baseline is warm, a jump of this many times the first losses is a spike."""
    loss_spike_error_ratio: float = 100.0
    """A spike this many times the baseline (2.3 -> 1e8 is 4e7x) is an error, not a warning."""

    bad_start_ratio: float = 10.0
    """The first loss this many times the level the run settles at by step `warmup_steps` is a
    bad start (a new layer initialised far too large)..."""
    bad_start_blowup_ratio: float = 2.0
    """...and a level this many times the first loss is one too (the first updates blew the
    model up: an LR too high for the start)."""

    first_update_ratio: float = 0.15
    """The first update measured moving the typical weight (the median over weights of 1024
    elements or more) by this share of its norm, ||dW|| / ||W||, is too large
    (`update_too_large`): a healthy fine-tuning step moves a weight by 0.1-1%, a layer trained
    from scratch a few percent on its first steps."""

    loss_resolution: float = 1e-7
    """The smallest rise of the loss that is not float noise, as a fraction of the level the run
    started at (the median of its first `warmup_steps` losses): about float32's relative
    resolution (1.2e-7). A regression that converged to 1e-14 wobbles by 1e-13, rises of 10x that
    are only rounding; `loss_spike` and `loss_divergence` ignore rises smaller than this."""

    divergence_ratio: float = 1.5
    """Sustained divergence: the smoothed loss stays this many times above its best value..."""
    divergence_patience: int = 10
    """...for this many consecutive steps."""
    divergence_span: int = 50
    """Span (in steps) of the exponential moving average that smooths the loss for divergence."""
    divergence_window: int = 10
    """Losses whose median is the current level (one outlier batch cannot move a median of 10;
    a climbing loss moves it within 5 steps)."""
    divergence_zscore: float = 2.5
    """The current level must also be this many robust standard deviations of the run's recent
    log losses above the best: the best is the minimum of a smoothed level, which sits below the
    typical level by about half a deviation on a flat noisy run."""

    extreme_weight_abs: float = 1e6
    """A weight with |w| above this is extreme (§2.1)."""

    fp16_limit_fraction: float = 0.5
    """Activations or fp16 gradients above this share of the float16 maximum (65504) are at risk."""
    min_loss_scale: float = 1.0
    """An AMP loss scale below this has collapsed: the model overflows float16 even unscaled."""
    overflow_skips: int = 5
    """This many GradScaler overflow skips within `overflow_window` steps is bad, counted after the
    scaler's calibration (the skips of its first steps while the scale fell) and after the first
    `overflow_window` steps."""
    overflow_window: int = 50
    """Window, in steps, for counting GradScaler overflow skips."""

    lr_jump_ratio: float = 3.0
    """A group's LR this many times above the highest it ever used, in one step, is a change made
    by code (`lr_change`); schedules climb by smaller steps (a linear warmup's second step is 2x
    its first, later ones less) and restarts return to levels already used."""
    transient_horizon: int = 500
    """Steps a one-step jump that was back to normal at the next step (a heavy-tailed batch) is
    remembered by the spike and explosion detectors."""
    transient_margin: float = 3.0
    """Once a run has shown such jumps, a new one must be this many times beyond the largest of
    them to count: heavy-tailed data keeps producing jumps of about the same size, a fault goes
    further."""
    dead_unit_share: float = 0.95
    """A module whose units are zero for every sample of a batch in at least this share is dead
    (`dead_units`); a healthy ReLU layer has almost none such."""
    collapse_spread: float = 1e-3
    """A module or output whose values vary across the batch by less than this share of their
    magnitude gives every sample the same output."""
    collapse_mode_share: float = 0.98
    """Predictions of which at least this share are one class are a collapsed classifier, when
    they were spread before (`output_collapse`)."""
    output_std_ratio: float = 10.0
    """A continuous output whose spread falls below 1/x or rises above x times its early level
    has collapsed or exploded (a denoiser's predicted noise)."""
    eval_patience: int = 3
    """Evaluations in a row that an eval loss rises while the train loss falls, before
    `metric_collapse` says so."""
    no_gradient_steps: int = 3
    """Optimizer steps in a row without any gradient (None or zero) before `no_gradients` fires:
    one such step happens legitimately (a batch that touches no trainable weight), three in a
    row mean nothing is training."""
    frozen_steps: int = 10
    """A parameter whose gradient was zero (or absent) this many steps in a row and then is not
    is reported by `params_unfrozen` (a layer unfrozen, a branch now used); a parameter used on
    every other batch is not."""
    stall_steps: int = 100
    """Optimizer steps at a working LR after which a loss that has not come down is a stall
    (`no_progress`, and the verdict `stalled`)."""

    precursor_probe: bool = True
    """Measure Adam's ratio sqrt(sum g^2 / sum v_hat) per parameter every step (the
    `adam_ratio_rms` of `probes/adam_ratio.py`: the step's gradient norms and sum v, carried by
    Adam's recursion and summed over `exp_avg_sq` every 16 steps, about 0.08% of a GPT-2 step
    on a CPU) for `instability_precursor`, which needs every step (a streak against a 50-step
    median). Reads 0 for a non-Adam optimizer; left out under torch.distributed. False turns
    the probe and the warning off."""
    precursor_ratio: float = 2.0
    """`instability_precursor`: a parameter's Adam ratio this many times its own median of the
    last `baseline_window` steps (tuned on seeds 0-2 of the scenario suite's precursor family
    and its other healthy scenarios: a healthy twin, an LR rising 3% a step to 10x, reached 1.8
    two steps in a row; 1.7 with a z-score of 2 warns on healthy GPT-2 LoRA and BERT runs)..."""
    precursor_zscore: float = 2.5
    """...and this many robust standard deviations (MAD) of its own log ratio above the median
    (heavy-tailed data makes a parameter's ratio swing with every batch)..."""
    precursor_abs_min: float = 2.5
    """...and at least this value (a steady run sits near 1; Student-t targets on a small MLP
    reached 2.5 two steps in a row, and 2.0 warns there)..."""
    precursor_steps: int = 2
    """...for this many steps in a row."""
    precursor_trend_window: int = 10
    """...while the median of its last this many steps..."""
    precursor_trend_ratio: float = 1.1
    """...is at least this many times its long median (`baseline_window` steps): a level that
    has been creeping up, not a burst of 2-3 steps out of a flat or low stretch (such bursts
    warned on a healthy QK-norm transformer's 16-value norm gain and on a healthy diffusion
    fine-tune's time embedding; before the precursor family's spikes the 10-step median stood
    at 1.05-1.55x the long one). A window of 0 turns the condition off."""
    precursor_sudden_ratio: float = 10.0
    """A streak that starts at this many times the median in one step is a parameter waking up
    (a dead unit or a rare embedding row getting a gradient again, its v near 0: a healthy
    regression's layer jumped to 13x its level in one step), not a moment lagging a growing
    gradient: it warns nothing."""
    precursor_warmup: int = 50
    """`instability_precursor` stays silent until its baseline holds this many measured steps
    (a step where no parameter has a ratio, Adam without state yet as under a GradScaler's
    first skips, does not count): Adam's moments are young at the start of a run, and a
    fine-tune's first steps (a new head, sparse embedding rows seen for the first time, LoRA
    factors that start at zero) swing
    g / sqrt(v_hat) widely (within their first 50 steps the suite's healthy BERT fine-tunes
    reached 4-12x their median, its LoRA fine-tunes over 150x)."""
    precursor_logz_rise: float = 3.0
    """`instability_precursor` on log Z (`probes/logz.py`, `detect/output_growth.py`): the
    largest log Z over the step's positions this many nats above its own median of the last
    `baseline_window` steps (and `precursor_zscore` robust deviations), on `precursor_steps`
    of the last 4 steps (tuned on seeds 0-2 of the `logit_growth` family: 2.5 warns on its
    capped twin, whose head LR rose 10x; 3 warned 1-20 steps ahead of its spikes). Within an
    episode, log Z is reported again each time it stands this many nats above its last report."""
    precursor_update_rms: bool = False
    """Also measure Adam's update RMS every step (`adam_update_rms` of `probes/adam_ratio.py`,
    one more fused norm over `exp_avg`) and warn on it. Off by default: timed alone it costs
    0.5-0.6% of a GPT-2 step on a CPU, which with the Adam ratio and log Z probes would take the
    every-step precursors past 1% of a step; on the `logit_growth` scenarios it warned before
    the spike on 1 of 6 seeds (log Z on 6 of 6), and at the thresholds below it warned on 3 of
    the suite's healthy runs (two BERT fine-tunes, the Student-t regression)."""
    precursor_update_min: float = 0.5
    """`instability_precursor` on Adam's update RMS (`adam_update_rms`): a parameter's value
    `precursor_ratio` times its median, `precursor_zscore` robust deviations above it and at
    least this (noise keeps it well below; 1 is a gradient of one sign every step)."""

    rearm_steps: int = 5
    """After an episode (explosion, spike, divergence), this many calm steps in a row re-arm the
    detector, so a signal hovering around its threshold is one event, not many."""
    baseline_window: int = 50
    """Number of recent healthy steps that form the robust (median/MAD) baselines."""
    warmup_steps: int = 10
    """Adaptive detectors stay silent until their baseline holds this many steps."""
    min_log_scale: float = 0.05
    """Floor for the robust spread in log space, so very smooth curves do not inflate z-scores."""
    max_named_params: int = 5
    """Events about several parameters name at most this many of them in their message."""

    attention_probe: bool = True
    """Measure each attention layer's largest pre-softmax logit (`attn_logit_max` of
    `probes/attention_logits.py`: forward hooks on the q/k projections, one sequence of the
    batch) for `instability_precursor`. False turns the probe and its warning off."""
    attention_every: int = 1
    """...on every this many steps (and on sampled steps)."""
    attention_logit_abs_min: float = 100.0
    """`instability_precursor` on attention: a layer's largest logit of at least this (a
    softmax over logits this far apart is one-hot to float32; tuned on seeds 0-2 of the suite's
    `tiny_attn` family, whose healthy twins peaked at 23-61, a QK-norm one at 0.1 slowly growing
    its norms' gains)..."""
    attention_logit_ratio: float = 2.0
    """...and this many times its median over its last `baseline_window` measurements, and again
    this many times its value at the layer's last warning to warn again..."""
    attention_logit_steps: int = 3
    """...for this many measurements in a row."""
    attention_logit_warmup: int = 20
    """Measurements a layer's baseline holds before it can warn."""

    def __post_init__(self) -> None:
        for name in ("grad_norm_abs_threshold", "grad_norm_ratio", "grad_norm_error_ratio",
                     "grad_norm_zscore", "grad_norm_abs_min_ratio", "loss_spike_ratio",
                     "loss_spike_zscore", "loss_spike_early_ratio",
                     "loss_spike_error_ratio", "divergence_ratio", "divergence_zscore",
                     "extreme_weight_abs",
                     "bad_start_ratio", "bad_start_blowup_ratio", "lr_jump_ratio",
                     "transient_margin", "dead_unit_share", "collapse_spread",
                     "collapse_mode_share", "output_std_ratio",
                     "fp16_limit_fraction", "min_loss_scale", "min_log_scale",
                     "loss_resolution", "precursor_abs_min", "precursor_zscore",
                     "attention_logit_abs_min", "first_update_ratio"):
            _positive(getattr(self, name), f"DetectorConfig.{name}")
        for name in ("precursor_logz_rise", "precursor_update_min", "precursor_trend_ratio"):
            _positive(getattr(self, name), f"DetectorConfig.{name}")
        for name in ("grad_norm_ratio", "loss_spike_ratio", "loss_spike_early_ratio",
                     "divergence_ratio", "bad_start_ratio", "bad_start_blowup_ratio",
                     "lr_jump_ratio", "transient_margin", "precursor_ratio",
                     "precursor_sudden_ratio", "attention_logit_ratio"):
            _require(getattr(self, name) > 1, f"DetectorConfig.{name}",
                     f"must be > 1, got {getattr(self, name)!r}")
        for name in ("fp16_limit_fraction", "dead_unit_share", "collapse_mode_share"):
            _require(getattr(self, name) <= 1, f"DetectorConfig.{name}",
                     f"must be <= 1, got {getattr(self, name)!r}")
        _require(self.output_std_ratio > 1, "DetectorConfig.output_std_ratio",
                 f"must be > 1, got {self.output_std_ratio!r}")
        for name, minimum in (("divergence_patience", 1), ("divergence_span", 1),
                              ("divergence_window", 1),
                              ("overflow_skips", 1), ("overflow_window", 1),
                              ("baseline_window", 3), ("warmup_steps", 0),
                              ("loss_spike_level_window", 1), ("rearm_steps", 1),
                              ("max_named_params", 1), ("no_gradient_steps", 1),
                              ("frozen_steps", 1),
                              ("stall_steps", 1), ("transient_horizon", 1),
                              ("eval_patience", 1), ("precursor_steps", 1),
                              ("precursor_warmup", 1), ("precursor_trend_window", 0),
                              ("attention_every", 1),
                              ("attention_logit_steps", 1), ("attention_logit_warmup", 1)):
            _at_least(getattr(self, name), minimum, f"DetectorConfig.{name}")


@dataclass(kw_only=True, slots=True)
class RecoveryConfig:
    """How the `recover` policy brings a broken run back (the guide's §6 rescue, automated)."""

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
        for name, minimum in (("ring_size", 1), ("ring_every", 1), ("confirm_steps", 0),
                              ("settle_steps", 1), ("rollback_after_skips", 1),
                              ("lr_ramp_steps", 0), ("max_rollbacks", 0)):
            _at_least(getattr(self, name), minimum, f"RecoveryConfig.{name}")
        _flag(self.rewind_schedule, "RecoveryConfig.rewind_schedule")
        _flag(self.restore_rng, "RecoveryConfig.restore_rng")
        _positive(self.max_grad_norm, "RecoveryConfig.max_grad_norm")
        _positive(self.settle_ratio, "RecoveryConfig.settle_ratio")
        if self.ring_budget is not None:
            _positive(self.ring_budget, "RecoveryConfig.ring_budget")
        _require(self.settle_ratio > 1, "RecoveryConfig.settle_ratio",
                 f"must be > 1, got {self.settle_ratio!r}")
        _positive(self.lr_backoff, "RecoveryConfig.lr_backoff")
        _require(self.lr_backoff <= 1, "RecoveryConfig.lr_backoff",
                 f"must be <= 1, got {self.lr_backoff!r}")
        _positive(self.lr_ceiling, "RecoveryConfig.lr_ceiling")
        _require(self.lr_ceiling <= 1, "RecoveryConfig.lr_ceiling",
                 f"must be <= 1, got {self.lr_ceiling!r}")


@dataclass(kw_only=True, slots=True)
class GuardConfig:
    """How the Guard watches and protects a run.

    Every field is a keyword with a default; most runs set at most the first four:

    - `policy` ("protect"), `max_grad_norm` ("auto"), `sample_every` (50), `console` (True).

    The rest, in sections:

    - clipping beyond the global limit: `clip_rule`, `agc`, and the adaptive clip's knobs
      (`auto_clip_ratio`, `auto_clip_zscore`, `auto_clip_warmup_ratio`, `auto_clip_alarm_steps`);
    - when the host reads the step: `sync`;
    - halting and skipping: `halt_severity`, `max_consecutive_skips`, `snapshot_dir`;
    - checkpoints: `block_poisoned_checkpoints`;
    - proving causes: `prove`, `prove_budget_steps`;
    - probes and checks: `sample_all_steps`, `inspect_batches`, `batch_size`, `preflight`,
      `activation_probe`, `output_probe`, `num_classes`;
    - the run store: `store`;
    - torch.distributed: `rank_timeout_s`, `collective_timeout_s`, `desync_every`;
    - nested sections: `detectors` (`DetectorConfig`: the detectors' thresholds, whose baseline
      window, warm-up and absolute limit the adaptive clip shares) and `recovery`
      (`RecoveryConfig`: the `recover` policy).
    """

    # -- The settings most runs change --
    policy: Policy = "protect"
    """`observe`: record and warn only. `protect`: clip, and skip steps whose loss or gradients
    are non-finite without touching optimizer state. `halt`: on an event of `halt_severity` or
    worse, write a crash snapshot and raise `TrainingDiverged`. `recover`: as protect, and roll
    back to the last good state (LR backed off, clipping tightened) when skipping does not heal
    the run; see `RecoveryConfig`."""
    max_grad_norm: float | Literal["auto"] | None = "auto"
    """Global gradient-norm clipping. `"auto"` (the default): under protect, recover and halt a
    step is clipped only when its norm is abnormal for this run (`remedies.RobustClipLimit`:
    at the run's typical norm for `auto_clip_alarm_steps` steps after an explosion or a spike,
    otherwise only beyond a loose backstop (`auto_clip_ratio`, `auto_clip_zscore`), never above
    the guide's absolute 1000), so healthy steps are never touched; under observe nothing is
    clipped. A number: a fixed limit, honoured exactly under every policy (the guide's
    max_norm=1.0 is `1.0`). None: no clipping."""
    sample_every: int = 50
    """Heavy probes (weights, update ratio, activations, optimizer state) run every this many steps,
    and on the step after any event."""
    console: bool = True
    """Print events as they happen (through the `trainguard` logger and stderr)."""

    # -- Clipping beyond max_grad_norm, and the adaptive clip's knobs --
    clip_rule: Mapping[str, Any] | ClipRule | None = None
    """An extra clipping rule from `trainguard.remedies` (LayerwiseClip, AdaptiveClip, a chain),
    applied after the global `max_grad_norm` clip to the norms the Guard already measured.
    Given as a rule or its spec dict; the config keeps only the spec (`rule_spec`), and the Guard
    builds its own fresh rule from it, so the object passed here is not the one that runs and its
    statistics (AdaptiveClip's EMA) are the run's state, saved by `guard.state_dict()`."""
    agc: Mapping[str, Any] | AGC | None = None
    """Adaptive gradient clipping relative to weight norms (`trainguard.remedies.AGC`), applied
    last, on the device. Given as an AGC or its spec dict; kept as the spec (`agc_spec`)."""
    auto_clip_ratio: float = 20.0
    """Under `max_grad_norm="auto"`, once warm: a step is clipped above this many times the run's
    typical norm (loose on purpose: healthy fine-tunes have single steps at 10x their median)..."""
    auto_clip_zscore: float = 6.0
    """...and at least this many robust standard deviations (in log space) above it."""
    auto_clip_warmup_ratio: float = 10.0
    """While the first `detectors.warmup_steps` norms come in: clipped above this many times the
    median of the norms so far (looser, since a fine-tune's first norms still climb)."""
    auto_clip_alarm_steps: int = 20
    """After a gradient explosion, loss spike or divergence event, this many steps (that one
    included) are clipped at the run's typical norm."""

    # -- When the host reads the step --
    sync: Sync = "blocking"
    """`blocking`: every step's summary is read on the host before its update is decided (one
    host sync per step on an accelerator). `deferred`: the step's skip (non-finite loss or
    gradients) and global clip are decided on the device, through `found_inf` for PyTorch's fused
    Adam, AdamW and SGD, and its summary crosses to the host without a wait, to be judged at the
    next step: detectors, events, sinks and halts run one step late. Taken by the plain-loop
    `Guard` with a fused optimizer (a GradScaler alongside), no `clip_rule` or `agc`, under any
    policy (a `recover` rollback judged late also drops the next step's update), and under
    torch.distributed when the collectives run on the model's device; otherwise the run says why
    once and runs blocking. The README says what one step late changes."""

    # -- Halting and skipping --
    halt_severity: str = "error"
    """Under `halt`, the least severe event that stops the run."""
    max_consecutive_skips: int = 25
    """Under `protect`, this many consecutive skipped steps mean the run cannot heal by skipping:
    the Guard halts with a snapshot instead of skipping forever."""
    snapshot_dir: str | os.PathLike[str] | None = None
    """Where `halt` writes crash snapshots; defaults to the run_dir (or ./trainguard_snapshots).
    A path object is kept as its string."""
    block_poisoned_checkpoints: bool | None = None
    """A checkpoint saved with non-finite weights or optimizer moments is always marked
    `poisoned` in its `trainguard.json` sidecar, with a warning naming it. True: it is also
    renamed `<name>.poisoned`, so that a trainer's resume logic (`get_last_checkpoint`,
    `ckpt_path="last"`) never picks it. None (the default): True under `recover`, False under
    the other policies."""

    # -- Proving causes (needs the Guard's `replay_fn`) --
    prove: Literal["auto", "on", "off"] = "auto"
    """Replay a bad step under each candidate fix to confirm or rule out its causes
    (`trainguard.diagnose.counterfactual`). `auto`: at the step that halts (under `halt`; from
    the state before the loop's last LR jump of 10x or more too, a copy the run keeps then:
    `diagnose/anchor.py`) and at the first rollback (under `recover`); `on`: also at the first
    steps with an error-level event or a loss or gradient jump (a warning too), and at the
    first warning before any bad step (`instability_precursor`, `bad_start`: a window from a
    good state, judged on the warned signal, `diagnose/warned_signal.py`), under every policy
    (the state is put back exactly), and without a recover ring the run keeps two good states
    in host memory to replay from (`diagnose/anchor.py`); `off`: never. Healthy steps never pay
    for a replay."""
    prove_budget_steps: float = 20.0
    """A proof stops trying interventions after about this many training steps' time."""

    # -- Probes and checks --
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
    activation_probe: bool = True
    """Attach forward hooks on sampled steps: activation range, sparsity and non-finite share."""
    output_probe: bool = True
    """Watch the model's output on sampled steps: predicted classes and their spread, the
    output's scale (`output_collapse`)."""
    num_classes: int | None = None
    """Classes of the task, for judging evaluation accuracy against chance (`metric_collapse`);
    None: inferred from the width of the model's class scores."""

    # -- The run store --
    store: bool = True
    """Write the embedded run store when a run_dir is given."""

    # -- torch.distributed --
    rank_timeout_s: float = 60.0
    """Under torch.distributed, how long a rank waits at the start for every other rank to start
    trainguard with the same configuration before it stops with a message naming the rank
    missing (a rank without trainguard would otherwise make the others hang in its collectives
    until the process group's timeout)."""
    collective_timeout_s: float = 300.0
    """Under torch.distributed with gloo, how long one of trainguard's own collectives (the
    step's all-reduce and the few others) waits for the other ranks before the run stops with
    `PeerLost`. They run on a process group of trainguard's own created with this timeout, so a
    rank that hangs does not hold the others for the default group's 30 minutes. A rank that dies
    is seen at once (its connections close); this bounds only a rank that stops answering. Keep
    it above the longest time one rank may legitimately spend outside its steps while the others
    wait in trainguard's all-reduce (an evaluation or a checkpoint on one rank only). Under NCCL
    trainguard uses the default group, and its timeout and NCCL's watchdog apply."""
    desync_every: int = 5
    """Under torch.distributed, every this many steps a fingerprint of each rank's replicated
    weights (one fused norm pass) rides the step's all-reduce (the guide's §3.4.1 desync check);
    when the ranks' fingerprints part, a second check names the parameters that drifted."""

    # -- Nested sections --
    detectors: DetectorConfig = field(default_factory=DetectorConfig)
    """Thresholds of the built-in detectors."""
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    """Settings of the `recover` policy (the good-state ring is kept only under `recover`)."""

    def __post_init__(self) -> None:
        _require(self.policy in POLICIES, "GuardConfig.policy",
                 f"unknown policy {self.policy!r}; choose one of {', '.join(POLICIES)}")
        if self.max_grad_norm is not None and self.max_grad_norm != "auto":
            _require(isinstance(self.max_grad_norm, (int, float)), "GuardConfig.max_grad_norm",
                     f"must be a number > 0, 'auto' or None, got {self.max_grad_norm!r}")
            _positive(self.max_grad_norm, "GuardConfig.max_grad_norm")
        _require(self.sync in SYNCS, "GuardConfig.sync",
                 f"unknown sync {self.sync!r}; choose one of {', '.join(SYNCS)}")
        _at_least(self.sample_every, 1, "GuardConfig.sample_every")
        _require(self.prove in ("auto", "on", "off"), "GuardConfig.prove",
                 f"must be 'auto', 'on' or 'off', got {self.prove!r}")
        _positive(self.prove_budget_steps, "GuardConfig.prove_budget_steps")
        _at_least(self.max_consecutive_skips, 1, "GuardConfig.max_consecutive_skips")
        _at_least(self.desync_every, 1, "GuardConfig.desync_every")
        for name in ("auto_clip_ratio", "auto_clip_zscore", "auto_clip_warmup_ratio"):
            _positive(getattr(self, name), f"GuardConfig.{name}")
        for name in ("auto_clip_ratio", "auto_clip_warmup_ratio"):
            # a limit below the typical norm would clip healthy steps
            _require(getattr(self, name) >= 1, f"GuardConfig.{name}",
                     f"must be >= 1, got {getattr(self, name)!r}")
        _at_least(self.auto_clip_alarm_steps, 1, "GuardConfig.auto_clip_alarm_steps")
        _positive(self.rank_timeout_s, "GuardConfig.rank_timeout_s")
        _positive(self.collective_timeout_s, "GuardConfig.collective_timeout_s")
        if self.batch_size is not None:
            _at_least(self.batch_size, 1, "GuardConfig.batch_size")
        _require(self.halt_severity in SEVERITIES, "GuardConfig.halt_severity",
                 f"unknown severity {self.halt_severity!r}; choose one of {', '.join(SEVERITIES)}")
        for name in ("sample_all_steps", "inspect_batches", "preflight", "activation_probe",
                     "output_probe", "store", "console"):
            _flag(getattr(self, name), f"GuardConfig.{name}")
        if self.num_classes is not None:
            _at_least(self.num_classes, 2, "GuardConfig.num_classes")
        if self.block_poisoned_checkpoints is not None:
            _flag(self.block_poisoned_checkpoints, "GuardConfig.block_poisoned_checkpoints")
        if self.snapshot_dir is not None:
            _require(isinstance(self.snapshot_dir, (str, os.PathLike)), "GuardConfig.snapshot_dir",
                     f"must be a path, got {self.snapshot_dir!r}")
            self.snapshot_dir = os.fspath(self.snapshot_dir)
        self.detectors = _section(DetectorConfig, self.detectors, "GuardConfig.detectors")
        _require(isinstance(self.detectors, DetectorConfig), "GuardConfig.detectors",
                 "must be a DetectorConfig")
        if self.clip_rule is not None:
            from trainguard.remedies import rule_spec

            self.clip_rule = rule_spec(self.clip_rule, where="GuardConfig.clip_rule")
        if self.agc is not None:
            from trainguard.remedies import agc_spec

            self.agc = agc_spec(self.agc, where="GuardConfig.agc")
        self.recovery = _section(RecoveryConfig, self.recovery, "GuardConfig.recovery")
        _require(isinstance(self.recovery, RecoveryConfig), "GuardConfig.recovery",
                 "must be a RecoveryConfig")

    @property
    def adaptive_clip(self) -> bool:
        """Whether the adaptive default clip is in force (`max_grad_norm="auto"`, a policy that
        protects)."""
        return self.max_grad_norm == "auto" and self.policy != "observe"

    @property
    def blocks_poisoned_checkpoints(self) -> bool:
        """Whether a poisoned checkpoint is renamed `<name>.poisoned` (`block_poisoned_checkpoints`,
        by default only under `recover`)."""
        if self.block_poisoned_checkpoints is None:
            return self.policy == "recover"
        return self.block_poisoned_checkpoints

    def auto_clip_options(self) -> dict[str, Any]:
        """The adaptive clip's own knobs, as `remedies.RobustClipLimit`'s keywords (its window,
        warm-up and ceiling come from `detectors`)."""
        return {"ratio": self.auto_clip_ratio, "zscore": self.auto_clip_zscore,
                "warmup_ratio": self.auto_clip_warmup_ratio,
                "alarm_steps": self.auto_clip_alarm_steps}

    @property
    def fixed_max_grad_norm(self) -> float | None:
        """The fixed global limit the user set (None under "auto" or with no clipping)."""
        value = self.max_grad_norm
        return None if value is None or value == "auto" else float(value)

    def to_dict(self) -> dict[str, Any]:
        """Plain, JSON-serialisable data (nested dicts, rules as their specs), a copy."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GuardConfig:
        """The config `to_dict` gave. Fields left out take their defaults; unknown fields, here
        or in `detectors` / `recovery`, are a ConfigError naming them. A config stored by an
        older version described `clip_rule` / `agc` in words (a string): such a rule cannot be
        rebuilt and is dropped."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"GuardConfig: expected a dict of fields, got "
                              f"{type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(str(k) for k in set(data) - known)
        if unknown:
            raise ConfigError(f"GuardConfig: unknown field(s) {', '.join(unknown)}")
        data = {k: v for k, v in data.items()
                if not (k in ("clip_rule", "agc") and isinstance(v, str))}
        return cls(**data)
