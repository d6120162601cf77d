"""Preflight audit: inspect the real model, optimizer and scheduler before training starts.

Each check is a small function of a `RunSetup` returning findings with severity, evidence and the
guide's fix made concrete for this run. The audit never changes training state: the scheduler is
probed on its saved state and restored, bit for bit.

Checks (name: what it looks at, guide section):
    mode_and_lr       fine-tuning mode from the trainable parameters, and the LR against the
                      Adam(W) ranges: full 1e-6..5e-5, LoRA / new head 1e-4..5e-3 (§3.1)
    warmup            whether the schedule warms up, read by probing it (§3.1, §6)
    lora_scaling      LoRA alpha/r > 1, lora_dropout, QLoRA double quantisation (§5.1, §5.3)
    adam_settings     Adam eps below 1e-8 or beta2 below 0.99, worse under float16 (§5.3)
    layer_init        trainable layers whose weight scale is far above Kaiming / std 0.02 (§3.3.1)
    precision         float16 autocast without a GradScaler; float16 weights being trained (§3.3.2)
    frozen_vae        a VAE in the model that is not frozen (§5.2)
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

from trainguard.diagnose.finding import Finding

FULL_LR_RANGE = (1e-6, 5e-5)
ADAPTER_LR_RANGE = (1e-4, 5e-3)
LARGE_MODEL_PARAMS = 1e8
"""The guide's Adam(W) ranges are for pre-trained models of this size and up..."""
SMALL_MODEL_PARAMS = 1e7
"""...models of this size and below commonly train at up to `SMALL_MODEL_LR_FACTOR` times higher
learning rates (1e-3 to 1e-2 for full training of small transformers); in between, the allowance
is interpolated in log space."""
SMALL_MODEL_LR_FACTOR = 100.0
HF_INIT_STD = 0.02
INIT_SCALE_LIMIT = 10.0
"""A layer whose weight std is this many times both Kaiming's 1/sqrt(fan_in) and 0.02 is badly
initialised; 10x that is an error."""
WARMUP_PROBE_STEPS = 200


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
    """Whether `max_grad_norm` says something (the Guard knows; a bare audit does not)."""
    details: dict[str, Any] = field(default_factory=dict)


