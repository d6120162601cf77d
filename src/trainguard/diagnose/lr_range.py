"""The sane learning-rate range of a run: the guide's Adam(W) range for its mode, sized to the
model.

The guide's ranges (§3.1) are for 7B-class pre-trained models under Adam(W): full fine-tuning
1e-6..5e-5, LoRA adapters (and a new head on a frozen backbone) 1e-4..5e-3. Smaller models train
at larger LRs, more so from scratch (`small_model_lr_allowance`); LoRA adapters keep their range
whatever the base's size (`lr_allowance`). `sane_lr` sizes the range to one model and optimizer;
the preflight judges the run's LR against it and the cause ranking's advice for `lr_too_high` and
`lr_too_low` names it (`SaneLR.fixes`), so both say the same range. Other optimizers have no
range in the guide: the advice then says so and names none.

Reads the model's parameters and config only: no torch import here, so the catalogue's words
(`GUIDE_RANGES`) reach a training log's analysis too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn

FULL_LR_RANGE = (1e-6, 5e-5)
ADAPTER_LR_RANGE = (1e-4, 5e-3)


def _short(lr: float) -> str:
    """An LR as the guide writes it: 1e-6, 5e-5."""
    return f"{lr:.0e}".replace("e-0", "e-")


GUIDE_RANGES = (f"Adam(W) {_short(FULL_LR_RANGE[0])}..{_short(FULL_LR_RANGE[1])} full "
                f"fine-tuning, {_short(ADAPTER_LR_RANGE[0])}..{_short(ADAPTER_LR_RANGE[1])} LoRA")
"""The guide's ranges in words, for 7B-class pre-trained models."""
LARGE_MODEL_PARAMS = 1e8
"""The guide's Adam(W) ranges are for pre-trained models of this size and up..."""
SMALL_MODEL_PARAMS = 1e7
"""...models of this size and below commonly train at up to `SMALL_MODEL_LR_FACTOR` times higher
learning rates (1e-3 to 1e-2 for full training of small transformers); in between, the allowance
is interpolated in log space."""
SMALL_MODEL_LR_FACTOR = 100.0
TINY_MODEL_PARAMS = 1e5
"""...and models of this size and below (tiny from-scratch models: a small UNet, an MLP) up to
`TINY_MODEL_LR_FACTOR` times (Adam at 1e-2 to 5e-2), interpolated in log space from 100x at
`SMALL_MODEL_PARAMS`."""
TINY_MODEL_LR_FACTOR = 1000.0
PRETRAINED_PARAMS = SMALL_MODEL_PARAMS
"""Models of this many parameters and more are treated as large (pre-trained, as a rule)."""
MODE_WORDS = {"full": "full fine-tuning", "lora": "LoRA",
              "head": "a new head on a frozen backbone"}


def fine_tuning_mode(model: nn.Module) -> str:
    """`lora` (peft adapters), `full` (most weights train) or `head` (a frozen backbone)."""
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if any("lora_" in name for name, _ in trainable):
        return "lora"
    total = sum(p.numel() for p in model.parameters())
    share = sum(p.numel() for _, p in trainable) / max(total, 1)
    return "full" if share >= 0.5 else "head"


def is_adam(optimizer: torch.optim.Optimizer) -> bool:
    """Adam, AdamW and their kin: the optimizers the guide's ranges are for."""
    return "adam" in type(optimizer).__name__.lower()


def peft_configs(model: nn.Module) -> list[Any]:
    configs = getattr(model, "peft_config", None)
    return list(configs.values()) if isinstance(configs, dict) else []


def small_model_lr_allowance(params: int, *, pretrained: bool = True) -> float:
    """How many times above the guide's LR range a model of `params` parameters still trains
    sanely: 1 for large pre-trained models, `SMALL_MODEL_LR_FACTOR` for small ones, and up to
    `TINY_MODEL_LR_FACTOR` for tiny models with no sign of pre-training (trained from scratch,
    or fine-tuned from a checkpoint the audit cannot see)."""
    if params >= LARGE_MODEL_PARAMS:
        return 1.0
    if params > SMALL_MODEL_PARAMS:
        share = math.log(LARGE_MODEL_PARAMS / params) / math.log(LARGE_MODEL_PARAMS
                                                                 / SMALL_MODEL_PARAMS)
        return SMALL_MODEL_LR_FACTOR ** share
    if pretrained or params >= SMALL_MODEL_PARAMS:
        return SMALL_MODEL_LR_FACTOR
    if params <= TINY_MODEL_PARAMS:
        return TINY_MODEL_LR_FACTOR
    share = math.log(SMALL_MODEL_PARAMS / params) / math.log(SMALL_MODEL_PARAMS
                                                             / TINY_MODEL_PARAMS)
    return SMALL_MODEL_LR_FACTOR * (TINY_MODEL_LR_FACTOR / SMALL_MODEL_LR_FACTOR) ** share


def has_adapters(model: nn.Module) -> bool:
    """peft LoRA adapters: trainable `lora_` parameters, or a peft config on the model."""
    return fine_tuning_mode(model) == "lora" or bool(peft_configs(model))


