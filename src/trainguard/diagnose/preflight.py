"""Preflight audit: inspect the real model, optimizer and scheduler before training starts.

Each check is a small function of a `RunSetup` returning findings with severity, evidence and the
guide's fix made concrete for this run. The audit never changes training state: the scheduler is
probed on its saved state and restored, bit for bit.

Checks (name: what it looks at, guide section):
    mode_and_lr       fine-tuning mode from the trainable parameters, and the LR against the
                      Adam(W) ranges: full 1e-6..5e-5, LoRA / new head 1e-4..5e-3 (§3.1); small
                      models are allowed more, LoRA adapters never (their range is their own):
                      the range sized to the model, `lr_range.py`, which the cause ranking's
                      LR advice names too
    warmup            whether the schedule warms up, read by probing it; a warning only where a
                      missing warmup matters (an adaptive optimizer at an LR near the top of its
                      range: its upper half on a pre-trained or large model), else a note (§3.1,
                      §6). A guarded run holds it until its first steps show the LRs really used
                      (`warmup_watch.py`: a loop may warm the LR up itself)
    lora_scaling      LoRA alpha/r (alpha/sqrt(r) under rsLoRA) above 2, lora_dropout, QLoRA double
                      quantisation (§5.1, §5.3)
    adam_settings     Adam eps below 1e-8 or beta2 below 0.99, worse under float16 (§5.3)
    layer_init        trainable layers whose weight scale is far above Kaiming / std 0.02 (§3.3.1)
    precision         float16 autocast without a GradScaler; float16 weights being trained (§3.3.2)
    frozen_parts      an autoencoder (VAE) or text encoder beside the denoiser, found by what it
                      is, whose parameters are in the optimizer (§5.2)
    weight_decay      a weight decay that alone takes 1% or more of every weight's norm a
                      step (lr x weight_decay, decoupled or SGD's), which the gradients cannot
                      outpace (§3.1)
    clipping          no gradient clipping configured (§2.1)
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from trainguard.diagnose.lr_range import (
    MODE_WORDS,
    fine_tuning_mode,
    is_adam,
    peft_configs,
    pretrained_evidence,
    sane_lr,
)
from trainguard.diagnose.model_parts import fixed_parts
from trainguard.diagnose.schedule_end import run_length, schedule_end
from trainguard.events import Severity
from trainguard.finding import Finding

HF_INIT_STD = 0.02
INIT_SCALE_LIMIT = 10.0
"""A layer whose weight std is this many times both Kaiming's 1/sqrt(fan_in) and 0.02 is badly
initialised; 10x that is an error."""
WARMUP_PROBE_STEPS = 200
WARMUP_SHARE = (0.05, 0.1)
"""A warmup of 5-10% of the run; the guide's 500 steps is that share of a run of 5k-10k steps."""
WARMUP_NEAR_TOP = 0.5
"""A peak LR at or above this share of the most the model tolerates (the top of the Adam(W) range
for its mode, times the small-model allowance) is near the top of its range."""
LORA_SCALING_COMMON = 2.0
"""alpha = 2r (alpaca-lora's r=8, lora_alpha=16) is the most common LoRA setting, and rsLoRA's
alpha/sqrt(r) scaling is judged alike (r=64, alpha=16 under rsLoRA: 2): no finding up to here."""
LORA_SCALING_RISKY = 4.0
"""Above this the adapter's effective step is more than 4x the LR: a warning. With Adam the
adapter weights move by about the LR each step whatever the scaling, so the update of the merged
weight grows with alpha/r. Already at 4 (alpha=32, r=8), an LR of 2e-4 is a reported source of
instability in LLaMA-class fine-tunes: beyond it the risk is real. 4 itself is the PEFT README's
example (r=8, lora_alpha=32), widely run without trouble: a note, not a warning."""
LORA_SCALING_ERROR = 16.0


DECAY_PER_STEP = 1e-2
"""A weight decay that takes this share of every weight's norm a step on its own (lr x
weight_decay when the decay is decoupled, as AdamW's and Lion's; lr x weight_decay / (1 -
momentum) for SGD's, whose momentum sums the decay term with the gradient) halves an untrained
weight in under 70 steps (ln 2 / 0.01): the gradients must restore that share at every step
just to stand still. The usual settings take 1e-7 to 1e-4 a step (AdamW at 2e-5 x 0.01 in a
fine-tune, 6e-4 x 0.1 in pre-training; SGD at 0.1 x 1e-4 with momentum 0.9)."""
USUAL_DECAY = 1e-4
"""The per-step decay the advice aims at: the top of the usual range."""