def _named_trainable(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def fine_tuning_mode(model: nn.Module) -> str:
    """`lora` (peft adapters), `full` (most weights train) or `head` (a frozen backbone)."""
    trainable = _named_trainable(model)
    if any("lora_" in name for name, _ in trainable):
        return "lora"
    total = sum(p.numel() for p in model.parameters())
    share = sum(p.numel() for _, p in trainable) / max(total, 1)
    return "full" if share >= 0.5 else "head"


def _initial_lr(setup: RunSetup) -> float | None:
    base = getattr(setup.scheduler, "base_lrs", None)
    values = list(base) if base else [g.get("lr") for o in setup.optimizers
                                        for g in o.param_groups]
    numbers = [float(v) for v in values if v is not None]
    return max(numbers) if numbers else None


def _is_adam(optimizer: torch.optim.Optimizer) -> bool:
    return "adam" in type(optimizer).__name__.lower()


def small_model_lr_allowance(params: int) -> float:
    """How many times above the guide's LR range a model of `params` parameters still trains
    sanely: 1 for large pre-trained models, `SMALL_MODEL_LR_FACTOR` for small ones."""
    if params <= SMALL_MODEL_PARAMS:
        return SMALL_MODEL_LR_FACTOR
    if params >= LARGE_MODEL_PARAMS:
        return 1.0
    share = math.log(LARGE_MODEL_PARAMS / params) / math.log(LARGE_MODEL_PARAMS
                                                             / SMALL_MODEL_PARAMS)
    return SMALL_MODEL_LR_FACTOR ** share


def check_mode_and_lr(setup: RunSetup) -> list[Finding]:
    mode = fine_tuning_mode(setup.model)
    setup.details["mode"] = mode
    lr = _initial_lr(setup)
    if lr is None or not all(_is_adam(o) for o in setup.optimizers):
        return []
    low, high = FULL_LR_RANGE if mode == "full" else ADAPTER_LR_RANGE
    params = sum(p.numel() for p in setup.model.parameters())
    allowance = small_model_lr_allowance(params)
    name = {"full": "full fine-tuning", "lora": "LoRA", "head": "a new head on a frozen backbone"}
    evidence = {"mode": mode, "lr": lr, "range": [low, high], "params": params,
                "small_model_allowance": allowance}
    if lr > high * allowance:
        ratio = lr / high
        severity = "error" if ratio >= 10 * allowance else "warning"
        size_note = (f" (allowing {allowance:.3g}x more for a model of {params / 1e6:.3g}M "
                     "parameters)" if allowance > 1 else "")
        return [Finding("mode_and_lr", severity,
                        f"LR {lr:.3g} is {ratio:.3g}x the top of the Adam(W) range for "
                        f"{name[mode]} ({low:g} to {high:g}){size_note}.",
                        f"use at most {high * allowance:.3g} for this model (the guide's "
                        f"{high:g} for large pre-trained ones), with 500 warmup steps and "
                        "cosine decay.",
                        cause="lr_too_high", evidence={**evidence, "ratio": ratio})]
    if lr < low / 10:
        return [Finding("mode_and_lr", "info",
                        f"LR {lr:.3g} is far below the range for {name[mode]} ({low:g} to "
                        f"{high:g}); training may barely move.", f"try {low:g} or more.",
                        evidence=evidence)]
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
    optimizer = setup.optimizers[0]
    if setup.scheduler is None:
        lrs = [float(optimizer.param_groups[0]["lr"])]
    else:
        lrs = probe_schedule(optimizer, setup.scheduler)
    peak = max(lrs)
    setup.details["lr_schedule_head"] = lrs[:10]
    if peak <= 0 or lrs[0] <= 0.5 * peak:
        return []
    where = "no scheduler" if setup.scheduler is None else "the schedule starts at its peak"
    return [Finding("warmup", "warning",
                    f"No learning-rate warmup ({where}: LR {lrs[0]:.3g} at step 0, peak "
                    f"{peak:.3g}).",
                    "warm the LR up linearly from ~0 (the guide: 500 steps, or ~5-10% of "
                    "training), then cosine decay, e.g. transformers.get_cosine_schedule_with_"
                    "warmup.", cause="missing_warmup", evidence={"lr_head": lrs[:5]})]


def _peft_configs(model: nn.Module) -> list[Any]:
    configs = getattr(model, "peft_config", None)
    return list(configs.values()) if isinstance(configs, dict) else []


def check_lora_scaling(setup: RunSetup) -> list[Finding]:
    findings = []
    for config in _peft_configs(setup.model):
        r, alpha = getattr(config, "r", None), getattr(config, "lora_alpha", None)
        if not r or alpha is None:
            continue
        rslora = bool(getattr(config, "use_rslora", False))
        scaling = alpha / math.sqrt(r) if rslora else alpha / r
        evidence = {"r": r, "lora_alpha": alpha, "scaling": scaling, "use_rslora": rslora}
        if scaling > 1:
            severity = "error" if scaling >= 16 else "warning"
            findings.append(Finding(
                "lora_scaling", severity,
                f"LoRA scaling alpha/{'sqrt(r)' if rslora else 'r'} = {scaling:g} (alpha "
                f"{alpha}, r {r}) is above 1: adapter updates are amplified {scaling:g}x.",
                f"set lora_alpha <= r (e.g. lora_alpha={r} for r={r}).", cause="lora_scaling",
                evidence=evidence))
        dropout = getattr(config, "lora_dropout", None)
        if dropout is not None and dropout == 0:
            findings.append(Finding("lora_scaling", "info", "lora_dropout is 0.",
                                    "the guide recommends lora_dropout=0.1.", evidence=evidence))
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
            if eps is None or betas is None or not _is_adam(optimizer):
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
            severity = "error" if (eps < 1e-8 and (beta2 < 0.99 or fp16)) else "warning"
            findings.append(Finding(
                "adam_settings", severity,
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
        severity = "error" if not ratio < INIT_SCALE_LIMIT * 10 else "warning"
        findings.append(Finding(
            "layer_init", severity,
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


def check_frozen_vae(setup: RunSetup) -> list[Finding]:
    trainable = [n for n, _ in _named_trainable(setup.model) if "vae" in n.lower().split(".")[0]
                 or ".vae." in f".{n.lower()}"]
    if not trainable:
        return []
    return [Finding("frozen_vae", "warning",
                    f"the VAE is being trained ({len(trainable)} parameter(s), e.g. "
                    f"{trainable[0]}); fine-tuning it causes colour-noise outputs.",
                    "freeze it: vae.requires_grad_(False), and keep it out of the optimizer.",
                    evidence={"params": trainable[:5]})]


def check_clipping(setup: RunSetup) -> list[Finding]:
    if not setup.clipping_known or setup.max_grad_norm is not None:
        return []
    return [Finding("clipping", "info", "no gradient clipping is configured.",
                    "clip the global norm (max_grad_norm=1.0, the guide's default).")]


CHECKS: tuple[Callable[[RunSetup], list[Finding]], ...] = (
    check_mode_and_lr, check_warmup, check_lora_scaling, check_adam_settings, check_layer_init,
    check_precision, check_frozen_vae, check_clipping)


def preflight(model: nn.Module, optimizer: torch.optim.Optimizer | list[torch.optim.Optimizer],
              scheduler: Any = None, *, scaler: Any = None,
              autocast_dtype: torch.dtype | None = None,
              max_grad_norm: float | None = None,
              clipping_known: bool = False) -> list[Finding]:
    """Audit a training setup before the first step; returns findings, worst first."""
    optimizers = optimizer if isinstance(optimizer, list) else [optimizer]
    setup = RunSetup(model=model, optimizers=optimizers, scheduler=scheduler, scaler=scaler,
                     autocast_dtype=autocast_dtype, max_grad_norm=max_grad_norm,
                     clipping_known=clipping_known)
    findings: list[Finding] = []
    for check in CHECKS:
        findings.extend(check(setup))
    order = {"critical": 0, "error": 1, "warning": 2, "info": 3}
    return sorted(findings, key=lambda f: order[f.severity])
