"""`Services`: what the stages use and do not own, built once per run by `build_services`.

A stage is a function of (`StepContext`, `RunState`, `Services`): the context carries the step,
the state is what a rollback rewinds and a resume restores (everything with state: the journal,
the batch watch, the prover, the clip chain), and the services are the user's objects (model,
optimizer, scheduler, scaler, loss function), the configuration, the probes laid out on the model
and the distributed context. The bundle is frozen and holds no run state; what changes inside it
changes for a reason of its own: `ParamWatch` rebuilds its parameter-wise probes when the
optimizer gains parameters.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainguard.config import GuardConfig
from trainguard.diagnose.lr_range import sane_lr
from trainguard.diagnose.replay import LossFn
from trainguard.diagnose.step_rng import StepRNG
from trainguard.distributed import DistributedContext, LocalShardGradientProbe, RankAgreement
from trainguard.events import ActionRecord
from trainguard.params import WatchedParams, new_params, optimizer_param_count
from trainguard.pipeline.rewind import ScheduleRewind
from trainguard.probes.activations import ActivationProbe
from trainguard.probes.adam_ratio import AdamRatioProbe
from trainguard.probes.attention_logits import AttentionLogitProbe
from trainguard.probes.diffusion_target import DiffusionTargetProbe, readable
from trainguard.probes.gradients import GradientProbe
from trainguard.probes.logz import LogZProbe
from trainguard.probes.optimizer_state import OptimizerStateProbe
from trainguard.probes.outputs import OutputProbe
from trainguard.probes.weights import WeightProbe

log = logging.getLogger("trainguard")


class ParamWatch:
    """The watched parameters and the probes laid out on them (their count, devices, dtypes):
    the gradient, weight and Adam ratio probes and, under torch.distributed, the ranks' per-step
    agreement. All are rebuilt together when the optimizer gains parameters."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 watched: WatchedParams, dist: DistributedContext | None,
                 updates: bool = False) -> None:
        self.model, self.optimizer, self.dist = model, optimizer, dist
        self.params = watched
        self.updates = updates
        """The Adam probe also measures `adam_update_rms`
        (`detectors.instability_precursor.update_rms`)."""
        self._seen = optimizer_param_count([optimizer])
        self._build()

    def _build(self) -> None:
        previous: AdamRatioProbe | None = self.__dict__.get("adam_probe")
        if previous is not None:
            previous.close()  # its hooks on the optimizer go with it
        self.ranks = (RankAgreement(self.dist, self.params) if self.dist is not None else None)
        """One all-reduce per step and the desync check, so that every rank decides alike."""
        self.grad_probe = (GradientProbe(self.params) if self.dist is None
                           else LocalShardGradientProbe(self.params))
        self.weight_probe = WeightProbe(self.params)
        self.adam_probe = AdamRatioProbe(self.params, [self.optimizer], updates=self.updates)
        """Every step, for `instability_precursor` (left out under torch.distributed, where a
        sharded state would make the ranks' values differ)."""

    def unchanged(self) -> bool:
        """Whether the optimizer holds the parameters counted at the last `gained` (the calm
        lane's check, which adds nothing)."""
        return optimizer_param_count([self.optimizer]) == self._seen

    def gained(self) -> WatchedParams | None:
        """Parameters the optimizer gained since the last call (`add_param_group`, as progressive
        unfreezing does), now watched; None when nothing was added. Counting the optimizer's
        parameters is the per-step check; the lists are rebuilt only when it changed. Under
        torch.distributed every rank adds the same groups at the same step (the same code runs
        everywhere), so the ranks rebuild their agreement alike."""
        count = optimizer_param_count([self.optimizer])
        if count == self._seen:
            return None
        self._seen = count
        added = new_params(self.params, self.model, [self.optimizer])
        if not len(added):
            return None
        self.params.extend(added)
        self._build()
        return added


