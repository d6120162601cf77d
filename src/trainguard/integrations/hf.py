"""`TrainguardCallback` for the Hugging Face `transformers.Trainer` (PEFT models included).

    from trainguard.hf import TrainguardCallback

    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[TrainguardCallback(run_dir="runs/exp1")])
    trainer.train()

How it fits the Trainer's loop (see docs/integrations.md for the reasons):

- clipping: the Trainer clips before `on_pre_optimizer_step`, which would hide the pre-clip
  norm. At `on_train_begin` the callback takes `args.max_grad_norm` (its default included) as its
  own limit, so that trainguard clips instead, at the same limit, from norms it measures anyway,
  and sets it to 0 inside each step only (`on_step_begin` to `on_pre_optimizer_step`, where the
  Trainer reads it): the checkpoints saved, the logs and a loop that stops between steps keep
  the value the user set;
- loss: read from the model's own output by a forward hook (the Trainer's logs replace a NaN loss
  with a finite one), kept on the device and summed over gradient-accumulation micro-batches;
  under a TRL trainer (DPO, GRPO...), the trainer's own objective instead, from its
  `compute_loss`, with its training metrics of the step (`integrations/trl.py`); a
  policy-gradient surrogate (GRPO, RLOO) is judged on those metrics, not on its level;
- one check per optimizer step, at the accumulation boundary (`on_pre_optimizer_step`);
- skip: the gradients are dropped, so `optimizer.step()` changes nothing; the LR scheduler the
  Trainer then steps is rewound at `on_step_end`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainguard.checkpoint_health import load_guard_state, mark_checkpoint
from trainguard.checkpoints import RESUMABLE, CheckpointHealth, last_healthy_checkpoint
from trainguard.config import GuardConfig
from trainguard.diagnose.replay import LossFn
from trainguard.errors import TrainingDiverged, UsageError
from trainguard.events import ActionRecord, Event
from trainguard.integrations.callback_state import CallbackState, unwrap_optimizer
from trainguard.integrations.trl import (
    MetricsTap,
    ObjectiveTap,
    find_trainer,
    is_trl_trainer,
    minimises_objective,
)
from trainguard.pipeline.context import StepContext
from trainguard.pipeline.run import Run
from trainguard.probes.samples import SampleFn
from trainguard.recovery.kl_penalty import holds_beta
from trainguard.registry import Kind
from trainguard.sinks import Sink
from trainguard.sinks.trackers import TrackerHints
from trainguard.vocabulary import HIDDEN_LOSS, Status

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("trainguard.hf needs transformers: pip install 'trainguard[hf]'") from exc

log = logging.getLogger("trainguard")

__all__ = ["TrainguardCallback", "model_loss"]


def model_loss(model: nn.Module, batch: Mapping[str, Any]) -> torch.Tensor:
    """The loss a Trainer minimises for one batch of a model that computes its own loss (the
    batch holds the labels): the `replay_fn` for `TrainguardCallback`."""
    return model(**batch).loss


class _LossTap:
    """Keeps the training loss of each micro-batch from the model's own output.

    Detached and on the device (no host sync), summed over the micro-batches of one optimizer
    step. The result is the loss the Trainer minimises for that step: a model given
    `num_items_in_batch` already divides by the token count of the whole accumulated batch, so
    its micro-batch losses add up; otherwise the Trainer averages them, and so does `take`.
    """

    def __init__(self, model: nn.Module, world_factor: float,
                 on_loss: Callable[[torch.Tensor], None] | None = None) -> None:
        self.world_factor = world_factor
        self.on_loss = on_loss
        """Shown each micro-batch's loss with its graph, before it is detached."""
        """The Trainer multiplies a token-normalised loss by the number of processes
        (average_tokens_across_devices); the same factor keeps the two equal."""
        self.total: torch.Tensor | None = None
        self.micro_batches = 0
        self.token_normalised = False
        self.batch: dict[str, Any] | None = None
        """The inputs of the latest micro-batch (a reference, not a copy), for crash snapshots."""
        self._failed = False
        self._handle = model.register_forward_hook(self._hook, with_kwargs=True)

    def _hook(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
              output: Any) -> None:
        if not module.training or not torch.is_grad_enabled():
            return  # evaluation and generation are not training steps
        try:
            loss = output.get("loss") if isinstance(output, Mapping) else None
            self.micro_batches += 1
            self.batch = {k: v for k, v in kwargs.items() if k != "num_items_in_batch"}
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                return
            if self.on_loss is not None:
                self.on_loss(loss)
            loss = loss.detach().reshape(())
            if kwargs.get("num_items_in_batch") is not None:
                self.token_normalised = True
                loss = loss * self.world_factor
            self.total = loss if self.total is None else self.total + loss
        except Exception as exc:  # the loss is optional; gradients are still checked
            if not self._failed:
                self._failed = True
                log.error("trainguard: could not read the loss from the model output (%s: %s)",
                          type(exc).__name__, exc)

    def reset(self) -> None:
        self.total, self.micro_batches, self.token_normalised = None, 0, False

    def take(self) -> torch.Tensor | None:
        """The step's loss (None when the model returned none), then start the next step."""
        total = self.total
        if total is not None and not self.token_normalised and self.micro_batches > 1:
            total = total / self.micro_batches
        self.reset()
        return total

    def remove(self) -> None:
        self._handle.remove()
        self.batch = None


