"""What a scenario is: a real small fine-tune, healthy or with one known fault.

A scenario's `build(seed)` returns a `Workload`: the model, optimizer, schedule and a
deterministic data stream, plus the loss and evaluation functions. Faults are part of the
workload (a bad learning rate, a poisoned batch at `onset_step`, ...), so every strategy that runs
the scenario meets exactly the same fault.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from trainguard.diagnose.causes import CAUSES

Batch = Any


@dataclass
class Workload:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    batch: Callable[[int, int], Batch]
    """batch(step, micro) -> the micro-batch `micro` of optimizer step `step` (deterministic)."""
    loss: Callable[[nn.Module, Batch, int], torch.Tensor]
    """loss(model, batch, step) -> scalar loss for one micro-batch (before accumulation scaling)."""
    evaluate: Callable[[nn.Module], float]
    """Held-out loss of the model in eval mode, without gradients (NaN if the model is broken)."""
    scheduler: Any = None
    scaler: torch.amp.GradScaler | None = None
    autocast: torch.dtype | None = None
    accumulation: int = 1
    batch_size: int = 0
    """The configured batch size (what a truncated loader silently falls short of)."""
    notes: dict[str, Any] = field(default_factory=dict)
    before_step: Callable[[int], None] | None = None
    """The training loop's own code at the start of step `step` (a fault made the way users
    make them: an LR changed, a layer unfrozen and added to the optimizer)."""
    skips_backward: Callable[[int], bool] | None = None
    """True for the steps whose loop forgets `loss.backward()`."""
    skips_zero_grad: Callable[[int], bool] | None = None
    """True for the steps after which the loop forgets `optimizer.zero_grad()`."""
    after_backward: Callable[[int], None] | None = None
    """The loop's own code between the backward passes and the step (a clip of its own)."""
    eval_every: int = 0
    eval_metrics: Callable[[nn.Module], dict[str, float]] | None = None
    """Every `eval_every` steps the loop evaluates the model and hands the metrics over."""
    metrics: Callable[[int], dict[str, Any]] | None = None
    """metrics(step) -> the training metrics the loss computation of step `step` produced
    (a DPO or GRPO loop's rewards, KL, entropy, under the names TRL logs), read after that
    step's loss; the loop hands them to `guard.step(..., metrics=...)`."""
    noise_scheduler: Any = None
    """A diffusion loop's noise scheduler, handed to the Guard (`Guard(noise_scheduler=...)`)."""
    kl_penalty: Any = None
    """An RL loop's holder of its KL penalty, whose `beta` the loss reads every step, handed to
    the Guard (`Guard(kl_penalty=...)`)."""
    surrogate: bool = False
    """The loss is a policy-gradient surrogate (GRPO's: near 0 by design, its level says
    nothing of progress): the loop hands `guard.step` no loss to judge, only the step's
    metrics, as the HF callback does for a GRPO trainer."""


@dataclass(frozen=True)
class Scenario:
    name: str
    family: str
    """Model family: gpt2, gpt2_lora, bert_cls, image_cls, diffusion, lstm."""
    build: Callable[[int], Workload]
    steps: int
    cause: str | None = None
    """Ground-truth cause code from trainguard.diagnose.causes, or None for a healthy run."""
    onset_step: int | None = None
    """First step at which the fault acts (0 for faults present from the start)."""
    sudden: bool = True
    """Sudden faults (a bad batch) are held to the latency target; gradual ones (a slow climb)
    are not."""
    severity: str = ""
    description: str = ""
    recoverable: bool = True
    """Whether a protection strategy can in principle bring this run back (a transient fault),
    as opposed to a configuration that stays broken whatever is skipped."""
    distributed: bool = False

    def __post_init__(self) -> None:
        if self.cause is not None and self.cause not in CAUSES:
            raise ValueError(f"{self.name}: unknown cause code {self.cause!r}")
        if (self.cause is None) != (self.onset_step is None):
            raise ValueError(f"{self.name}: a faulty scenario needs an onset_step, a healthy one "
                             "must not have one")

    @property
    def healthy(self) -> bool:
        return self.cause is None


FUSABLE: tuple[type[torch.optim.Optimizer], ...] = (
    torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD)


def make_fused(optimizer: torch.optim.Optimizer) -> bool:
    """Turn a workload's Adam, AdamW or SGD into its fused form in place, before its first step
    (what `fused=True` at construction sets: the groups' flag, which the step reads, and the
    optimizer's support for a GradScaler's `found_inf`). Groups added later inherit the flag
    from the defaults. Returns False, changing nothing, for another optimizer or one that has
    stepped already (its state was made unfused)."""
    if type(optimizer) not in FUSABLE or optimizer.state:
        return False
    for group in [optimizer.defaults, *optimizer.param_groups]:
        group["fused"], group["foreach"] = True, False
    optimizer._step_supports_amp_scaling = True  # type: ignore[attr-defined]
    if isinstance(optimizer, torch.optim.SGD):  # as SGD's constructor sets for fused
        optimizer._need_device_dtype_check_for_fused = True  # type: ignore[attr-defined]
    return True


def lm_eval(model: nn.Module, batches: list[torch.Tensor],
            loss: Callable[[nn.Module, Batch, int], torch.Tensor]) -> float:
    """Mean held-out loss; NaN when the model produces non-finite values."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            values = [float(loss(model, b, -1)) for b in batches]
    except (RuntimeError, ValueError, IndexError):
        return float("nan")
    finally:
        model.train(was_training)
    return sum(values) / len(values)