@dataclass
class RunSetup:
    model: nn.Module
    optimizers: list[torch.optim.Optimizer]
    scheduler: Any = None
    scaler: Any = None
    autocast_dtype: torch.dtype | None = None
    """The dtype of the autocast region the forward runs under, when known."""
    max_grad_norm: float | None = None
    clipping_known: bool = False
    """Whether `clip.max_grad_norm` says something (the Guard knows; a bare audit does not)."""
    total_steps: int | None = None
    """The run's length in optimizer steps, when the caller knows it (else read from the
    scheduler where it says)."""
    details: dict[str, Any] = field(default_factory=dict)


def _named_trainable(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def _initial_lr(setup: RunSetup) -> float | None:
    base = getattr(setup.scheduler, "base_lrs", None)
    values = list(base) if base else [g.get("lr") for o in setup.optimizers
                                        for g in o.param_groups]
    numbers = [float(v) for v in values if v is not None]
    return max(numbers) if numbers else None


ADAPTIVE_NAMES = ("adam", "adagrad", "adadelta", "rmsprop", "adafactor", "lamb", "lion", "sophia")
"""Optimizers (by class name, lower case) whose steps are normalised per weight: their first
updates move every weight by about the LR whatever the gradient's size, before their moment
estimates have settled. This is what a warmup protects against."""


def _is_adaptive(optimizer: torch.optim.Optimizer) -> bool:
    name = type(optimizer).__name__.lower()
    return any(part in name for part in ADAPTIVE_NAMES)


def _is_rectified(optimizer: torch.optim.Optimizer) -> bool:
    """RAdam: its variance rectification is a built-in warmup."""
    return "radam" in type(optimizer).__name__.lower()


def _total_steps(setup: RunSetup) -> int | None:
    return setup.total_steps or run_length(setup.scheduler)


def warmup_advice(total_steps: int | None) -> str:
    """The guide's warmup (500 steps, or 5-10% of training) made concrete for a run of
    `total_steps` steps when known."""
    if total_steps is None:
        return "~5-10% of training"
    low, high = (max(1, round(share * total_steps)) for share in WARMUP_SHARE)
    steps = f"{low}-{high} steps" if high > low else f"{low} step{'s' if low > 1 else ''}"
    return f"~{steps} (5-10% of this run's {total_steps})"


def check_mode_and_lr(setup: RunSetup) -> list[Finding]:
    """The LR against the sane range of the model and its optimizer (`lr_range.sane_lr`, the
    range the cause ranking's advice names too). Adam-family optimizers only: the guide gives
    no range for others. Above the top: a warning; 10x above it, an error. On a small model
    with no sign of pre-training the top is the guide's range stretched to its size (the
    small-model allowance), a guess: below 10x of it, a note, and the run's signals decide."""
    sane = sane_lr(setup.model, setup.optimizers)
    setup.details["mode"] = sane.mode
    lr = _initial_lr(setup)
    if lr is None or sane.low is None or sane.high is None:
        return []
    low, high = sane.guide
    allowance = sane.allowance
    evidence = {"mode": sane.mode, "lr": lr, "range": [low, high], "params": sane.params,
                "small_model_allowance": allowance, "sane_range": [sane.low, sane.high]}
    if lr > sane.high:
        ratio = lr / high
        severity: Severity = "error" if ratio >= 10 * allowance else "warning"
        if severity == "warning" and sane.pretrained is None and allowance > 1:
            # the top is the guide's range stretched to a small model's size, a guess that is
            # off by a few times either way: below 10x of it the run's own signals decide
            severity = "info"
        size_note = (f" (allowing {allowance:.0f}x more for a model of {sane.params / 1e6:.3g}M "
                     "parameters)" if allowance > 1 else "")
        times = f"{ratio:,.0f}" if ratio >= 10 else f"{ratio:.3g}"
        return [Finding("mode_and_lr", severity,
                        f"LR {lr:.3g} is {times}x the top of the Adam(W) range for "
                        f"{MODE_WORDS[sane.mode]} ({low:g} to {high:g}){size_note}.",
                        f"use at most {sane.high:.3g} for this model (the guide's "
                        f"{high:g} for large pre-trained ones), with a warmup of "
                        f"{warmup_advice(_total_steps(setup))} and cosine decay.",
                        cause="lr_too_high", evidence={**evidence, "ratio": ratio})]
    if lr < sane.low / 10:
        return [Finding("mode_and_lr", "info",
                        f"LR {lr:.3g} is far below the range for this model: {sane.sized()}; "
                        "training may barely move.", f"try {sane.low:.3g} or more.",
                        cause="lr_too_low", evidence=evidence)]
    return []


def probe_schedule(optimizer: torch.optim.Optimizer, scheduler: Any,
                   steps: int = WARMUP_PROBE_STEPS) -> list[float]:
    """The LR of the first param group over the next `steps` scheduler steps, without changing
    the scheduler or the optimizer (their state is saved and restored)."""
    saved = copy.deepcopy(scheduler.state_dict())
    saved_groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    lrs = [float(optimizer.param_groups[0]["lr"])]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(steps):
                scheduler.step()
                lrs.append(float(optimizer.param_groups[0]["lr"]))
    except Exception:  # schedules with a fixed length may refuse to go past their end
        pass
    finally:
        scheduler.load_state_dict(saved)
        for group, values in zip(optimizer.param_groups, saved_groups, strict=True):
            group.update(values)
    return lrs


def check_warmup(setup: RunSetup) -> list[Finding]:
    """No warmup: the schedule starts at more than half its peak (probed, or no scheduler).

    A warning only where that matters; a note (severity info) otherwise, with the same cause:

    - The optimizer: an adaptive one (Adam, AdamW and kin, Adafactor, Lion, RMSprop...:
      `ADAPTIVE_NAMES`) moves every weight by about the LR in its first steps, before its moment
      estimates have settled, whatever the gradient's size: that is what a warmup protects. SGD,
      with or without momentum, steps in proportion to the gradient: a note. So is RAdam, whose
      rectification is a built-in warmup.
    - Adam-family optimizers: the peak LR against the most the model tolerates, the top of the
      guide's Adam(W) range for its fine-tuning mode times the small-model allowance (as in
      `check_mode_and_lr`). On a pre-trained or large model (`pretrained_evidence`: peft adapters
      or a frozen backbone, >= `PRETRAINED_PARAMS` parameters, loaded from a checkpoint) a
      warning from `WARMUP_NEAR_TOP` (half) of it: full-size first steps in the upper half of the
      range can throw the pre-trained weights out of the basin the fine-tune starts in. On a small
      model with no sign of pre-training, a warning from the top of the range itself (it has no
      pre-trained features to lose; above the top, `mode_and_lr` warns too). Lower LRs: a note
      (the public LoRA and full fine-tuning examples run there without warmup).
    - Other adaptive optimizers have no known LR range: a warning on a pre-trained or large model,
      a note otherwise.

    The fix scales the guide's warmup (500 steps, or 5-10% of training) to the run's length where
    it is known (`RunSetup.total_steps`, else `run_length` of the scheduler).
    """
    optimizer = setup.optimizers[0]
    if setup.scheduler is None:
        lrs = [float(optimizer.param_groups[0]["lr"])]
    else:
        lrs = probe_schedule(optimizer, setup.scheduler)
    setup.details["lr_schedule_head"] = lrs[:10]
    # the LR the first steps take: the probed group's peak, or another group's if higher
    others = [float(g["lr"]) for o in setup.optimizers for g in o.param_groups
              if isinstance(g.get("lr"), (int, float))]
    where = "no scheduler" if setup.scheduler is None else "the schedule starts at its peak"
    return judge_warmup(setup, lrs, others, f"{where}: LR {{first}} at step 0, peak {{peak}}")


def judge_warmup(setup: RunSetup, lrs: list[float], others: list[float], source: str,
                 extra: dict[str, Any] | None = None) -> list[Finding]:
    """The `warmup` finding (as `check_warmup` judges it) for a run whose first LRs are `lrs`
    (probed from the schedule, or observed in a guarded run), `others` the LRs of its other
    param groups; none if it warms up (starts at half its peak or less). `source` says where the
    LRs come from, with `{first}` and `{peak}` to fill in; `extra` joins the evidence."""
    optimizer = setup.optimizers[0]
    peak = max(lrs)
    if not peak > 0 or lrs[0] <= 0.5 * peak:  # NaN-safe: an LR of NaN is mode_and_lr's matter
        return []
    lr = max([peak, *others])
    mode = fine_tuning_mode(setup.model)
    params = sum(p.numel() for p in setup.model.parameters())
    pretrained = pretrained_evidence(setup.model)
    total = _total_steps(setup)
    name = type(next((o for o in setup.optimizers if _is_adaptive(o)), optimizer)).__name__
    evidence: dict[str, Any] = {"lr_head": lrs[:5], "optimizer": name, "mode": mode,
                                "params": params, "pretrained": pretrained,
                                "total_steps": total, **(extra or {})}
    adaptive = any(_is_adaptive(o) for o in setup.optimizers)
    evidence["adaptive"] = adaptive
    adam = all(is_adam(o) for o in setup.optimizers)
    on = (f"a pre-trained or large model ({pretrained})" if pretrained
          else "a small model with no sign of pre-training")
    if any(_is_rectified(o) for o in setup.optimizers):
        risky, why = False, f"{name} rectifies its early steps itself, a built-in warmup"
    elif not adaptive:
        risky, why = False, (f"{name} steps in proportion to the gradient, so its first steps are "
                             "not inflated as an adaptive optimizer's are")
    elif adam:
        tolerated = sane_lr(setup.model, setup.optimizers).high
        assert tolerated is not None  # an Adam-family optimizer has its range
        share = lr / tolerated
        threshold = WARMUP_NEAR_TOP if pretrained else 1.0
        evidence.update(tolerated_lr=tolerated, lr_share=share, threshold=threshold)
        risky = share >= threshold
        where = ("above the top of" if share > 1 else "near the top of"
                 if share >= WARMUP_NEAR_TOP else "in the lower half of")
        why = (f"LR {lr:.3g} is {share:.3g}x the most this model tolerates with a warmup "
               f"({tolerated:.3g}), {where} its range, on {on}")
    else:
        risky = pretrained is not None
        why = f"{name} moves every weight by about the LR from its first step, on {on}"
    fix = (f"warm the LR up linearly from ~0 over {warmup_advice(total)}, then cosine decay, "
           "e.g. transformers.get_cosine_schedule_with_warmup.")
    said = source.format(first=f"{lrs[0]:.3g}", peak=f"{peak:.3g}")
    head = f"No learning-rate warmup ({said}) with {name}"
    if risky:
        return [Finding("warmup", "warning",
                        f"{head}: {why}; its first steps act before the optimizer's moment "
                        "estimates have settled.", fix, cause="missing_warmup",
                        evidence=evidence)]
    return [Finding("warmup", "info", f"{head}; a low risk here: {why}.",
                    f"if the first steps spike: {fix}", cause="missing_warmup",
                    evidence=evidence)]


def _lora_scalings(config: Any) -> list[tuple[str, int, float]]:
    """(where, r, alpha) of a LoRA config: its defaults, and per-module `rank_pattern` /
    `alpha_pattern` entries."""
    r, alpha = getattr(config, "r", None), getattr(config, "lora_alpha", None)
    if not r or alpha is None:
        return []
    out = [("", r, alpha)]
    ranks = getattr(config, "rank_pattern", None) or {}
    alphas = getattr(config, "alpha_pattern", None) or {}
    for key in sorted(set(ranks) | set(alphas)):
        pattern_r, pattern_alpha = ranks.get(key, r), alphas.get(key, alpha)
        if pattern_r:
            out.append((f" for {key!r}", pattern_r, pattern_alpha))
    return out


def check_lora_scaling(setup: RunSetup) -> list[Finding]:
    """LoRA's scaling: alpha/r, or alpha/sqrt(r) under rsLoRA (`use_rslora`, designed for that
    scaling: r=64, alpha=16 gives 2). With Adam the adapter weights move by about the LR each
    step, so the merged weight's update grows with the scaling. Up to `LORA_SCALING_COMMON` (2,
    alpha = 2r as in alpaca-lora): no finding. Up to `LORA_SCALING_RISKY` (4): a note. Above: a
    warning; from `LORA_SCALING_ERROR` (16): an error. lora_dropout 0: a note."""
    findings = []
    for config in peft_configs(setup.model):
        rslora = bool(getattr(config, "use_rslora", False))
        worst: tuple[float, str, int, float] | None = None
        for where, r, alpha in _lora_scalings(config):
            scaling = alpha / math.sqrt(r) if rslora else alpha / r
            if worst is None or scaling > worst[0]:
                worst = (scaling, where, r, alpha)
        if worst is not None and worst[0] > LORA_SCALING_COMMON:
            scaling, where, r, alpha = worst
            evidence = {"r": r, "lora_alpha": alpha, "scaling": scaling, "use_rslora": rslora}
            formula = "alpha/sqrt(r)" if rslora else "alpha/r"
            severity: Severity = ("error" if scaling >= LORA_SCALING_ERROR else "warning"
                        if scaling > LORA_SCALING_RISKY else "info")
            suggested = (2 * math.sqrt(r) if rslora else 2 * r)
            risk = f"adapter updates are amplified {scaling:g}x"
            if severity == "info":
                risk += (f", above the common {LORA_SCALING_COMMON:g} (alpha = 2r); fine at "
                         "moderate LRs")
            findings.append(Finding(
                "lora_scaling", severity,
                f"LoRA scaling {formula} = {scaling:g}{where} (alpha {alpha}, r {r}): {risk}.",
                f"set lora_alpha to r or 2r (at most {suggested:g} for r={r}"
                f"{' under rsLoRA' if rslora else ''}), or lower the LR by {scaling / 2:g}x.",
                cause="lora_scaling", evidence=evidence))
        dropout = getattr(config, "lora_dropout", None)
        if dropout is not None and dropout == 0:
            findings.append(Finding("lora_scaling", "info", "lora_dropout is 0.",
                                    "the guide recommends lora_dropout=0.1.",
                                    evidence={"r": r, "lora_alpha": alpha,
                                              "use_rslora": rslora}))
    quant = getattr(getattr(setup.model, "config", None), "quantization_config", None)
    if quant is not None:
        get = quant.get if isinstance(quant, dict) else lambda k, d=None: getattr(quant, k, d)
        if get("load_in_4bit", False) and not get("bnb_4bit_use_double_quant", False):
            findings.append(Finding("lora_scaling", "info",
                                    "4-bit quantisation without double quantisation.",
                                    "set bnb_4bit_use_double_quant=True (guide §5.3).",
                                    evidence={"quantization_config": str(quant)[:200]}))
    return findings


def _half_training(setup: RunSetup) -> list[str]:
    return [n for n, p in _named_trainable(setup.model) if p.dtype == torch.float16]


def check_adam_settings(setup: RunSetup) -> list[Finding]:
    fp16 = bool(_half_training(setup))  # float16 optimizer state, not just float16 autocast
    findings = []
    for optimizer in setup.optimizers:
        for index, group in enumerate(optimizer.param_groups):
            eps, betas = group.get("eps"), group.get("betas")
            if eps is None or betas is None or not is_adam(optimizer):
                continue
            beta2 = float(betas[1])
            problems = []
            if eps < 1e-8:
                problems.append(f"eps {eps:g} < 1e-8")
            if fp16 and eps < 1e-6:
                problems.append(f"eps {eps:g} < 1e-6 with float16 weights and state")
            if beta2 < 0.99:
                problems.append(f"beta2 {beta2:g} < 0.99")
            if not problems:
                continue
            adam_severity: Severity = ("error" if (eps < 1e-8 and (beta2 < 0.99 or fp16))
                                       else "warning")
            findings.append(Finding(
                "adam_settings", adam_severity,
                f"{type(optimizer).__name__} group {index}: {', '.join(problems)}: tiny second "
                "moments make m/(sqrt(v)+eps) huge.",
                "use betas=(0.9, 0.999) and eps=1e-8 (1e-6 or more when states are float16).",
                cause="optimizer_eps", evidence={"eps": eps, "betas": list(betas), "fp16": fp16}))
    return findings


def check_layer_init(setup: RunSetup) -> list[Finding]:
    findings = []
    for name, module in setup.model.named_modules():
        weight = getattr(module, "weight", None)
        if not isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)) or (
                weight is None or not weight.requires_grad or weight.numel() < 2):
            continue
        fan_in = weight[0].numel()
        with torch.no_grad():
            std = float(weight.float().std())
        expected = max(HF_INIT_STD, 1 / math.sqrt(fan_in))
        ratio = std / expected
        if not ratio >= INIT_SCALE_LIMIT:  # NaN-safe: a NaN std is flagged
            continue
        init_severity: Severity = "error" if not ratio < INIT_SCALE_LIMIT * 10 else "warning"
        findings.append(Finding(
            "layer_init", init_severity,
            f"{name or 'model'}.weight has std {std:.3g}, {ratio:.3g}x the usual initial scale "
            f"{expected:.3g} (Kaiming 1/sqrt(fan_in) with fan_in {fan_in}, or 0.02).",
            f"re-initialise it: nn.init.normal_({name}.weight, std=0.02) for a new head "
            "(Kaiming for hidden layers), bias zero.", cause="bad_init",
            evidence={"param": f"{name}.weight", "std": std, "expected": expected,
                      "ratio": ratio}))
    return findings


