"""Ways to take an optimizer step, compared on the same scenarios.

    none            optimizer.step() as is (the scaler's step/update under fp16)
    clip            clip_grad_norm_(1.0) first, like the Hugging Face Trainer default
    skip_nonfinite  skip the step when the gradient norm is not finite, like a GradScaler does
    zclip           ZClip adaptive clipping (the `zclip` package), then the step
    protect         trainguard.Guard under the `protect` policy (the adaptive default clip, skip
                    non-finite steps)
    recover         trainguard.Guard under the `recover` policy (protect, plus rollback to the
                    last good state, LR backoff and tighter clipping when skipping is not enough)
    protect_clip1   `protect` with a fixed clip at max_grad_norm=1.0 (the default before the
    recover_clip1   adaptive clip, and the HF Trainer's), to compare the two side by side
    recover_deferred  `recover` under `sync="deferred"` (with `--fused`, to compare the two)
    trainguard      trainguard.Guard with a given GuardConfig (default: protect); the detection
                    and diagnosis report runs this one, so `--policy` still applies to it
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
from typing import Any

import torch

import trainguard
from trainguard import Guard, GuardConfig
from trainguard.events import ActionRecord, StepReport
from trainguard.sinks import Sink

from .base import Workload

STRATEGIES = ("none", "clip", "skip_nonfinite", "zclip", "trainguard", "protect", "recover",
              "protect_clip1", "recover_clip1", "recover_deferred")
RECOVERY_STRATEGIES = ("none", "clip", "skip_nonfinite", "zclip", "protect", "recover")
"""The six ways to take a step that the recovery benchmark compares side by side."""
_GUARD_POLICIES = {"protect": ("protect", None), "recover": ("recover", None),
                   "protect_clip1": ("protect", 1.0), "recover_clip1": ("recover", 1.0),
                   "recover_deferred": ("recover", None)}
"""Strategies that run trainguard under a fixed policy (and, for some, a fixed clip), whatever
the config names."""


class Stepper:
    """Takes one optimizer step after the backward passes of that step."""

    name = ""
    events: list[trainguard.Event]

    def __init__(self, workload: Workload) -> None:
        self.w = workload
        self.events = []

    def step(self, loss: torch.Tensor, batch: Any) -> str:
        raise NotImplementedError

    def before_forward(self, batch: Any) -> None:
        """Called with every micro-batch before the forward pass."""

    def begin_step(self, step: int) -> None:
        """Called at the start of optimizer step `step`."""

    def diagnosis(self) -> list[str]:
        """Ranked cause codes, most likely first (only trainguard diagnoses)."""
        return []

    def voted_diagnosis(self) -> list[str]:
        """The same ranking without what replays proved (only trainguard proves)."""
        return []

    def verdict(self) -> str | None:
        """The run's verdict, once closed (only trainguard gives one)."""
        return None

    def rolled_back_steps(self) -> int:
        """Updates thrown away by rollbacks: the extra compute a strategy spent (only `recover`
        rolls back)."""
        return 0

    def findings(self) -> list[dict[str, Any]]:
        """The preflight audit's findings (only trainguard audits)."""
        return []

    def observe_eval(self, metrics: dict[str, float], step: int) -> None:
        """The loop's evaluation metrics (only trainguard reads them)."""

    def close(self) -> None:
        pass

    # -- helpers shared by the plain strategies --------------------------------------------------
    def _unscale(self) -> None:
        if self.w.scaler is not None:
            self.w.scaler.unscale_(self.w.optimizer)

    def _apply(self) -> None:
        if self.w.scaler is not None:
            self.w.scaler.step(self.w.optimizer)
            self.w.scaler.update()
        else:
            self.w.optimizer.step()
        if self.w.scheduler is not None:
            self.w.scheduler.step()

    def _params(self) -> list[torch.Tensor]:
        return [p for p in self.w.model.parameters() if p.grad is not None]


class NoProtection(Stepper):
    name = "none"

    def step(self, loss: torch.Tensor, batch: Any) -> str:
        self._apply()
        return "applied"


class ClipGradNorm(Stepper):
    name = "clip"

    def step(self, loss: torch.Tensor, batch: Any) -> str:
        self._unscale()
        torch.nn.utils.clip_grad_norm_(self._params(), 1.0)
        self._apply()
        return "applied"


class SkipNonFinite(Stepper):
    name = "skip_nonfinite"

    def step(self, loss: torch.Tensor, batch: Any) -> str:
        self._unscale()
        norm = torch.nn.utils.get_total_norm([p.grad for p in self._params()])
        if not math.isfinite(float(norm)):
            if self.w.scaler is not None:
                self.w.scaler.update()
            return "skipped"
        self._apply()
        return "applied"


class ZClipStepper(Stepper):
    name = "zclip"

    def __init__(self, workload: Workload) -> None:
        super().__init__(workload)
        from zclip import ZClip

        self.zclip = ZClip(mode="zscore", alpha=0.97, z_thresh=2.5, max_grad_norm=1.0)

    def step(self, loss: torch.Tensor, batch: Any) -> str:
        self._unscale()
        self.zclip.step(self.w.model)
        self._apply()
        return "applied"


