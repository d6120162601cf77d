"""The built-in detectors' settings: one section per detector, and `DetectorConfig`, their
container (`GuardConfig.detectors`).

Each section is named by the kind of event its detector raises (`LossSpikeConfig` is
`detectors.loss_spike`, read by `detect/loss_spike.py`), and `common` holds what the adaptive
detectors share. They live together here, not in the detectors' modules, because a detector reads
the whole container (its own section and `common`): a section in a detector's module would make
an import loop between it and the container.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from trainguard import sections
from trainguard.errors import ConfigError


@dataclass(kw_only=True, slots=True)
class CommonConfig:
    """Settings the adaptive detectors share (and the adaptive clip, which keeps the same
    baseline)."""

    PATH: ClassVar[str] = "detectors.common"

    baseline_window: int = 50
    """Recent healthy steps that form the robust (median/MAD) baselines."""
    warmup_steps: int = 10
    """Adaptive detectors stay silent until their baseline holds this many steps."""
    rearm_steps: int = 5
    """After an episode (explosion, spike, divergence), this many calm steps in a row re-arm the
    detector, so a signal hovering around its threshold is one event, not many."""
    min_log_scale: float = 0.05
    """Floor for the robust spread in log space, so very smooth curves do not inflate z-scores."""
    loss_resolution: float = 1e-7
    """The smallest rise of the loss that is not float noise, as a share of the level the run
    started at (about float32's relative resolution): `loss_spike` and `loss_divergence` ignore
    smaller rises, so a loss converged near zero does not warn on its rounding."""
    transient_horizon: int = 500
    """Steps a one-step jump that was back to normal at the next step (a heavy-tailed batch) is
    remembered by the spike and explosion detectors."""
    transient_margin: float = 3.0
    """Once a run has shown such jumps, a new one must be this many times beyond the largest of
    them to count: heavy-tailed data keeps producing jumps of about the same size, a fault goes
    further."""
    max_named_params: int = 5
    """Events about several parameters name at most this many of them in their message."""

    def __post_init__(self) -> None:
        sections.at_least(self, 3, "baseline_window")
        sections.at_least(self, 0, "warmup_steps")
        sections.at_least(self, 1, "rearm_steps", "transient_horizon", "max_named_params")
        sections.positive(self, "min_log_scale", "loss_resolution")
        sections.above_one(self, "transient_margin")



@dataclass(kw_only=True, slots=True)
class GradExplosionConfig:
    """Thresholds of `grad_explosion`."""

    PATH: ClassVar[str] = "detectors.grad_explosion"

    abs_threshold: float = 1000.0
    """The guide's rule of thumb (§2.1): a pre-clip global gradient norm above this explodes."""
    ratio: float = 10.0
    """Adaptive rule: a norm this many times the run's robust baseline (median of recent steps)."""
    error_ratio: float = 100.0
    """An adaptive explosion this many times the baseline is an error, not a warning."""
    abs_min_ratio: float = 2.0
    """Once the baseline is warm, the absolute rule also needs the norm this many times the run's
    typical norm (and outside its noise), so a run whose normal norm is near 1000 is not flagged
    by noise."""
    zscore: float = 6.0
    """...and this many robust standard deviations above it in log space (noise guard)."""

    def __post_init__(self) -> None:
        sections.positive(self, "abs_threshold", "error_ratio", "abs_min_ratio", "zscore")
        sections.above_one(self, "ratio")



@dataclass(kw_only=True, slots=True)
class LossSpikeConfig:
    """Thresholds of `loss_spike`."""

    PATH: ClassVar[str] = "detectors.loss_spike"

    ratio: float = 2.5
    """A loss this many times the recent median is a spike: below 3, so that a 3x jump (§2.2) is
    caught even on a falling curve, where the median trails the newest losses."""
    level_window: int = 10
    """The spike's baseline level is the median of this many most recent steps (short, so it
    follows a falling curve); the noise scale comes from the longer `common.baseline_window`."""
    zscore: float = 6.0
    """...and this many robust standard deviations above it in log space (noise guard)."""
    early_ratio: float = 5.0
    """Before the baseline is warm, a jump of this many times the first losses is a spike."""
    error_ratio: float = 100.0
    """A spike this many times the baseline (2.3 -> 1e8 is 4e7x) is an error, not a warning."""

    def __post_init__(self) -> None:
        sections.positive(self, "zscore", "error_ratio")
        sections.above_one(self, "ratio", "early_ratio")
        sections.at_least(self, 1, "level_window")



@dataclass(kw_only=True, slots=True)
class LossDivergenceConfig:
    """Thresholds of `loss_divergence`."""

    PATH: ClassVar[str] = "detectors.loss_divergence"

    ratio: float = 1.5
    """Sustained divergence: the smoothed loss stays this many times above its best value..."""
    patience: int = 10
    """...for this many consecutive steps."""
    span: int = 50
    """Span (in steps) of the exponential moving average that smooths the loss."""
    window: int = 10
    """Losses whose median is the current level (one outlier batch cannot move a median of 10;
    a climbing loss moves it within 5 steps)."""
    zscore: float = 2.5
    """The current level must also be this many robust standard deviations of the run's recent
    log losses above the best: the best is the minimum of a smoothed level, which sits below the
    typical level by about half a deviation on a flat noisy run."""

    def __post_init__(self) -> None:
        sections.above_one(self, "ratio")
        sections.positive(self, "zscore")
        sections.at_least(self, 1, "patience", "span", "window")



@dataclass(kw_only=True, slots=True)
class BadStartConfig:
    """Thresholds of `bad_start`."""

    PATH: ClassVar[str] = "detectors.bad_start"

    ratio: float = 10.0
    """The first loss this many times the level the run settles at by step
    `common.warmup_steps` is a bad start (a new layer initialised far too large)..."""
    blowup_ratio: float = 2.0
    """...and a level this many times the first loss is one too (the first updates blew the
    model up: an LR too high for the start)."""

    def __post_init__(self) -> None:
        sections.above_one(self, "ratio", "blowup_ratio")



@dataclass(kw_only=True, slots=True)
class UpdateTooLargeConfig:
    """Threshold of `update_too_large`."""

    PATH: ClassVar[str] = "detectors.update_too_large"

    first_ratio: float = 0.15
    """The first update measured moving the typical weight (the median over weights of 1024
    elements or more) by this share of its norm, ||dW|| / ||W||, is too large: a healthy
    fine-tuning step moves a weight by 0.1-1%, a layer trained from scratch a few percent."""

    def __post_init__(self) -> None:
        sections.positive(self, "first_ratio")



@dataclass(kw_only=True, slots=True)
class ExtremeWeightConfig:
    """Threshold of `extreme_weight`."""

    PATH: ClassVar[str] = "detectors.extreme_weight"

    abs_limit: float = 1e6
    """A weight with |w| above this is extreme (§2.1)."""

    def __post_init__(self) -> None:
        sections.positive(self, "abs_limit")



@dataclass(kw_only=True, slots=True)
class Fp16OverflowConfig:
    """Thresholds of `fp16_overflow`."""

    PATH: ClassVar[str] = "detectors.fp16_overflow"

    limit_fraction: float = 0.5
    """Activations or fp16 gradients above this share of the float16 maximum (65504) are at risk."""
    min_loss_scale: float = 1.0
    """An AMP loss scale below this has collapsed: the model overflows float16 even unscaled."""
    skips: int = 5
    """This many GradScaler overflow skips within `window` steps is bad, counted after the
    scaler's calibration (the skips of its first steps while the scale fell) and after the first
    `window` steps."""
    window: int = 50
    """Window, in steps, for counting GradScaler overflow skips."""

    def __post_init__(self) -> None:
        sections.share(self, "limit_fraction")
        sections.positive(self, "min_loss_scale")
        sections.at_least(self, 1, "skips", "window")



@dataclass(kw_only=True, slots=True)
class LRChangeConfig:
    """Threshold of `lr_change`."""

    PATH: ClassVar[str] = "detectors.lr_change"

    ratio: float = 3.0
    """A group's LR this many times above the highest it ever used, in one step, is a change made
    by code: schedules climb by smaller steps (a linear warmup's second step is 2x its first,
    later ones less) and restarts return to levels already used."""

    def __post_init__(self) -> None:
        sections.above_one(self, "ratio")



@dataclass(kw_only=True, slots=True)
class LRAtZeroConfig:
    """Threshold of `lr_at_zero`."""

    PATH: ClassVar[str] = "detectors.lr_at_zero"

    steps: int = 10
    """Optimizer steps in a row with every group's LR exactly 0 (after it was positive) before
    it is told: a schedule touches 0 for a step at the low point of a cosine cycle or the end
    of a decay; ten in a row is a schedule, or code, that left it there."""

    def __post_init__(self) -> None:
        sections.at_least(self, 1, "steps")



@dataclass(kw_only=True, slots=True)
class DeadUnitsConfig:
    """Thresholds of `dead_units`."""

    PATH: ClassVar[str] = "detectors.dead_units"

    share: float = 0.95
    """A module whose units are zero for every sample of a batch in at least this share is dead;
    a healthy ReLU layer has almost none such."""
    spread: float = 1e-3
    """A module whose output varies across the batch by less than this share of its magnitude
    gives every sample the same output (collapsed)."""

    def __post_init__(self) -> None:
        sections.share(self, "share")
        sections.positive(self, "spread")



@dataclass(kw_only=True, slots=True)
class OutputCollapseConfig:
    """Thresholds of `output_collapse`."""

    PATH: ClassVar[str] = "detectors.output_collapse"

    mode_share: float = 0.98
    """Predictions of which at least this share are one class are a collapsed classifier, when
    they were spread before."""
    std_ratio: float = 10.0
    """A continuous output whose spread falls below 1/x or rises above x times its early level
    has collapsed or exploded (a denoiser's predicted noise)."""

    def __post_init__(self) -> None:
        sections.share(self, "mode_share")
        sections.above_one(self, "std_ratio")



@dataclass(kw_only=True, slots=True)
class MetricCollapseConfig:
    """Threshold of `metric_collapse`."""

    PATH: ClassVar[str] = "detectors.metric_collapse"

    patience: int = 3
    """Evaluations in a row that an eval loss rises while the train loss falls, before
    `metric_collapse` says so."""

    def __post_init__(self) -> None:
        sections.at_least(self, 1, "patience")



@dataclass(kw_only=True, slots=True)
class NoGradientsConfig:
    """Threshold of `no_gradients`."""

    PATH: ClassVar[str] = "detectors.no_gradients"

    steps: int = 3
    """Optimizer steps in a row without any gradient (None or zero) before it fires: one such
    step happens legitimately (a batch that touches no trainable weight), three in a row mean
    nothing is training."""

    def __post_init__(self) -> None:
        sections.at_least(self, 1, "steps")



@dataclass(kw_only=True, slots=True)
class ParamsUnfrozenConfig:
    """Threshold of `params_unfrozen`."""

    PATH: ClassVar[str] = "detectors.params_unfrozen"

    steps: int = 10
    """A parameter whose gradient was zero (or absent) this many steps in a row and then is not
    is reported (a layer unfrozen, a branch now used); a parameter used on every other batch is
    not."""

    def __post_init__(self) -> None:
        sections.at_least(self, 1, "steps")



@dataclass(kw_only=True, slots=True)
class KLBlowupConfig:
    """Thresholds of `kl_blowup`: a trainer's KL to its reference model (`kl`, `objective/kl`),
    against its own history (per token in GRPO, about 1e-3; per sequence in PPO, up to 10)."""

    PATH: ClassVar[str] = "detectors.kl_blowup"

    ratio: float = 10.0
    """A KL this many times its own median so far is a blow-up."""
    floor: float = 0.01
    """The median is taken as at least this (nats): a KL that starts at exactly 0 (the policy
    is its reference at the first step) makes any later value an infinite ratio, and a KL
    under 0.01 nats moves no policy far. The KL a trainer logs per sequence (PPO's
    `objective/kl`, KTO's `kl`) runs higher than a per-token one: raise it there."""
    warmup: int = 1
    """KL values seen before one is judged. One is enough: the first KL is that of the policy
    before its first update (0, or the noise of a sampled estimate), and the floor stands for
    the level until the run shows one."""

    def __post_init__(self) -> None:
        sections.above_one(self, "ratio")
        sections.positive(self, "floor")
        sections.at_least(self, 1, "warmup")


@dataclass(kw_only=True, slots=True)
class RewardDeadConfig:
    """Threshold of `reward_dead`."""

    PATH: ClassVar[str] = "detectors.reward_dead"

    steps: int = 5
    """Steps in a row whose every group of completions scored alike (`frac_reward_zero_std`
    at 1, or a reward spread of 0) before it fires: then no completion is better than another
    and the policy gradient is zero."""
    zero_std_share: float = 0.99
    """`frac_reward_zero_std` at least this is "every group scored alike"."""

    def __post_init__(self) -> None:
        sections.at_least(self, 1, "steps")
        sections.share(self, "zero_std_share")


@dataclass(kw_only=True, slots=True)
class EntropyCollapseConfig:
    """Thresholds of `entropy_collapse`."""

    PATH: ClassVar[str] = "detectors.entropy_collapse"

    share: float = 0.1
    """An entropy under this share of its starting level is a collapse: learning lowers the
    entropy, a policy that explores still keeps far more than a tenth of it."""
    warmup: int = 3
    """The first entropies whose median is the starting level."""

    def __post_init__(self) -> None:
        sections.share(self, "share")
        sections.at_least(self, 1, "warmup")


@dataclass(kw_only=True, slots=True)
class CompletionLengthCollapseConfig:
    """Thresholds of `completion_length_collapse`."""

    PATH: ClassVar[str] = "detectors.completion_length_collapse"

    share: float = 0.25
    """A mean completion length under this share of its starting level is a collapse: answers
    that learn to be concise keep far more than a quarter of their length..."""
    steps: int = 2
    """...for this many logged steps in a row (one batch of short answers is not a trend)."""
    warmup: int = 3
    """The first mean lengths whose median is the starting level."""

    def __post_init__(self) -> None:
        sections.share(self, "share")
        sections.at_least(self, 1, "steps")
        sections.at_least(self, 1, "warmup")


@dataclass(kw_only=True, slots=True)
class CompletionsTruncatedConfig:
    """Thresholds of `completions_truncated`."""

    PATH: ClassVar[str] = "detectors.completions_truncated"

    share: float = 0.9
    """At least this share of the completions cut at `max_completion_length`..."""
    steps: int = 3
    """...for this many logged steps in a row..."""
    start_below: float = 0.5
    """...in a run whose first `warmup` steps had under this share cut (a run cut from its
    start is `reward_dead`'s when its reward dies)."""
    warmup: int = 3
    """The first clipped ratios (and rewards) whose median is the starting level."""

    def __post_init__(self) -> None:
        sections.share(self, "share")
        sections.share(self, "start_below")
        sections.at_least(self, 1, "steps")
        sections.at_least(self, 1, "warmup")


@dataclass(kw_only=True, slots=True)
class RatioFarFromOneConfig:
    """Thresholds of `ratio_far_from_one`."""

    PATH: ClassVar[str] = "detectors.ratio_far_from_one"

    limit: float = 2.0
    """A mean ratio above this or under its inverse is far from 1 (PPO clips each token's at
    1 +- 0.2; TRL's PPO skipped batches past 10)..."""
    steps: int = 2
    """...for this many logged steps in a row (one batch of odd completions is not a trend)."""

    def __post_init__(self) -> None:
        sections.above_one(self, "limit")
        sections.at_least(self, 1, "steps")


@dataclass(kw_only=True, slots=True)
class PreferenceUnlearnedConfig:
    """Threshold of `preference_unlearned`."""

    PATH: ClassVar[str] = "detectors.preference_unlearned"

    steps: int = 10
    """Steps in a row with the chosen and rejected rewards both exactly 0 (the policy's
    log-probabilities equal the reference's) before it fires. They are 0 at the first step by
    construction; a policy that learns moves them at the first update."""

    def __post_init__(self) -> None:
        sections.at_least(self, 1, "steps")


@dataclass(kw_only=True, slots=True)
class MarginsExplodingConfig:
    """Threshold of `margins_exploding`."""

    PATH: ClassVar[str] = "detectors.margins_exploding"

    margin: float = 10.0
    """A reward margin above this is past learning: the DPO loss of a pair is then under 5e-5
    and its gradient as small; a run that learns its pairs settles far below (a few units)."""

    def __post_init__(self) -> None:
        sections.positive(self, "margin")


@dataclass(kw_only=True, slots=True)
class ChosenLikelihoodFallingConfig:
    """Thresholds of `chosen_likelihood_falling`."""

    PATH: ClassVar[str] = "detectors.chosen_likelihood_falling"

    share: float = 0.5
    """The chosen log-probability below its starting level by more than this share of it (-30
    to under -45 at 0.5) is a fall: a policy that learns keeps or raises it."""
    warmup: int = 3
    """The first chosen log-probabilities whose median is the starting level."""

    def __post_init__(self) -> None:
        sections.positive(self, "share")
        sections.at_least(self, 1, "warmup")


@dataclass(kw_only=True, slots=True)
class RewardHackingConfig:
    """Thresholds of `reward_hacking`."""

    PATH: ClassVar[str] = "detectors.reward_hacking"

    warmup: int = 3
    """The first means of each reward whose median is its starting level."""
    window: int = 5
    """The last means of each reward whose median is its level now: one step's batch of
    completions is too few to say a reward moved."""
    least: float = 0.05
    """The smallest move of a reward's mean that counts, where its spread at the start was 0
    (a reward that paid nothing yet)."""

    def __post_init__(self) -> None:
        sections.at_least(self, 1, "warmup", "window")
        sections.positive(self, "least")


@dataclass(kw_only=True, slots=True)
class PolicyOffReferenceConfig:
    """Threshold of `policy_off_reference`."""

    PATH: ClassVar[str] = "detectors.policy_off_reference"

    tolerance: float = 1e-3
    """A first implicit reward or KL further from 0 than this is not rounding: a policy made
    from its reference computes the same log-probabilities (0 exactly in float32)."""

    def __post_init__(self) -> None:
        sections.positive(self, "tolerance")


@dataclass(kw_only=True, slots=True)
class NoProgressConfig:
    """Threshold of `no_progress` (and of the verdict `stalled`)."""

    PATH: ClassVar[str] = "detectors.no_progress"

    steps: int = 100
    """Optimizer steps at a working LR after which a loss that has not come down is a stall."""

    def __post_init__(self) -> None:
        sections.at_least(self, 1, "steps")



@dataclass(kw_only=True, slots=True)
class InstabilityPrecursorConfig:
    """Thresholds of `instability_precursor` on Adam's ratio, log Z and Adam's update RMS
    (docs/benchmarks.md's history says how they were chosen)."""

    PATH: ClassVar[str] = "detectors.instability_precursor"

    probe: bool = True
    """Measure Adam's ratio sqrt(sum g^2 / sum v_hat) per parameter and log Z (the warning reads
    them as series of steps). Reads 0 for a non-Adam optimizer; left out under torch.distributed.
    False turns the probes and the warning off."""
    every: int = 4
    """While every value is far from its bound (no streak, no open episode), the probes measure
    every this many steps and each value stands for the steps until the next; near a bound, after
    any event and on sampled steps they measure every step. 1: every step always. Adam's ratio,
    while each of its measurements matches the estimate made for it from the gradient norms, is
    measured at every second, fourth, then eighth of these steps."""
    ratio: float = 2.0
    """A parameter's Adam ratio this many times its own median of the last
    `common.baseline_window` steps..."""
    zscore: float = 2.5
    """...and this many robust standard deviations (MAD) of its own log ratio above the median
    (heavy-tailed data makes a parameter's ratio swing with every batch)..."""
    abs_min: float = 2.5
    """...and at least this value (a steady run sits near 1)..."""
    steps: int = 2
    """...for this many steps in a row."""
    trend_window: int = 10
    """...while the median of its last this many steps..."""
    trend_ratio: float = 1.1
    """...is at least this many times its long median: a level that has been creeping up, not a
    burst of 2-3 steps out of a flat or low stretch. A `trend_window` of 0 turns this off."""
    sudden_ratio: float = 10.0
    """A streak that starts at this many times the median in one step is a parameter waking up
    (a dead unit or a rare embedding row getting a gradient again, its v near 0), not a moment
    lagging a growing gradient: it warns nothing."""
    warmup: int = 50
    """Silent until the baseline holds this many measured steps: Adam's moments are young at the
    start of a run, and a fine-tune's first steps (a new head, sparse embedding rows, LoRA
    factors that start at zero) swing g / sqrt(v_hat) widely."""
    logz_rise: float = 3.0
    """On log Z: the largest log Z over the step's positions this many nats above its own median
    (and `zscore` robust deviations), on `steps` of the last 4 steps. Within an episode, log Z
    is reported again each time it stands this many nats above its last report."""
    update_rms: bool = False
    """Also measure Adam's update RMS every step (one more fused norm over `exp_avg`) and warn on
    it. Off by default: it costs about 0.5% of a step and warned early less often than log Z."""
    update_min: float = 0.5
    """On Adam's update RMS: a parameter's value `ratio` times its median, `zscore` robust
    deviations above it and at least this (noise keeps it well below; 1 is a gradient of one
    sign every step)."""

    def __post_init__(self) -> None:
        sections.flag(self, "probe", "update_rms")
        sections.positive(self, "zscore", "abs_min", "logz_rise", "update_min", "trend_ratio")
        sections.above_one(self, "ratio", "sudden_ratio")
        sections.at_least(self, 1, "steps", "warmup", "every")
        sections.at_least(self, 0, "trend_window")



@dataclass(kw_only=True, slots=True)
class AttentionLogitsConfig:
    """The attention-logit probe and its `instability_precursor` warning."""

    PATH: ClassVar[str] = "detectors.attention_logits"

    probe: bool = True
    """Measure each attention layer's largest pre-softmax logit (forward hooks on the q/k
    projections, one sequence of the batch). False turns the probe and its warning off."""
    every: int = 4
    """...on every this many steps while every layer's logits are far from the bounds below
    (under half of each), on every step while a layer's baseline is young (`warmup`) or a
    layer is near them, and on sampled steps. 1: every step always."""
    abs_min: float = 100.0
    """A layer's largest logit of at least this (a softmax over logits this far apart is one-hot
    to float32)..."""
    ratio: float = 2.0
    """...and this many times its median over its last `common.baseline_window` measurements,
    and again this many times its value at the layer's last warning to warn again..."""
    steps: int = 3
    """...for this many measurements in a row."""
    warmup: int = 20
    """Measurements a layer's baseline holds before it can warn."""

    def __post_init__(self) -> None:
        sections.flag(self, "probe")
        sections.positive(self, "abs_min")
        sections.above_one(self, "ratio")
        sections.at_least(self, 1, "every", "steps", "warmup")


DETECTOR_FLAT_NAMES: dict[str, tuple[str, str]] = {
    "grad_norm_abs_threshold": ("grad_explosion", "abs_threshold"),
    "grad_norm_ratio": ("grad_explosion", "ratio"),
    "grad_norm_error_ratio": ("grad_explosion", "error_ratio"),
    "grad_norm_abs_min_ratio": ("grad_explosion", "abs_min_ratio"),
    "grad_norm_zscore": ("grad_explosion", "zscore"),
    "loss_spike_ratio": ("loss_spike", "ratio"),
    "loss_spike_level_window": ("loss_spike", "level_window"),
    "loss_spike_zscore": ("loss_spike", "zscore"),
    "loss_spike_early_ratio": ("loss_spike", "early_ratio"),
    "loss_spike_error_ratio": ("loss_spike", "error_ratio"),
    "bad_start_ratio": ("bad_start", "ratio"),
    "bad_start_blowup_ratio": ("bad_start", "blowup_ratio"),
    "first_update_ratio": ("update_too_large", "first_ratio"),
    "loss_resolution": ("common", "loss_resolution"),
    "divergence_ratio": ("loss_divergence", "ratio"),
    "divergence_patience": ("loss_divergence", "patience"),
    "divergence_span": ("loss_divergence", "span"),
    "divergence_window": ("loss_divergence", "window"),
    "divergence_zscore": ("loss_divergence", "zscore"),
    "extreme_weight_abs": ("extreme_weight", "abs_limit"),
    "fp16_limit_fraction": ("fp16_overflow", "limit_fraction"),
    "min_loss_scale": ("fp16_overflow", "min_loss_scale"),
    "overflow_skips": ("fp16_overflow", "skips"),
    "overflow_window": ("fp16_overflow", "window"),
    "lr_jump_ratio": ("lr_change", "ratio"),
    "transient_horizon": ("common", "transient_horizon"),
    "transient_margin": ("common", "transient_margin"),
    "dead_unit_share": ("dead_units", "share"),
    "collapse_spread": ("dead_units", "spread"),
    "collapse_mode_share": ("output_collapse", "mode_share"),
    "output_std_ratio": ("output_collapse", "std_ratio"),
    "eval_patience": ("metric_collapse", "patience"),
    "no_gradient_steps": ("no_gradients", "steps"),
    "frozen_steps": ("params_unfrozen", "steps"),
    "stall_steps": ("no_progress", "steps"),
    "precursor_probe": ("instability_precursor", "probe"),
    "precursor_ratio": ("instability_precursor", "ratio"),
    "precursor_zscore": ("instability_precursor", "zscore"),
    "precursor_abs_min": ("instability_precursor", "abs_min"),
    "precursor_steps": ("instability_precursor", "steps"),
    "precursor_trend_window": ("instability_precursor", "trend_window"),
    "precursor_trend_ratio": ("instability_precursor", "trend_ratio"),
    "precursor_sudden_ratio": ("instability_precursor", "sudden_ratio"),
    "precursor_warmup": ("instability_precursor", "warmup"),
    "precursor_logz_rise": ("instability_precursor", "logz_rise"),
    "precursor_update_rms": ("instability_precursor", "update_rms"),
    "precursor_update_min": ("instability_precursor", "update_min"),
    "rearm_steps": ("common", "rearm_steps"),
    "baseline_window": ("common", "baseline_window"),
    "warmup_steps": ("common", "warmup_steps"),
    "min_log_scale": ("common", "min_log_scale"),
    "max_named_params": ("common", "max_named_params"),
    "attention_probe": ("attention_logits", "probe"),
    "attention_every": ("attention_logits", "every"),
    "attention_logit_abs_min": ("attention_logits", "abs_min"),
    "attention_logit_ratio": ("attention_logits", "ratio"),
    "attention_logit_steps": ("attention_logits", "steps"),
    "attention_logit_warmup": ("attention_logits", "warmup"),
}
"""Where each flat `DetectorConfig` field of the version before the sections now lives."""

@sections.accept_flat_names(DETECTOR_FLAT_NAMES)
@dataclass(kw_only=True, slots=True)
class DetectorConfig:
    """The built-in detectors' settings: one section per detector, named by the kind of event it
    raises, and `common`, what the adaptive ones share. Defaults are meant to stay silent on
    healthy runs."""

    PATH: ClassVar[str] = "detectors"

    common: CommonConfig = field(default_factory=CommonConfig)
    """Baseline window, warm-up, re-arming and noise floors the adaptive detectors share."""
    grad_explosion: GradExplosionConfig = field(default_factory=GradExplosionConfig)
    loss_spike: LossSpikeConfig = field(default_factory=LossSpikeConfig)
    loss_divergence: LossDivergenceConfig = field(default_factory=LossDivergenceConfig)
    bad_start: BadStartConfig = field(default_factory=BadStartConfig)
    update_too_large: UpdateTooLargeConfig = field(default_factory=UpdateTooLargeConfig)
    extreme_weight: ExtremeWeightConfig = field(default_factory=ExtremeWeightConfig)
    fp16_overflow: Fp16OverflowConfig = field(default_factory=Fp16OverflowConfig)
    lr_change: LRChangeConfig = field(default_factory=LRChangeConfig)
    lr_at_zero: LRAtZeroConfig = field(default_factory=LRAtZeroConfig)
    dead_units: DeadUnitsConfig = field(default_factory=DeadUnitsConfig)
    output_collapse: OutputCollapseConfig = field(default_factory=OutputCollapseConfig)
    metric_collapse: MetricCollapseConfig = field(default_factory=MetricCollapseConfig)
    no_gradients: NoGradientsConfig = field(default_factory=NoGradientsConfig)
    params_unfrozen: ParamsUnfrozenConfig = field(default_factory=ParamsUnfrozenConfig)
    no_progress: NoProgressConfig = field(default_factory=NoProgressConfig)
    instability_precursor: InstabilityPrecursorConfig = field(
        default_factory=InstabilityPrecursorConfig)
    attention_logits: AttentionLogitsConfig = field(default_factory=AttentionLogitsConfig)
    """The attention-logit probe and its `instability_precursor` warning."""
    kl_blowup: KLBlowupConfig = field(default_factory=KLBlowupConfig)
    reward_dead: RewardDeadConfig = field(default_factory=RewardDeadConfig)
    entropy_collapse: EntropyCollapseConfig = field(default_factory=EntropyCollapseConfig)
    ratio_far_from_one: RatioFarFromOneConfig = field(default_factory=RatioFarFromOneConfig)
    completion_length_collapse: CompletionLengthCollapseConfig = field(
        default_factory=CompletionLengthCollapseConfig)
    completions_truncated: CompletionsTruncatedConfig = field(
        default_factory=CompletionsTruncatedConfig)
    preference_unlearned: PreferenceUnlearnedConfig = field(
        default_factory=PreferenceUnlearnedConfig)
    margins_exploding: MarginsExplodingConfig = field(default_factory=MarginsExplodingConfig)
    chosen_likelihood_falling: ChosenLikelihoodFallingConfig = field(
        default_factory=ChosenLikelihoodFallingConfig)
    reward_hacking: RewardHackingConfig = field(default_factory=RewardHackingConfig)
    policy_off_reference: PolicyOffReferenceConfig = field(
        default_factory=PolicyOffReferenceConfig)

    def __post_init__(self) -> None:
        sections.build_sections(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DetectorConfig:
        """The detectors' settings `GuardConfig.to_dict()` stored under "detectors", or the flat
        ones an older version stored (read without a warning: a store is not the user's code)."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"detectors: expected a dict of fields, got {type(data).__name__}")
        fields = {f.name for f in dataclasses.fields(cls)}
        moved = sections.move_flat_names(data, DETECTOR_FLAT_NAMES, fields)
        return sections.section(cls, moved, cls.PATH)