def check_precision(setup: RunSetup) -> list[Finding]:
    findings = []
    if setup.autocast_dtype == torch.float16 and setup.scaler is None:
        findings.append(Finding("precision", "error",
                                "float16 autocast without a GradScaler: small gradients underflow "
                                "to zero and large ones overflow.",
                                "scale the loss with torch.amp.GradScaler, or use bfloat16.",
                                cause="fp16_overflow"))
    half = _half_training(setup)
    if half:
        findings.append(Finding("precision", "error",
                                f"{len(half)} trainable parameter(s) are stored in float16 (e.g. "
                                f"{half[0]}): updates below float16 resolution are lost and Adam "
                                "state under/overflows.",
                                "keep float32 master weights (autocast for speed) or use bfloat16.",
                                cause="optimizer_eps" if any(
                                    g.get("eps", 1) < 1e-6 for o in setup.optimizers
                                    for g in o.param_groups) else "fp16_overflow",
                                evidence={"params": half[:5]}))
    return findings


def _optimized(setup: RunSetup) -> set[int]:
    return {id(p) for o in setup.optimizers for g in o.param_groups for p in g["params"]}


PART_WORDS = {"autoencoder": "autoencoder (VAE)", "text_encoder": "text encoder"}


def check_frozen_parts(setup: RunSetup) -> list[Finding]:
    """An autoencoder or text encoder beside the denoiser (found by what it is:
    `model_parts.fixed_parts`) whose parameters the optimizer updates. A diffusion fine-tune
    trains the UNet (or its LoRA); an autoencoder that moves shifts the latents the UNet
    learned to denoise, and its decoder turns samples into colour noise (§5.2). Parameters that
    require gradients but are in no optimizer are not trained: no finding."""
    optimized = _optimized(setup)
    findings = []
    for part in fixed_parts(setup.model):
        trained = [f"{part.name}.{n}" for n, p in part.module.named_parameters()
                   if p.requires_grad and id(p) in optimized]
        if not trained:
            continue
        count = sum(p.numel() for p in part.module.parameters()
                    if p.requires_grad and id(p) in optimized)
        what = PART_WORDS[part.role]
        findings.append(Finding(
            "frozen_parts", "warning",
            f"the {what} '{part.name}' ({type(part.module).__name__}) is being trained beside "
            f"the denoiser: {len(trained)} of its tensors ({count:,} weights, e.g. "
            f"{trained[0]}) are in the optimizer; fine-tuning it shifts the latents the UNet "
            "denoises and turns samples into colour noise.",
            f"freeze it and keep it out of the optimizer: {part.name}.requires_grad_(False), "
            "and build the optimizer from the denoiser's parameters only "
            "(trainguard.recipes.freeze_parts does both).",
            cause="unfrozen_part",
            evidence={"part": part.name, "role": part.role, "class": type(part.module).__name__,
                      "params": trained[:5], "weights": count}))
    return findings


