"""What the HF callback reads of a TRL trainer (DPO, KTO, GRPO, RLOO...): its own objective and
its metrics, every step they are computed.

A TRL trainer subclasses `transformers.Trainer` but minimises an objective of its own
(`compute_loss`: a DPO, KTO or GRPO loss), while the model it calls may compute a cross-entropy
on the side (TRL passes `labels=`): the loss the model returns is not the loss trained on. And
its metrics (rewards, KL, margins, log-probabilities) are kept in `trainer._metrics["train"]`,
one value appended per micro-batch or generation, then averaged over the logging window with
the NaNs dropped: a logged row can hide a bad step. So the callback:

- finds the trainer it was given to (`find_trainer`) and recognises a TRL one by what it is
  (`is_trl_trainer`: a class of the `trl` package in its hierarchy);
- wraps that trainer's `compute_loss` on the instance (`ObjectiveTap`): the value it returns is
  what `training_step` backpropagates, kept detached on the device; nothing else changes;
- judges the level of that objective only where it is one to minimise
  (`minimises_objective`); a policy-gradient surrogate is judged on the trainer's metrics;
- reads the values appended to `_metrics["train"]` since the step before (`MetricsTap`),
  before the log averages them, their NaNs included.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Mapping
from types import FrameType
from typing import Any

import torch

log = logging.getLogger("trainguard")

__all__ = ["MetricsTap", "ObjectiveTap", "find_trainer", "is_trl_trainer", "minimises_objective"]

_FRAMES_UP = 12
"""How far up the call stack the callback's trainer is looked for: the trainer's training loop
calls the callback handler, which calls the callback."""


def find_trainer(callback: object) -> Any | None:
    """The `transformers.Trainer` whose callback handler holds `callback`, found among the
    callers of the running hook (None when there is none: a callback called by hand)."""
    frame: FrameType | None = sys._getframe(1)
    for _ in range(_FRAMES_UP):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        handler = getattr(owner, "callback_handler", None)
        if callback in getattr(handler, "callbacks", ()):
            return owner
        frame = frame.f_back
    return None


def is_trl_trainer(trainer: object) -> bool:
    """A trainer of the `trl` package (any of its classes in the trainer's hierarchy)."""
    return any(cls.__module__.split(".")[0] == "trl" for cls in type(trainer).__mro__)


def minimises_objective(trainer: object) -> bool:
    """Whether the trainer's loss is a quantity to minimise (DPO, KTO, ORPO, SFT), not a policy
    gradient surrogate: a trainer that scores its own completions with reward functions (GRPO,
    RLOO) steps on a surrogate whose level is near 0 or negative by design and says nothing of
    progress; its rewards and KL do."""
    return not hasattr(trainer, "reward_funcs")


class ObjectiveTap:
    """The trainer's own objective of each micro-batch (`compute_loss`'s value), detached on the
    device, summed over the micro-batches of one optimizer step the way `training_step` scales
    them: a loss already normalised by the accumulated batch's item count adds up, otherwise
    the micro-batches are averaged."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.total: torch.Tensor | None = None
        self.micro_batches = 0
        self.normalised = False
        self._failed = False
        self._wrapped = trainer.compute_loss
        trainer.compute_loss = self._compute_loss

    def _compute_loss(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        result = self._wrapped(model, inputs, *args, **kwargs)
        if getattr(model, "training", False) and torch.is_grad_enabled():
            try:
                self._take(result, kwargs.get("num_items_in_batch"))
            except Exception as exc:  # the loss is optional; gradients are still checked
                if not self._failed:
                    self._failed = True
                    log.error("trainguard: could not read the trainer's loss (%s: %s)",
                              type(exc).__name__, exc)
        return result

    def _take(self, result: Any, num_items_in_batch: Any) -> None:
        loss = result[0] if isinstance(result, tuple) else result
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            return
        loss = loss.detach().reshape(())
        self.micro_batches += 1
        trainer = self.trainer
        # training_step divides by the accumulation steps unless the loss is normalised already
        takes_count = getattr(trainer, "model_accepts_loss_kwargs", False)
        if ((takes_count and num_items_in_batch is not None)
                or getattr(trainer, "compute_loss_func", None) is not None):
            self.normalised = True
        self.total = loss if self.total is None else self.total + loss

    def reset(self) -> None:
        self.total, self.micro_batches, self.normalised = None, 0, False

    def take(self) -> torch.Tensor | None:
        """The step's objective (None when `compute_loss` gave none), then start the next step."""
        total = self.total
        if total is not None and not self.normalised and self.micro_batches > 1:
            total = total / self.micro_batches
        self.reset()
        return total

    def remove(self) -> None:
        """Give the trainer its own `compute_loss` back."""
        if self.trainer.__dict__.get("compute_loss") == self._compute_loss:
            del self.trainer.compute_loss


class MetricsTap:
    """The values a TRL trainer appended to its training metrics since the step before, one per
    metric: the mean of the new values (a NaN among them stays: the log's average drops it).

    `_metrics["train"]` is a dict of lists the trainer clears when it logs (the lists are dropped
    and new ones made at the next append): a list that is not the one read before is read from
    its start."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.seen: dict[str, tuple[list[Any], int]] = {}
        """Each metric's list as read at the step before, and how many values it held."""
        self._failed = False

    def take(self) -> dict[str, float]:
        try:
            return self._new_values()
        except Exception as exc:  # the metrics are advisory: the step is judged without them
            if not self._failed:
                self._failed = True
                log.error("trainguard: could not read the trainer's metrics (%s: %s)",
                          type(exc).__name__, exc)
            return {}

    def _new_values(self) -> dict[str, float]:
        metrics = getattr(self.trainer, "_metrics", None)
        table = metrics.get("train") if isinstance(metrics, Mapping) else None
        if not isinstance(table, Mapping):
            return {}
        values: dict[str, float] = {}
        seen: dict[str, tuple[list[Any], int]] = {}
        for name, series in table.items():
            if not isinstance(series, list):
                continue
            before, count = self.seen.get(name, (None, 0))
            start = count if before is series and count <= len(series) else 0
            new = [float(v) for v in series[start:] if _number(v)]
            seen[name] = (series, len(series))
            if new:
                values[str(name)] = math.fsum(new) / len(new)
        self.seen = seen
        return values


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