@dataclass(frozen=True)
class Services:
    config: GuardConfig
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    scaler: Any
    """The AMP GradScaler when it is enabled, else None."""
    owns_scaler_step: bool
    """The caller runs `scaler.update()` after the checks (the Guard): a rollback then closes the
    scaler's step before restoring it."""
    replay_fn: LossFn | None
    device: torch.device
    dist: DistributedContext | None
    """This rank under torch.distributed (world size > 1); None for a single process."""
    run_dir: Path | None
    watch: ParamWatch
    optstate_probe: OptimizerStateProbe
    activation_probe: ActivationProbe | None
    output_probe: OutputProbe | None
    rewind: ScheduleRewind
    attention_probe: AttentionLogitProbe | None = None
    """The attention layers' largest logits (`probes/attention_logits.py`), hooked on the steps
    `AttentionLogitTracker.due` names."""
    logz_probe: LogZProbe | None = None
    """log Z of the class scores every step, for `instability_precursor` (with the Adam ratio
    probe: on when `detectors.instability_precursor.probe` is, left out under torch.distributed)."""
    step_rng: StepRNG | None = None
    """The RNG state each training forward starts from (`diagnose/step_rng.py`), so a proof or
    a crash snapshot's replay draws the step's dropout masks; kept when the run can prove or
    halts."""
    target_probe: DiffusionTargetProbe | None = None
    """The first steps' diffusion prediction against each target, with a noise scheduler given
    (`probes/diffusion_target.py`)."""
    fixes: Mapping[str, str] = field(default_factory=dict)
    """The fixes of causes made concrete for this run, over the catalogue's general ones: the
    LR's, sized to the model and its optimizer (`diagnose/lr_range.py`)."""

    @property
    def watched(self) -> WatchedParams:
        return self.watch.params

    @property
    def ranks(self) -> RankAgreement | None:
        return self.watch.ranks

    def snapshot_dir(self) -> Path:
        """Where crash snapshots go: the configured folder, else the run directory."""
        config = self.config
        return Path(config.checkpoints.snapshot_dir) if config.checkpoints.snapshot_dir else (
            self.run_dir if self.run_dir is not None else Path("trainguard_snapshots"))


def build_services(*, config: GuardConfig, model: nn.Module, optimizer: torch.optim.Optimizer,
                   watched: WatchedParams, dist: DistributedContext | None, scheduler: Any,
                   scaler: Any, owns_scaler_step: bool, replay_fn: LossFn | None,
                   run_dir: Path | None, rewind_schedulers: Iterable[Any],
                   noise_scheduler: Any = None) -> Services:
    return Services(
        config=config, model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler,
        owns_scaler_step=owns_scaler_step, replay_fn=replay_fn,
        device=watched.params[0].device, dist=dist, run_dir=run_dir,
        watch=ParamWatch(model, optimizer, watched, dist,
                         updates=config.detectors.instability_precursor.update_rms),
        optstate_probe=OptimizerStateProbe(watched, [optimizer]),
        activation_probe=ActivationProbe(model) if config.probes.activations else None,
        output_probe=OutputProbe(model) if config.probes.outputs else None,
        rewind=ScheduleRewind(optimizer, [s for s in rewind_schedulers if s is not None]),
        # left out under torch.distributed, as the Adam-ratio probe: rank-local values
        attention_probe=(AttentionLogitProbe(model)
                         if config.detectors.attention_logits.probe and dist is None else None),
        logz_probe=(LogZProbe(model)
                    if config.detectors.instability_precursor.probe and dist is None
                    else None),
        step_rng=(StepRNG(model) if config.policy == "halt" or (
            replay_fn is not None and config.prove.mode != "off") else None),
        target_probe=target_probe(noise_scheduler, model),
        fixes=run_fixes(model, optimizer))


def target_probe(noise_scheduler: Any, model: nn.Module) -> DiffusionTargetProbe | None:
    """The diffusion target probe for a scheduler it can read (said once when it cannot)."""
    if noise_scheduler is None:
        return None
    if not readable(noise_scheduler):
        log.info("trainguard: %s has no add_noise, cumulative alphas and prediction_type of "
                 "epsilon, v_prediction or sample: the loss's diffusion target is not checked",
                 type(noise_scheduler).__name__)
        return None
    return DiffusionTargetProbe(noise_scheduler, model)


def run_fixes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, str]:
    """The LR's fixes sized to this model and optimizer; none when they cannot be read (the
    catalogue's general words stand)."""
    try:
        return sane_lr(model, [optimizer]).fixes()
    except Exception as exc:  # advice is advisory
        log.error("trainguard: sizing the LR advice failed (%s: %s)", type(exc).__name__, exc)
        return {}


def new_params_notice(added: WatchedParams, step: int, count: int) -> ActionRecord:
    """What the sinks hear when the optimizer gained parameters."""
    shown = ", ".join(added.names[:5]) + (", ..." if len(added) > 5 else "")
    return ActionRecord(
        kind="watch", step=step,
        message=f"the optimizer gained {len(added)} parameter(s) ({shown}): watched from "
                f"step {step}",
        details={"names": list(added.names), "shapes": [list(p.shape) for p in added.params],
                 "count": count})


Stage = Callable[..., Any]
"""A stage: `stage(ctx, state, services, *results)`, handed the results of the stages before it
that it reads, returning its own; its `__name__` is the stage's name."""