def check_schedule_end(setup: RunSetup) -> list[Finding]:
    """A scheduler that ends at LR 0 before the run does (`schedule_end.py`), where the run's
    length is known (under a trainer)."""
    return schedule_end(setup.scheduler, setup.total_steps)


def decay_per_step(optimizer: torch.optim.Optimizer, group: dict[str, Any]) -> float | None:
    """The share of every weight's norm the group's weight decay alone takes a step, at the
    group's peak LR (`initial_lr`, which a scheduler sets, or its LR); None when it has none or
    it is not a rate of its own: an adaptive optimizer's coupled decay (Adam's, RMSprop's)
    joins the gradient before the normalisation, which rescales it."""
    decay = float(group.get("weight_decay") or 0.0)
    lr = group.get("initial_lr", group.get("lr"))
    if not decay > 0 or not isinstance(lr, (int, float)) or not lr > 0:
        return None
    name = type(optimizer).__name__.lower()
    if group.get("decoupled_weight_decay") or "adamw" in name or "lion" in name:
        return float(lr) * decay
    if name == "sgd":
        momentum = float(group.get("momentum") or 0.0)
        if momentum == 0.0:
            return float(lr) * decay
        if momentum >= 1.0:
            return None
        return float(lr) * decay * (1.0 - float(group.get("dampening") or 0.0)) / (1.0 - momentum)
    return None