class TrainguardCallback(CallbackState, TrainerCallback):
    """Watches and protects every optimizer step of a `transformers.Trainer`.

    Clipping, one limit, applied by trainguard in the Trainer's place (the Trainer's own
    clipping is off meanwhile), so that the norms it measures are the pre-clip ones:

    - `args.max_grad_norm` > 0 (its default 1.0 included): exactly that limit, as the Trainer
      would clip; a number (or None) set in `config` replaces the Trainer's default 1.0;
    - `args.max_grad_norm=0` (the Trainer does not clip): `config.clip.max_grad_norm`, by default
      `"auto"`, the adaptive clip that touches only steps whose norm is abnormal for this run.

    The policy, detectors and everything else come from `config`. `replay_fn=model_loss` (or
    your own `loss(model, batch)`) lets a step with an error be replayed, and its causes proved
    by replay under halt and recover (`trainguard.diagnose.counterfactual`), on the model,
    optimizer and batch the Trainer hands over. `sample_fn(model) -> images`: as `Guard`'s, a
    generative model's samples made and judged after a step now and then. `noise_scheduler`: as
    `Guard`'s, the first steps' loss checked against its `prediction_type`.
    """

    def __init__(self, config: GuardConfig | None = None, *, run_dir: str | Path | None = None,
                 sinks: list[Sink] | None = None, replay_fn: LossFn | None = None,
                 sample_fn: SampleFn | None = None, noise_scheduler: Any = None) -> None:
        self._init_state(config, run_dir, sinks, sample_fn, noise_scheduler)
        self.replay_fn = replay_fn
        self._model: nn.Module | None = None
        """The model the Trainer handed over at the start: what `sample_fn` samples from."""
        self._tap: _LossTap | None = None
        self._objective: ObjectiveTap | None = None
        self._metrics: MetricsTap | None = None
        self._surrogate = False
        """The trainer's loss is a policy-gradient surrogate: its level is not judged."""
        self._clipping_args: TrainingArguments | None = None
        self._trainer_max_grad_norm: float | None = None
        self._announced = False
        self._ctx: StepContext | None = None
        self._last_healthy: Path | None = None
        self._told_kept = False

    # -- public API ------------------------------------------------------------------------------
    def close(self, status: Status | None = None) -> None:
        """Flush and close the run store (training end does this; call it after a crash, in a
        `finally:` clause: the run is then `crashed`, or `interrupted` by Ctrl-C, with the
        exception's type stored). `status`: as `Guard.close`'s."""
        self._release()
        self._ctx = None
        if self.run is not None:
            self.run.close(status=status)

    # -- Trainer events --------------------------------------------------------------------------
    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, model: nn.Module | None = None,
                       optimizer: Any = None, lr_scheduler: Any = None, **kwargs: Any) -> None:
        if model is None or optimizer is None:
            raise UsageError("TrainguardCallback must be given to a transformers.Trainer, which "
                             "passes it the model and optimizer when training begins")
        check_sharding(model, optimizer)
        carried = self._pending_state
        if carried is None and self.run is None and state.global_step:
            carried = self._resume_state(args, state)
        if self.run is None and state.global_step and args.output_dir and _owns_best(args):
            # resumed: the newest healthy checkpoint stays protected from the first save on
            self._last_healthy = last_healthy_checkpoint(args.output_dir)
            if self._last_healthy is not None:
                state.best_model_checkpoint = str(self._last_healthy)
        resume = self.run is not None  # a second train() on one Trainer goes on with the run
        if self.run is not None:  # ... and keeps the baselines
            carried = carried or self.run.state_dict()
            self.close(status="finished")
        limit = self._take_over_clipping(args)
        clip = dataclasses.replace(self.config.clip, max_grad_norm=limit)  # type: ignore[arg-type]
        config = dataclasses.replace(self.config, clip=clip)
        trainer = find_trainer(self)
        trl = trainer is not None and is_trl_trainer(trainer)
        try:
            self.run = Run(model, unwrap_optimizer(optimizer), config=config,
                           run_dir=self.run_dir, sinks=self.sinks,
                           scaler=getattr(optimizer, "scaler", None), scheduler=lr_scheduler,
                           rewind_schedulers=[lr_scheduler], integration="transformers.Trainer",
                           replay_fn=self.replay_fn, noise_scheduler=self.noise_scheduler,
                           resume=resume, mid_run=bool(carried or state.global_step),
                           trackers=TrackerHints.of(args.report_to),
                           kl_penalty=trainer if trl and holds_beta(trainer) else None,
                           total_steps=state.max_steps if state.max_steps > 0 else None)
        except BaseException:
            self._release()  # the Trainer keeps its own clipping
            raise
        if limit is not None and self._clipping_args is not None:
            self._announce(limit)
        if carried:
            self.run.load_state_dict(carried)
        elif state.global_step:  # resumed from a Trainer checkpoint: count steps as it does
            self.run.load_state_dict({**self.run.state_dict(), "step": state.global_step})
        self._pending_state = None
        world = args.world_size if getattr(args, "average_tokens_across_devices", False) else 1
        self._tap = _LossTap(model, float(world), on_loss=self.run.observe_loss_graph)
        if trl:
            self._objective, self._metrics = ObjectiveTap(trainer), MetricsTap(trainer)
            self._surrogate = not minimises_objective(trainer)
        elif trainer is not None and _loss_outside_the_model(trainer):
            self._objective = ObjectiveTap(trainer)  # what the Trainer minimises
        self._model = model
        self._samples_before(model)

    def on_step_begin(self, args: TrainingArguments, state: TrainerState,
                      control: TrainerControl, **kwargs: Any) -> None:
        self._clipping_off(True)
        if self._tap is not None:
            self._tap.reset()
        if self._objective is not None:
            self._objective.reset()

    def on_pre_optimizer_step(self, args: TrainingArguments, state: TrainerState,
                              control: TrainerControl, **kwargs: Any) -> None:
        self._clipping_off(False)  # the Trainer has read its limit for this step
        if self.run is None or self._tap is None:
            return
        loss = self._tap.take()
        metrics: dict[str, float] = {}
        if self._objective is not None:
            loss = self._objective.take()
            metrics = self._metrics.take() if self._metrics is not None else {}
            if self._surrogate:
                loss = None
        try:
            self._ctx = self.run.before_update(loss, batch=self._tap.batch, metrics=metrics)
        except TrainingDiverged:
            self._release()
            raise
        if args.logging_nan_inf_filter:
            _note_hidden_loss(self._ctx.events)

    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        if self.run is None or self._ctx is None:
            return
        ctx, self._ctx = self._ctx, None
        report = self.run.after_update(ctx)
        if report is not None:
            self.last_report = report
        self._samples_after(self._model, report)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        """The Trainer saved `checkpoint-<step>` (and already rotated older ones away): its
        `trainguard.json` sidecar and the Guard's state go into the folder; the newest healthy
        checkpoint becomes the Trainer's `best_model_checkpoint`, which `save_total_limit`'s
        rotation keeps."""
        if self.run is None or self.run.closed or not args.should_save:
            return
        folder = _checkpoint_folder(args, state)
        if folder is not None and folder.is_dir():
            record = mark_checkpoint(folder, self.run, step=state.global_step)
            if record is not None:
                self._keep_last_healthy(args, state, folder, record)

    def on_evaluate(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, metrics: dict[str, float] | None = None,
                    **kwargs: Any) -> None:
        """The Trainer's evaluation metrics (eval_loss, eval_accuracy, ...) go to
        `metric_collapse` and the store, at the Trainer's global step."""
        if self.run is None or self.run.closed or not metrics:
            return
        try:
            self.run.observe_eval(metrics, step=max(state.global_step - 1, 0))
        except Exception as exc:  # evaluation bookkeeping must not stop training
            log.error("trainguard: could not take the evaluation metrics (%s: %s)",
                      type(exc).__name__, exc)

    def on_train_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: Any) -> None:
        self.close(status="finished")

    # -- internals -------------------------------------------------------------------------------
    def _keep_last_healthy(self, args: TrainingArguments, state: TrainerState, folder: Path,
                           record: CheckpointHealth) -> None:
        """Point `state.best_model_checkpoint` at the newest healthy checkpoint: the Trainer's
        rotation (`rotate_checkpoints`) never deletes it, whatever `save_total_limit`."""
        assert self.run is not None
        if record.status in RESUMABLE:
            self._last_healthy = folder
        if self._last_healthy is None or self._last_healthy == folder:
            if self._last_healthy is not None and _owns_best(args):
                state.best_model_checkpoint = str(self._last_healthy)
            return
        if not _owns_best(args):
            if not self._told_kept:
                self._told_kept = True
                log.warning("trainguard: %s is not healthy and the Trainer's best-model "
                            "tracking (metric_for_best_model) decides which checkpoint "
                            "save_total_limit keeps: the last healthy one, %s, is not protected",
                            folder.name, self._last_healthy.name)
            return
        state.best_model_checkpoint = str(self._last_healthy)
        if not self._told_kept and args.save_total_limit:
            self._told_kept = True
            self.run.emit_action(ActionRecord(
                kind="checkpoint_kept", step=state.global_step,
                message=f"{folder.name} is {record.status}: {self._last_healthy.name}, the newest "
                        f"healthy checkpoint, is kept through save_total_limit="
                        f"{args.save_total_limit} (it is the Trainer's best_model_checkpoint, "
                        f"which the Trainer's checkpoint rotation keeps); resume from "
                        f"trainguard.last_healthy_checkpoint(output_dir)",
                details={"kept": str(self._last_healthy), "newest": str(folder)}))

    def _resume_state(self, args: TrainingArguments, state: TrainerState
                      ) -> dict[str, Any] | None:
        """The Guard's state saved with the checkpoint the Trainer resumed from (found by the
        resumed step under `output_dir`), so the resumed run keeps its baselines, skip list and
        LR backoff."""
        folder = _checkpoint_folder(args, state)
        try:
            return load_guard_state(folder) if folder is not None and folder.is_dir() else None
        except Exception as exc:  # the run goes on with fresh baselines
            log.error("trainguard: could not load the state saved in %s (%s: %s)", folder,
                      type(exc).__name__, exc)
            return None

    def _take_over_clipping(self, args: TrainingArguments) -> float | str | None:
        """The limit trainguard clips at, after measuring (the Trainer no longer clips): the
        Trainer's own, as configured (its default 1.0 included), so that a healthy run trains
        exactly as the Trainer alone would. Where the Trainer does not clip
        (`max_grad_norm=0`), the config's limit applies (by default the adaptive clip, which
        touches only abnormal steps, and nothing under observe); a number set in the config
        replaces the Trainer's default (not a limit the user chose there)."""
        value = args.max_grad_norm
        own = self.config.clip.max_grad_norm
        if not isinstance(value, (int, float)) or value <= 0:
            return own  # the Trainer does not clip: nothing to take over
        limit: float | str | None = float(value)
        if float(value) == _trainer_default_max_grad_norm() and own != "auto":
            limit = own
        self._clipping_args, self._trainer_max_grad_norm = args, float(value)
        return limit  # set to 0 inside each step (`_clipping_off`)

    def _clipping_off(self, off: bool) -> None:
        """The Trainer's clipping off for the step under way (`off`), or given back after it
        read its limit: off from the step's start to its optimizer step only, so that a
        checkpoint's `training_args.bin`, a log, an evaluation and a loop that stops between
        steps see the value the user set."""
        if self._clipping_args is not None and self._trainer_max_grad_norm is not None:
            self._clipping_args.max_grad_norm = 0.0 if off else self._trainer_max_grad_norm

    def _announce(self, limit: float | str) -> None:
        if self._announced or self.run is None:
            return
        self._announced = True
        if limit == "auto":
            how = ("trainguard clips a step only when its gradient norm is abnormal for this run "
                   "(GuardConfig(clip={'max_grad_norm': 'auto'}))")
        else:
            how = f"trainguard clips gradients at max_grad_norm={limit:g}, as the Trainer would"
        self.run.emit_action(ActionRecord(
            kind="clip_takeover", step=self.run.state.step,
            message=f"{how} (TrainingArguments.max_grad_norm is set to 0 inside each step, "
                    "so that the Trainer does not clip before trainguard sees the gradients, and "
                    "holds its value between steps: in checkpoints, logs and after train())",
            details={"max_grad_norm": limit}))

    def _release(self) -> None:
        """Give the Trainer its clipping back and remove the loss hook."""
        if self._clipping_args is not None and self._trainer_max_grad_norm is not None:
            self._clipping_args.max_grad_norm = self._trainer_max_grad_norm
        self._clipping_args = self._trainer_max_grad_norm = None
        if self._tap is not None:
            self._tap.remove()
            self._tap = None
        if self._objective is not None:
            self._objective.remove()
        self._objective = self._metrics = None