class StepLog(Sink):
    """Every step's report and every action, as the sinks hear them: under `sync="deferred"` a
    step is reported at the next call (the last one at the close), so counting the values
    `guard.step` returns would be one step off."""

    def __init__(self) -> None:
        self.reports: list[StepReport] = []
        self.actions: list[ActionRecord] = []

    def on_step(self, report: StepReport) -> None:
        self.reports.append(report)

    def on_action(self, action: ActionRecord) -> None:
        self.actions.append(action)


class GuardStepper(Stepper):
    name = "trainguard"

    def __init__(self, workload: Workload, config: GuardConfig | None = None,
                 run_dir: str | None = None) -> None:
        super().__init__(workload)
        config = config or GuardConfig(sinks={"console": False})
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        # crash snapshots of benchmark runs are not kept
        if config.checkpoints.snapshot_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="trainguard-scenario-")
            config = dataclasses.replace(config, checkpoints=dataclasses.replace(
                config.checkpoints, snapshot_dir=self._tmp.name))
        self.current_step = 0
        self.prove_at: int | None = None
        """The step whose update `guard.prove()` replays before it is taken (the check that a
        healthy step has nothing to heal)."""
        self.log = StepLog()
        self.guard = Guard(workload.model, workload.optimizer, workload.scheduler,
                           workload.scaler, config=config, run_dir=run_dir,
                           replay_fn=self._loss, sinks=[self.log],
                           noise_scheduler=workload.noise_scheduler,
                           kl_penalty=workload.kl_penalty)
        self.events = self.guard.events

    def _loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        """The loss of one micro-batch of the current step, as the loop computes it (a float16
        run's autocast is the prover's to set; bf16 autocast as the loop does)."""
        if self.w.autocast is None or self.w.scaler is not None:
            return self.w.loss(model, batch, self.current_step)
        with torch.autocast("cpu", dtype=self.w.autocast):
            return self.w.loss(model, batch, self.current_step)

    def begin_step(self, step: int) -> None:
        self.current_step = step

    def step(self, loss: torch.Tensor, batch: Any) -> str:
        if self.current_step == self.prove_at and batch is not None:
            self.guard.prove(batch)
        metrics = self.w.metrics(self.current_step) if self.w.metrics is not None else None
        report = self.guard.step(None if self.w.surrogate else loss, batch=batch,
                                 metrics=metrics)
        if self.guard.run.deferred:  # that report is the step before's: counted from the log
            return "deferred"
        assert report is not None
        return report.action

    def action_counts(self, refused: int = 0) -> dict[str, int]:
        """Each step's action as the Guard reported it (`refused`: batches the loop left out
        before the Guard saw them)."""
        counts: dict[str, int] = {"refused": refused} if refused else {}
        for report in self.log.reports:
            counts[report.action] = counts.get(report.action, 0) + 1
        return counts

    def voted_diagnosis(self) -> list[str]:
        """The ranking by votes alone (the replays' proofs left out)."""
        from trainguard.diagnose.ranking import rank_causes

        events = [e for e in self.guard.events if e.kind != "proof"]
        return [c.code for c in rank_causes(events, self.guard.run.evidence_findings())]

    def diagnosis(self) -> list[str]:
        return [cause.code for cause in self.guard.diagnose()]

    def verdict(self) -> str | None:
        return self.guard.verdict.verdict if self.guard.verdict is not None else None

    def findings(self) -> list[dict[str, Any]]:
        return [f.to_dict() for f in self.guard.findings]

    def observe_eval(self, metrics: dict[str, float], step: int) -> None:
        self.guard.observe_eval(metrics, step)

    def rolled_back_steps(self) -> int:
        recovery = self.guard.recovery
        return recovery.rolled_back_steps if recovery is not None else 0

    def before_forward(self, batch: Any) -> None:
        """`guard.check_batch`: a batch the model cannot take fails with a clear message (and an
        event that detected it) instead of an index error inside the model."""
        self.guard.check_batch(batch)

    def close(self) -> None:
        self.guard.close()
        if self._tmp is not None:
            self._tmp.cleanup()


def make_stepper(name: str, workload: Workload, config: GuardConfig | None = None,
                 run_dir: str | None = None) -> Stepper:
    if name == "trainguard":
        return GuardStepper(workload, config, run_dir)
    if name in _GUARD_POLICIES:
        policy, clip = _GUARD_POLICIES[name]
        config = dataclasses.replace(config or GuardConfig(sinks={"console": False}), policy=policy)
        if clip is not None:
            config = dataclasses.replace(
                config, clip=dataclasses.replace(config.clip, max_grad_norm=clip))
        if name.endswith("_deferred"):
            config = dataclasses.replace(config, sync="deferred")
        stepper = GuardStepper(workload, config, run_dir)
        stepper.name = name
        return stepper
    table: dict[str, type[Stepper]] = {"none": NoProtection, "clip": ClipGradNorm,
                                       "skip_nonfinite": SkipNonFinite, "zclip": ZClipStepper}
    if name not in table:
        raise ValueError(f"unknown strategy {name!r}; choose from {', '.join(STRATEGIES)}")
    return table[name](workload)