def check_weight_decay(setup: RunSetup) -> list[Finding]:
    """A weight decay that takes `DECAY_PER_STEP` or more of every weight's norm a step."""
    findings = []
    for optimizer in setup.optimizers:
        for index, group in enumerate(optimizer.param_groups):
            rate = decay_per_step(optimizer, group)
            if rate is None or rate < DECAY_PER_STEP:
                continue
            decay, lr = float(group["weight_decay"]), group.get("initial_lr", group.get("lr"))
            sgd = type(optimizer).__name__.lower() == "sgd" and float(group.get("momentum") or 0)
            findings.append(Finding(
                "weight_decay", "warning",
                f"{type(optimizer).__name__} group {index}: weight_decay {decay:g} at LR "
                f"{lr:.3g} takes {rate:.2%} of every weight's norm a step on its own"
                f"{' (its momentum sums the decay too)' if sgd else ''}, half of it in "
                f"{math.log(2) / min(rate, 0.99):.0f} steps: the gradients must win that back "
                "at every step, so the weights shrink toward 0 and the model stays near a "
                f"constant output (the usual settings take 1e-7 to 1e-4 a step).",
                f"lower weight_decay to {decay * USUAL_DECAY / rate:.2g} or less (1e-4 of the "
                "weights a step at this LR; the usual values: 1e-4 to 5e-4 for SGD at LR 0.1, "
                "0.01 to 0.1 for AdamW).",
                cause="weight_decay_too_high",
                evidence={"weight_decay": decay, "lr": lr, "decay_per_step": rate,
                          "group": index}))
    return findings


