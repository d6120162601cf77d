"""`TrainguardCallback` for Lightning, under both `lightning.pytorch` and `pytorch_lightning`.

    from trainguard.lightning import TrainguardCallback

    trainer = lightning.pytorch.Trainer(callbacks=[TrainguardCallback(run_dir="runs/exp1")])
    trainer.fit(module, loader)

The one class subclasses the `Callback` of every Lightning namespace installed, so either
Trainer accepts it. How it fits Lightning's automatic optimization:

- loss: `on_before_backward` hands over each micro-batch's loss, already divided by
  `accumulate_grad_batches` (and multiplied by the loss scale under float16 AMP, which is undone
  on the device); it is summed, detached, until the optimizer step;
- check: `on_before_optimizer_step` runs once per optimizer step, after the AMP unscale and before
  Lightning's own clipping, so the norms are the real pre-clip ones;
- skip: the gradients are dropped, so the optimizer step changes nothing; the step-interval LR
  schedulers Lightning then steps are rewound at `on_train_batch_end`;
- state: `state_dict` / `load_state_dict` carry the guard's baselines through Lightning checkpoints;
- checkpoints: every checkpoint the strategy writes gets its `trainguard.json` sidecar, and the
  newest healthy one is kept through `save_top_k` (`integrations/checkpoint_io.py`).

Clipping: with `gradient_clip_val` set (norm algorithm), trainguard clips at exactly that limit
in Lightning's place (`gradient_clip_val` is None during `fit` and given back at its end), so the
gradients are clipped once, bit for bit as Lightning alone clips them; a module that overrides
`configure_gradient_clipping` keeps its own clipping. Without it (Lightning's default: no
clipping) `config.clip.max_grad_norm` applies, by default `"auto"`, the adaptive clip that touches
only steps whose norm is abnormal for this run (nothing under observe; `clip.max_grad_norm=None`
turns it off).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import math
from pathlib import Path
from typing import Any

import torch

from trainguard.config import GuardConfig
from trainguard.diagnose.replay import LossFn
from trainguard.errors import UsageError
from trainguard.integrations.callback_state import CallbackState, unwrap_optimizer
from trainguard.integrations.checkpoint_io import MarkingCheckpointIO
from trainguard.pipeline.context import StepContext
from trainguard.pipeline.run import Run
from trainguard.probes.samples import SampleFn
from trainguard.sinks import Sink
from trainguard.sinks.trackers import TrackerHints
from trainguard.vocabulary import Status

log = logging.getLogger("trainguard")

__all__ = ["NAMESPACES", "TrainguardCallback"]


def _callback_bases() -> tuple[tuple[str, ...], tuple[type, ...]]:
    """The `Callback` class of every Lightning namespace installed: subclassing them all lets
    one class pass the Trainer of either namespace."""
    names: list[str] = []
    bases: list[type] = []
    for name in ("lightning.pytorch", "pytorch_lightning"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        names.append(name)
        bases.append(module.Callback)
    if not bases:
        raise ImportError("trainguard.lightning needs Lightning: pip install lightning "
                          "(or pytorch-lightning)")
    return tuple(names), tuple(bases)


NAMESPACES, _BASES = _callback_bases()
"""The Lightning namespaces whose Trainer accepts `TrainguardCallback` in this environment."""
_MODULE_BASES = tuple(importlib.import_module(name).LightningModule for name in NAMESPACES)


def _clip_limit(trainer: Any, module: Any) -> float | None:
    """The trainer's norm clipping limit that trainguard can apply in its place: None when the
    trainer does not clip by norm, or when the module clips in its own
    `configure_gradient_clipping` (left to it)."""
    value = getattr(trainer, "gradient_clip_val", None)
    algorithm = getattr(trainer, "gradient_clip_algorithm", None)
    algorithm = str(getattr(algorithm, "value", algorithm) or "norm")
    if not (isinstance(value, (int, float)) and value > 0 and algorithm == "norm"):
        return None
    if any(type(module).configure_gradient_clipping is getattr(base, "configure_gradient_clipping",
                                                               None)
           for base in _MODULE_BASES):
        return float(value)
    return None


def _trainer_name(trainer: Any) -> str:
    """`lightning.pytorch.Trainer` or `pytorch_lightning.Trainer`, for the run store."""
    return f"{type(trainer).__module__.split('.trainer')[0]}.{type(trainer).__name__}"


class TrainguardCallback(CallbackState, *_BASES):  # type: ignore[misc]
    """Watches and protects every optimizer step of a Lightning Trainer (automatic optimization,
    one optimizer)."""

    def __init__(self, config: GuardConfig | None = None, *, run_dir: str | Path | None = None,
                 sinks: list[Sink] | None = None, replay_fn: LossFn | None = None,
                 sample_fn: SampleFn | None = None, noise_scheduler: Any = None) -> None:
        """`replay_fn(module, batch) -> loss` (a loss without the side effects of
        `training_step`, such as `self.log`) lets a step with an error be replayed and its
        causes proved by replay under halt and recover, on the module, optimizer and batch
        Lightning hands over. `sample_fn(module) -> images`: as `Guard`'s, a generative
        model's samples made and judged after a step now and then. `noise_scheduler`: as
        `Guard`'s, the first steps' loss checked against its `prediction_type`."""
        super().__init__()
        self._init_state(config, run_dir, sinks, sample_fn, noise_scheduler)
        self.replay_fn = replay_fn
        self._loss: torch.Tensor | None = None
        self._batch: Any = None
        self._loss_failed = False
        self._ctx: StepContext | None = None
        self._clipping: tuple[Any, float] | None = None
        """(trainer, its gradient_clip_val) while trainguard clips in the trainer's place."""

    # -- public API ------------------------------------------------------------------------------
    def close(self, status: Status | None = None) -> None:
        """Flush and close the run store (the end of training, or an exception, does this).
        `status`: as `Guard.close`'s (None: from the exception under way, if any)."""
        self._end(status)

    # -- Lightning hooks -------------------------------------------------------------------------
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if not pl_module.automatic_optimization:
            raise UsageError("TrainguardCallback drives Lightning's automatic optimization; with "
                             "manual optimization call trainguard.Guard in training_step instead")
        if len(trainer.optimizers) != 1:
            raise UsageError(f"TrainguardCallback watches one optimizer, the module configures "
                             f"{len(trainer.optimizers)}")
        carried = self._pending_state
        resume = self.run is not None  # a second fit() with one callback goes on with the run
        if self.run is not None:  # ... and keeps the baselines
            carried = carried or self.run.state_dict()
            self.close(status="finished")
        optimizer = unwrap_optimizer(trainer.optimizers[0])
        configs = [c for c in trainer.lr_scheduler_configs
                   if c.interval == "step" and not c.reduce_on_plateau]
        schedulers = [c.scheduler for c in configs]
        limit = _clip_limit(trainer, pl_module)
        config = self.config
        if limit is not None:
            # trainguard clips in Lightning's place, at its limit, after measuring: the norms
            # are the pre-clip ones and the gradients are clipped once, as Lightning alone would
            config = dataclasses.replace(
                self.config, clip=dataclasses.replace(self.config.clip, max_grad_norm=limit))
            self._clipping = (trainer, trainer.gradient_clip_val)
            trainer.gradient_clip_val = None
        try:
            self.run = Run(pl_module, optimizer, config=config, run_dir=self.run_dir,
                           sinks=self.sinks,
                           scaler=getattr(trainer.precision_plugin, "scaler", None),
                           scheduler=schedulers[0] if schedulers else None,
                           rewind_schedulers=schedulers, integration=_trainer_name(trainer),
                           replay_fn=self.replay_fn, noise_scheduler=self.noise_scheduler,
                           resume=resume, mid_run=bool(carried or trainer.global_step),
                           trackers=TrackerHints.of(loggers=trainer.loggers),
                           total_steps=(_total_steps(trainer) if configs
                                        and configs[0].frequency == 1 else None))
        except BaseException:
            self.close()  # the trainer keeps its own clipping
            raise
        if carried:
            self.run.load_state_dict(carried)
        elif trainer.global_step:
            self.run.load_state_dict({**self.run.state_dict(), "step": trainer.global_step})
        self._pending_state = None
        self._loss = None
        io = trainer.strategy.checkpoint_io
        if not isinstance(io, MarkingCheckpointIO):  # every checkpoint written gets its sidecar
            trainer.strategy.checkpoint_io = MarkingCheckpointIO(io, self)
        self._samples_before(pl_module)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any,
                             batch_idx: int) -> None:
        self._batch = batch  # a reference, for crash snapshots

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: torch.Tensor) -> None:
        if self.run is None:
            return
        try:
            self.run.observe_loss_graph(loss)
            value = loss.detach().reshape(()).float()
            scale = getattr(self.run.scaler, "_scale", None)
            if isinstance(scale, torch.Tensor):  # float16 AMP hands over the scaled loss
                value = value / scale.to(value.device)
            self._loss = value if self._loss is None else self._loss + value
        except Exception as exc:  # the loss is optional; gradients are still checked
            if not self._loss_failed:
                self._loss_failed = True
                log.error("trainguard: could not read the loss (%s: %s)", type(exc).__name__, exc)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self.run is None:
            return
        loss, self._loss = self._loss, None
        self._ctx = self.run.before_update(loss, batch=self._batch)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if self.run is None or self._ctx is None:  # None while gradients are accumulated
            return
        ctx, self._ctx = self._ctx, None
        report = self.run.after_update(ctx)
        if report is not None:
            self.last_report = report
        self._samples_after(pl_module, report)

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        """The validation metrics the module logged (names with "val") go to `metric_collapse`
        and the store, at the trainer's global step; the sanity check before training is not
        an evaluation of the trained model."""
        if self.run is None or self.run.closed or getattr(trainer, "sanity_checking", False):
            return
        try:
            metrics = {name: float(value) for name, value in trainer.callback_metrics.items()
                       if "val" in name and getattr(value, "numel", lambda: 1)() == 1}
            if metrics:
                self.run.observe_eval(metrics, step=max(trainer.global_step - 1, 0))
        except Exception as exc:  # evaluation bookkeeping must not stop training
            log.error("trainguard: could not take the validation metrics (%s: %s)",
                      type(exc).__name__, exc)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.close(status="finished")

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._end(None, exception)

    # -- internals -------------------------------------------------------------------------------
    def _end(self, status: Status | None, error: BaseException | None = None) -> None:
        self._batch = None
        self._ctx = None
        if self._clipping is not None:  # the trainer clips again from now on
            trainer, value = self._clipping
            trainer.gradient_clip_val, self._clipping = value, None
        if self.run is not None:
            self.run.close(status, error=error)


def _total_steps(trainer: Any) -> int | None:
    """The optimizer steps the fit takes, where Lightning knows them (its
    `estimated_stepping_batches`: the lesser of `max_steps` and the epochs' batches over the
    accumulation); None when it does not."""
    try:
        steps = trainer.estimated_stepping_batches
    except Exception:  # a loader without a length: the run's length is unknown
        return None
    return int(steps) if isinstance(steps, (int, float)) and math.isfinite(steps) and steps > 0 \
        else None