def _note_hidden_loss(events: list[Event]) -> None:
    """`logging_nan_inf_filter` (on by default) makes the Trainer log the running average in
    place of a non-finite loss: the event says so (its loss is the model's real one)."""
    for event in events:
        if event.kind == Kind.NONFINITE_LOSS and not event.details.get(HIDDEN_LOSS):
            event.details[HIDDEN_LOSS] = True
            event.message += (" (hidden from the Trainer's logged loss: logging_nan_inf_filter "
                              "replaces a non-finite loss with the average of the logged ones; "
                              "this is the model's real loss)")


def _loss_outside_the_model(trainer: Any) -> bool:
    """Whether the Trainer minimises a loss its model's output does not hold: a subclass's own
    `compute_loss` (a loss reweighted, a term added), a `compute_loss_func`, label smoothing
    (applied to the logits after the forward). The callback then reads `compute_loss`'s value:
    a NaN made there is the step's loss, not hidden behind the model's finite one."""
    from transformers import Trainer

    args = getattr(trainer, "args", None)
    return (getattr(type(trainer), "compute_loss", None) is not Trainer.compute_loss
            or getattr(trainer, "compute_loss_func", None) is not None
            or bool(getattr(args, "label_smoothing_factor", 0)))


def _checkpoint_folder(args: TrainingArguments, state: TrainerState) -> Path | None:
    """The folder the Trainer saves the checkpoint of the current step to."""
    if not args.output_dir:
        return None
    return Path(args.output_dir) / f"checkpoint-{state.global_step}"