def check_clipping(setup: RunSetup) -> list[Finding]:
    if not setup.clipping_known or setup.max_grad_norm is not None:
        return []
    return [Finding("clipping", "info", "no gradient clipping is configured.",
                    "clip the global norm (max_grad_norm=1.0, the guide's default).")]


CHECKS: tuple[Callable[[RunSetup], list[Finding]], ...] = (
    check_mode_and_lr, check_warmup, check_lora_scaling, check_adam_settings, check_layer_init,
    check_precision, check_frozen_parts, check_schedule_end, check_weight_decay, check_clipping)


def preflight(model: nn.Module, optimizer: torch.optim.Optimizer | list[torch.optim.Optimizer],
              scheduler: Any = None, *, scaler: Any = None,
              autocast_dtype: torch.dtype | None = None,
              max_grad_norm: float | None = None,
              clipping_known: bool = False,
              total_steps: int | None = None) -> list[Finding]:
    """Audit a training setup before the first step; returns findings, worst first.
    `total_steps`: the run's length in optimizer steps, when known (the warmup advice is scaled
    to it; without it, the scheduler's own length is used where it says one)."""
    optimizers = optimizer if isinstance(optimizer, list) else [optimizer]
    setup = RunSetup(model=model, optimizers=optimizers, scheduler=scheduler, scaler=scaler,
                     autocast_dtype=autocast_dtype, max_grad_norm=max_grad_norm,
                     clipping_known=clipping_known, total_steps=total_steps)
    findings: list[Finding] = []
    for check in CHECKS:
        findings.extend(check(setup))
    order = {"critical": 0, "error": 1, "warning": 2, "info": 3}
    return sorted(findings, key=lambda f: order[f.severity])
