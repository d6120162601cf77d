"""What the framework callbacks share besides the `Run` and its pipeline: finding the torch
optimizer inside a trainer's wrappers, validating the config a callback is given, and the state
that goes through the framework's checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from trainguard.config import GuardConfig
from trainguard.errors import UsageError
from trainguard.events import Event, StepReport
from trainguard.pipeline.run import Run
from trainguard.probes.samples import SampleFn
from trainguard.samples_seen import SamplesSeen
from trainguard.sinks import Sink


def unwrap_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside framework wrappers (accelerate's AcceleratedOptimizer,
    Lightning's LightningOptimizer), whose `state` and `param_groups` are the real ones."""
    for _ in range(8):  # wrappers nest at most a couple of levels; never loop forever
        inner = getattr(optimizer, "optimizer", None)
        if not isinstance(inner, torch.optim.Optimizer) or inner is optimizer:
            break
        optimizer = inner
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UsageError(f"the trainer's optimizer must be a torch.optim.Optimizer, got "
                         f"{type(optimizer).__name__}")
    return optimizer


def callback_config(config: Any) -> GuardConfig:
    """The config given to a framework callback, validated when the callback is built."""
    if config is None:
        return GuardConfig()
    if not isinstance(config, GuardConfig):
        raise UsageError(f"config must be a trainguard.GuardConfig, got {type(config).__name__}")
    return config


class CallbackState:
    """What both callbacks hold and expose: the config, the `Run` of the current fit, and a
    state that round-trips through the framework's checkpoints (plain types only)."""

    def _init_state(self, config: GuardConfig | None, run_dir: str | Path | None,
                    sinks: list[Sink] | None, sample_fn: SampleFn | None = None,
                    noise_scheduler: Any = None) -> None:
        self.config = callback_config(config)
        self.noise_scheduler = noise_scheduler
        """A diffusion run's noise scheduler, whose `prediction_type` the first steps' loss is
        checked against (`probes/diffusion_target.py`)."""
        self.run_dir = run_dir
        self.sinks = list(sinks or [])
        self.run: Run | None = None
        self.last_report: StepReport | None = None
        self._pending_state: dict[str, Any] | None = None
        self._samples = SamplesSeen(sample_fn, self.config) if sample_fn is not None else None

    @property
    def samples(self) -> torch.Tensor | None:
        """The last samples made by `sample_fn` (at most 8, on the host), or None."""
        return self._samples.last if self._samples is not None else None

    def _samples_before(self, model: torch.nn.Module) -> None:
        """The reference samples, from the model as the trainer hands it over at the start."""
        if self._samples is not None and self.run is not None:
            self._samples.before_first_update(model, self.run)

    def _samples_after(self, model: torch.nn.Module | None, report: StepReport | None) -> None:
        if self._samples is not None and self.run is not None and model is not None \
                and report is not None:
            self._samples.after_step(model, self.run, report.step)

    @property
    def events(self) -> list[Event]:
        """Every event so far, in order."""
        return self.run.events if self.run is not None else []

    def state_dict(self) -> dict[str, Any]:
        """The guard's state (baselines, counters, recovery's skip list) for checkpoints; plain
        types, so it loads with weights_only=True."""
        if self.run is not None:
            return self.run.state_dict()
        return dict(self._pending_state or {})

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a `state_dict`; before training it is applied when training begins."""
        self._pending_state = dict(state_dict)
        if self.run is not None and not self.run.closed:
            self.run.load_state_dict(self._pending_state)
