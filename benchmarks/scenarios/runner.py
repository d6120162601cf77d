"""Run one scenario under one strategy and score it against the ground truth."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from trainguard import GuardConfig, TrainingDiverged
from trainguard.errors import BatchError
from trainguard.events import SEVERITY_RANK

from .base import Scenario, Workload, make_fused
from .strategies import GuardStepper, Stepper, make_stepper

DETECTION_SEVERITY = "warning"


@dataclass
class RunResult:
    scenario: str
    family: str
    cause: str | None
    onset_step: int | None
    strategy: str
    steps_run: int
    outcome: str
    """finished, halted (trainguard stopped it), crashed (an exception) or nan (finished with
    non-finite weights)."""
    final_eval_loss: float
    train_losses: list[float]
    actions: dict[str, int]
    events: list[dict[str, Any]]
    seconds: float
    error: str = ""
    detected: bool | None = None
    latency: int | None = None
    false_alarms: int = 0
    diagnosis: list[str] = field(default_factory=list)
    """Ranked cause codes from trainguard's diagnosis, most likely first."""
    voted_diagnosis: list[str] = field(default_factory=list)
    """The same ranking by votes alone, without what replays of bad steps proved."""
    notes: dict[str, Any] = field(default_factory=dict)
    findings: list[dict[str, Any]] = field(default_factory=list)
    """The preflight audit's findings (trainguard strategies only)."""
    rolled_back_steps: int = 0
    """Updates thrown away by rollbacks (`guard.recovery.rolled_back_steps`): the extra compute
    the `recover` strategy spent. 0 for strategies that never roll back."""
    verdict: str | None = None
    """The run's verdict (`guard.verdict`: healthy, recovered, degraded, stalled); None for
    strategies without one."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _alarming(severity: str) -> bool:
    return SEVERITY_RANK[severity] >= SEVERITY_RANK[DETECTION_SEVERITY]


def score(result: RunResult, scenario: Scenario) -> None:
    """Fill detected / latency / false_alarms from the events, the preflight findings and the
    ground truth. Alarms are events and preflight findings of warning severity or worse (an
    `info` event, such as a noted LR change, is a note, not an alarm). A configuration fault
    present from step 0 counts as detected, with latency 0, when the preflight reports its cause
    at warning or worse."""
    events = [e for e in result.events if _alarming(e["severity"])]
    warned = [f for f in result.findings if _alarming(f["severity"])]
    if scenario.healthy:
        result.false_alarms = len(events) + len(warned)
        return
    onset = scenario.onset_step or 0
    result.false_alarms = sum(1 for e in events if e["step"] < onset)
    hits = [e["step"] for e in events if e["step"] >= onset]
    if onset == 0 and any(f.get("cause") == scenario.cause for f in warned):
        hits.append(0)
    result.detected = bool(hits)
    result.latency = (min(hits) - onset) if hits else None


def rolled_back_steps_of(events: list[dict[str, Any]]) -> int:
    """Updates undone by the rollbacks among `events` (for runs whose stepper is out of reach,
    as on the ranks of a distributed run)."""
    return sum(int(e.get("details", {}).get("steps_undone", 0)) for e in events
               if e.get("kind") == "rollback")


def one_step(workload: Workload, stepper: Stepper, step: int) -> tuple[str, float]:
    """Forward/backward of every micro-batch of `step`, then the stepper's optimizer step.

    Under DDP, gradients are all-reduced on the last micro-batch only, as accumulation should.
    A batch that `guard.check_batch` refuses (BatchError: the model cannot take it) is left out,
    as a loop that checks its batches does: the step is "refused" and training goes on.
    """
    model = workload.model
    batch = None
    step_loss = torch.zeros(())
    stepper.begin_step(step)
    if workload.before_step is not None:
        workload.before_step(step)
    backward = workload.skips_backward is None or not workload.skips_backward(step)
    for micro in range(workload.accumulation):
        batch = workload.batch(step, micro)
        try:
            stepper.before_forward(batch)
        except BatchError:
            workload.optimizer.zero_grad(set_to_none=True)
            return "refused", math.nan
        last = micro == workload.accumulation - 1
        sync = (nullcontext() if last or not isinstance(model, nn.parallel.DistributedDataParallel)
                else model.no_sync())
        with sync:
            with torch.autocast("cpu", dtype=workload.autocast or torch.bfloat16,
                                enabled=workload.autocast is not None):
                loss = workload.loss(model, batch, step)
            scaled = loss / workload.accumulation
            if backward:
                (workload.scaler.scale(scaled) if workload.scaler is not None
                 else scaled).backward()
        step_loss = step_loss + scaled.detach().float()
    # one micro-batch: the loss as a loop hands it over, its graph included
    handed = loss.float() if workload.accumulation == 1 else step_loss
    if workload.after_backward is not None:
        workload.after_backward(step)
    action = stepper.step(handed, batch)
    if workload.skips_zero_grad is None or not workload.skips_zero_grad(step):
        workload.optimizer.zero_grad(set_to_none=True)
    return action, float(step_loss)


def run_scenario(scenario: Scenario, strategy: str = "trainguard", *,
                 config: GuardConfig | None = None, seed: int = 0,
                 steps: int | None = None, fused: bool = False,
                 inspect: Callable[[Workload, Stepper], None] | None = None) -> RunResult:
    """`fused`: the workload's Adam, AdamW or SGD made fused before the run (what
    `sync="deferred"` needs; not for the distributed scenarios). `inspect(workload, stepper)`
    is called once the stepper is closed, before the held-out evaluation (to read the final
    weights, the Guard's log)."""
    if scenario.distributed:
        from .distributed import run_distributed

        result = run_distributed(scenario, strategy, config=config, seed=seed, steps=steps)
        result.rolled_back_steps = rolled_back_steps_of(result.events)  # rank 0's rollbacks
        result.voted_diagnosis = result.voted_diagnosis or result.diagnosis  # nothing proved
        score(result, scenario)
        return result
    torch.manual_seed(seed)
    workload = scenario.build(seed)
    if fused:
        workload.notes["fused"] = make_fused(workload.optimizer)
    stepper = make_stepper(strategy, workload, config)
    total = steps if steps is not None else scenario.steps
    if scenario.healthy and isinstance(stepper, GuardStepper) and (
            config is not None and config.prove.mode == "on"):
        stepper.prove_at = total // 2  # a healthy step must have nothing to heal
    losses: list[float] = []
    actions: dict[str, int] = {}
    outcome, error = "finished", ""
    started = time.perf_counter()
    step = 0
    try:
        for step in range(total):
            action, loss = one_step(workload, stepper, step)
            actions[action] = actions.get(action, 0) + 1
            losses.append(loss)
            if (workload.eval_every and workload.eval_metrics is not None
                    and (step + 1) % workload.eval_every == 0):
                stepper.observe_eval(workload.eval_metrics(workload.model), step)
        step = total
    except TrainingDiverged as exc:
        outcome, error = "halted", str(exc).splitlines()[0][:300]
        actions["halted"] = actions.get("halted", 0) + 1
    except Exception as exc:  # the outcome of a broken run, recorded rather than raised
        first_line = (str(exc).splitlines() or [""])[0][:300]
        outcome, error = "crashed", f"{type(exc).__name__}: {first_line}"
    finally:
        stepper.close()
    if isinstance(stepper, GuardStepper):  # as reported, under sync="deferred" too
        halted = actions.get("halted", 0)
        actions = stepper.action_counts(refused=actions.get("refused", 0))
        if halted and "halted" not in actions:  # a halt the log did not hear (a crash)
            actions["halted"] = halted
    if inspect is not None:
        inspect(workload, stepper)
    eval_loss = workload.evaluate(workload.model)
    if outcome == "finished" and not all(torch.isfinite(p).all()
                                         for p in workload.model.parameters()):
        outcome = "nan"
    result = RunResult(
        scenario=scenario.name, family=scenario.family, cause=scenario.cause,
        onset_step=scenario.onset_step, strategy=strategy, steps_run=step, outcome=outcome,
        final_eval_loss=eval_loss if math.isfinite(eval_loss) else float("nan"),
        train_losses=losses, actions=actions,
        events=[e.to_dict() for e in stepper.events],
        seconds=time.perf_counter() - started, error=error, notes=dict(workload.notes),
        diagnosis=stepper.diagnosis(), voted_diagnosis=stepper.voted_diagnosis(),
        rolled_back_steps=stepper.rolled_back_steps(),
        findings=stepper.findings(), verdict=stepper.verdict())
    score(result, scenario)
    return result
