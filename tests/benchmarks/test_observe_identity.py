"""`observe` changes nothing in training: on every single-process scenario of the suite, losses
and weights under `Guard(policy="observe")` are bit-identical to the same loop without
trainguard (GradScaler skips, schedulers, eval hand-overs and accumulation included).

Each run is cut a few steps after the fault's onset (its first effect on the weights is then in
the comparison) to keep the suite fast. Scenarios whose plain loop crashes (a batch the model
cannot take: `guard.check_batch` turns the index error into a clear `BatchError` instead) are
compared up to the crash. The DDP scenarios run across processes and are left to their own
tests.

A cold scenario cache once made the first scenario of a family differ from step 1 (pre-training
left its grads on the model, and the first backward added to them): the comparison runs here on
whatever cache the machine has, and `tests/benchmarks/test_pretrain.py` checks a cold build
leaves the model as a warm one does."""

from __future__ import annotations

import math

import pytest
import torch
from benchmarks.scenarios import all_scenarios
from benchmarks.scenarios.base import Scenario
from benchmarks.scenarios.runner import one_step
from benchmarks.scenarios.strategies import make_stepper

from trainguard import GuardConfig

AFTER_ONSET = 4
"""Steps run after a fault's onset."""
HEALTHY_STEPS = 12
"""Steps of a healthy run: past a GradScaler's first skips and a few accumulated updates (an
fp16 step of the image classifier takes about 0.5 s on a CPU)."""


def _steps(scenario: Scenario) -> int:
    if scenario.onset_step is None:
        steps = HEALTHY_STEPS
        eval_every = scenario.build(0).eval_every
        if eval_every:  # an eval hand-over is in the comparison
            steps = max(steps, eval_every + 1)
        return min(scenario.steps, steps)
    return min(scenario.steps, scenario.onset_step + AFTER_ONSET)


def _run(scenario: Scenario, guarded: bool, steps: int) -> tuple[list[float], list[torch.Tensor]]:
    torch.manual_seed(0)
    workload = scenario.build(0)
    config = GuardConfig(policy="observe", sinks={"console": False}) if guarded else None
    stepper = make_stepper("trainguard" if guarded else "none", workload, config)
    losses: list[float] = []
    try:
        for step in range(steps):
            _, loss = one_step(workload, stepper, step)
            losses.append(loss)
            if (workload.eval_every and workload.eval_metrics is not None
                    and (step + 1) % workload.eval_every == 0):
                stepper.observe_eval(workload.eval_metrics(workload.model), step)
    except Exception:  # the plain loop's crash (check_batch's refusal under the Guard) ends both
        pass
    finally:
        stepper.close()
    return losses, [p.detach().clone() for p in workload.model.parameters()]


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's raw bytes (NaN payloads and signed zeros compared exactly)."""
    return t.contiguous().view(-1).view(torch.uint8)


def compare(scenario: Scenario) -> str | None:
    """Why the observed run differs from the plain one, or None when it is bit-identical."""
    steps = _steps(scenario)
    plain_losses, plain_weights = _run(scenario, False, steps)
    guarded_losses, guarded_weights = _run(scenario, True, steps)
    crashed = len(plain_losses) < steps
    if crashed:  # compare what both ran before the plain loop's crash
        guarded_losses = guarded_losses[:len(plain_losses)]
    elif len(guarded_losses) != steps:
        return f"the observed run stopped after {len(guarded_losses)} of {steps} steps"
    diverged = [i for i, (a, b) in enumerate(zip(plain_losses, guarded_losses, strict=True))
                if not _same(a, b)]
    if diverged:
        return f"losses differ from step {diverged[0]}"
    if not crashed:
        differ = [i for i, (a, b) in enumerate(zip(plain_weights, guarded_weights, strict=True))
                  if not torch.equal(_bits(a), _bits(b))]
        if differ:
            return f"{len(differ)} parameter tensors differ"
    return None


@pytest.mark.slow
@pytest.mark.parametrize("scenario", [s for s in all_scenarios() if not s.distributed],
                         ids=lambda s: s.name)
def test_observe_leaves_losses_and_weights_bit_identical(scenario: Scenario) -> None:
    why = compare(scenario)
    assert why is None, why