def lr_allowance(model: nn.Module, params: int) -> float:
    """How many times the top of the guide's range the model's LR may be. LoRA adapters: 1,
    whatever the model's size. The LoRA range is about the adapters (new, low-rank weights
    scaled by alpha/r), not about the size of the frozen base: a tiny base does not make larger
    adapter steps safe. Other models: `small_model_lr_allowance`."""
    if has_adapters(model):
        return 1.0
    return small_model_lr_allowance(params, pretrained=pretrained_evidence(model) is not None)


def pretrained_evidence(model: nn.Module) -> str | None:
    """What says that `model` is pre-trained (or large enough to be treated so), or None.

    Nothing says it for sure; the objects tell: peft adapters or a frozen backbone (fine-tuning
    modes `lora` and `head` train a small part of a model somebody trained before), a size of
    `PRETRAINED_PARAMS` or more, or a transformers / diffusers model whose config names the
    checkpoint it was loaded from (`from_pretrained` sets `name_or_path`; a model built from a
    config leaves it empty)."""
    mode = fine_tuning_mode(model)
    if mode == "lora" or peft_configs(model):
        return "peft adapters on a base model"
    if mode == "head":
        return "a frozen backbone"
    config = getattr(model, "config", None)
    name = (config.get("_name_or_path") if isinstance(config, dict)
            else getattr(config, "name_or_path", None) or getattr(config, "_name_or_path", None))
    if isinstance(name, str) and name:
        return f"loaded from {name!r}"
    params = sum(p.numel() for p in model.parameters())
    if params >= PRETRAINED_PARAMS:
        return f"{params / 1e6:.3g}M parameters"
    return None


@dataclass(frozen=True, slots=True)
class SaneLR:
    """The LR range a model trains sanely in under its optimizer. `high`: the top of the guide's
    range for the mode times `allowance`; `low`: the guide's own low end (a smaller model is
    allowed larger LRs, and still trains, slowly, at the guide's). Both None for an optimizer
    outside the Adam family, which the guide gives no range for."""

    mode: str
    optimizer: str
    params: int
    pretrained: str | None
    allowance: float
    low: float | None
    high: float | None

    @property
    def guide(self) -> tuple[float, float]:
        """The guide's range for the mode, for 7B-class pre-trained models."""
        return FULL_LR_RANGE if self.mode == "full" else ADAPTER_LR_RANGE

    def training(self) -> str:
        """What the run does, in words: the mode, and "from scratch" for a full run of a model
        with no sign of pre-training."""
        if self.mode == "full" and self.pretrained is None:
            return "training from scratch (no sign of pre-training)"
        return MODE_WORDS[self.mode]

    def sized(self) -> str:
        """The range and why it is that size, e.g. "Adam(W) 1e-06..0.0476 for training from
        scratch (no sign of pre-training) at 0.11M parameters (the guide's 1e-6..5e-5 is for
        7B-class pre-trained models; this size takes up to 952x more)"."""
        assert self.low is not None and self.high is not None
        said = f"Adam(W) {self.low:.3g}..{self.high:.3g} for {self.training()}"
        if self.mode == "lora":
            return f"{said}, whatever the base's size"
        if self.allowance <= 1:
            return said
        low, high = self.guide
        size = f"{self.params / 1e6:.3g}M"
        return (f"{said} at {size} parameters (the guide's {_short(low)}..{_short(high)} is "
                f"for 7B-class "
                f"pre-trained models; this size takes up to {self.allowance:.3g}x more)")

    def fixes(self) -> dict[str, str]:
        """The fixes of `lr_too_high` and `lr_too_low` made concrete for this run."""
        if self.low is None or self.high is None:
            why = f"the guide's ranges are Adam(W)'s and say nothing of {self.optimizer}"
            return {"lr_too_high": f"Lower {self.optimizer}'s LR ({why}): divide it by 10 to "
                                   "rescue a run, and warm it up.",
                    "lr_too_low": f"Raise {self.optimizer}'s LR ({why}); check the scheduler "
                                  "did not decay it to about 0."}
        return {"lr_too_high": f"Use at most {self.high:.3g}: {self.sized()}. Warm it up, then "
                               "cosine decay; to rescue a run, divide the LR by 10.",
                "lr_too_low": f"Raise the LR, 10x at a time, to at most {self.high:.3g} "
                              f"({self.sized()}); check the scheduler did not decay it to "
                              "about 0."}


def sane_lr(model: nn.Module, optimizers: list[torch.optim.Optimizer]) -> SaneLR:
    """The sane LR range of `model` trained by `optimizers` (`SaneLR`)."""
    mode = fine_tuning_mode(model)
    params = sum(p.numel() for p in model.parameters())
    allowance = lr_allowance(model, params)
    names = sorted({type(o).__name__ for o in optimizers})
    adam = bool(optimizers) and all(is_adam(o) for o in optimizers)
    low, high = FULL_LR_RANGE if mode == "full" else ADAPTER_LR_RANGE
    return SaneLR(mode=mode, optimizer=" and ".join(names) or "the optimizer", params=params,
                  pretrained=pretrained_evidence(model), allowance=allowance,
                  low=low if adam else None, high=high * allowance if adam else None)