def _owns_best(args: TrainingArguments) -> bool:
    """Whether `best_model_checkpoint` is free for trainguard: the Trainer tracks no best model
    of its own (no `metric_for_best_model`, no `load_best_model_at_end`)."""
    return args.metric_for_best_model is None and not args.load_best_model_at_end


def _trainer_default_max_grad_norm() -> float:
    """`TrainingArguments.max_grad_norm`'s default (1.0): left there, it was not chosen."""
    for f in dataclasses.fields(TrainingArguments):
        if f.name == "max_grad_norm" and isinstance(f.default, (int, float)):
            return float(f.default)
    return 1.0


def check_sharding(model: nn.Module, optimizer: Any) -> None:
    """Refuse what trainguard cannot guard, judged by what the Trainer really wrapped (not by
    `TrainingArguments.fsdp` / `.deepspeed`, which say what was asked for: `fsdp="full_shard"`
    runs plain DDP on a CPU, and `accelerate launch --use_fsdp` leaves `args.fsdp` empty).

    - FSDP2 (`fully_shard`; the Trainer's `fsdp_version: 2`): supported. The parameters are
      DTensors; each rank measures its local shards and the step's all-reduce adds them up, as
      in a plain loop with FSDP2.
    - FSDP1 (`FullyShardedDataParallel`): refused; its flat parameters hide the model's own.
    - DeepSpeed: refused; the engine owns the gradients, the clipping and the optimizer step.
    """
    inner = optimizer
    while hasattr(inner, "optimizer") and inner is not inner.optimizer:
        if type(inner).__module__.split(".")[0] == "deepspeed":
            break
        inner = inner.optimizer  # accelerate's AcceleratedOptimizer and similar wrappers
    if type(inner).__module__.split(".")[0] == "deepspeed" or hasattr(model, "ds_config"):
        raise UsageError("TrainguardCallback does not support DeepSpeed: the engine owns the "
                         "gradients, their clipping and the optimizer step. Use DDP or FSDP2")
    from torch.distributed.fsdp import FullyShardedDataParallel

    for module in model.modules():
        if isinstance(module, FullyShardedDataParallel):
            raise UsageError("TrainguardCallback does not support FSDP1 "
                             "(FullyShardedDataParallel): its flat parameters hide the model's "
                             "own. Use FSDP2 (fsdp_config={'fsdp_version': 2}, or fully_shard)")
    for param in model.parameters():
        if type(param).__name__ == "FlatParameter":
            raise UsageError("TrainguardCallback does not support FSDP1 flat parameters; use "
                             "FSDP2 (fsdp_config={'fsdp_version': 2})")
