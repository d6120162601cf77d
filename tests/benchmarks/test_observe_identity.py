"""`observe` changes nothing in training: on every single-process scenario of the suite, losses
and weights under `Guard(policy="observe")` are bit-identical to the same loop without
trainguard (GradScaler skips, schedulers, eval hand-overs and accumulation included).

Each run is cut a few steps after the fault's onset (its first effect on the weights is then in
the comparison) to keep the suite fast. Scenarios whose plain loop crashes (a batch the model
cannot take: `guard.check_batch` turns the index error into a clear `BatchError` instead) are
compared up to the crash. The DDP scenarios run across processes and are left to their own
tests.

The convolutional families run their pair in a fresh interpreter: CPU convolution kernels may
round differently with the alignment of their buffers, which a long-lived process's allocation
history decides (in a suite's process, after hundreds of other tests, such a pair once differed
from step 1 with or without trainguard's code in the loop; run on its own it never has)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from benchmarks.scenarios import all_scenarios
from benchmarks.scenarios.base import Scenario
from benchmarks.scenarios.runner import one_step
from benchmarks.scenarios.strategies import make_stepper

from trainguard import GuardConfig

AFTER_ONSET = 8
"""Steps run after a fault's onset."""
HEALTHY_STEPS = 30


def _steps(scenario: Scenario) -> int:
    if scenario.onset_step is None:
        return min(scenario.steps, HEALTHY_STEPS)
    return min(scenario.steps, scenario.onset_step + AFTER_ONSET)


def _run(scenario: Scenario, guarded: bool, steps: int) -> tuple[list[float], list[torch.Tensor]]:
    torch.manual_seed(0)
    workload = scenario.build(0)
    config = GuardConfig(policy="observe", console=False) if guarded else None
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


FRESH_PROCESS = frozenset({"image_cls", "diffusion"})
"""Families compared in a fresh interpreter (see above)."""
ROOT = Path(__file__).resolve().parents[2]


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


def _in_fresh_process(name: str) -> str | None:
    code = ("import sys, torch\n"
            "torch.set_num_threads(1)\n"
            "from benchmarks.scenarios import scenario\n"
            "from tests.benchmarks.test_observe_identity import compare\n"
            "print(compare(scenario(sys.argv[1])) or 'same')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    done = subprocess.run([sys.executable, "-c", code, name], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    verdict = done.stdout.strip().splitlines()[-1]
    return None if verdict == "same" else verdict


@pytest.mark.slow
@pytest.mark.parametrize("scenario", [s for s in all_scenarios() if not s.distributed],
                         ids=lambda s: s.name)
def test_observe_leaves_losses_and_weights_bit_identical(scenario: Scenario) -> None:
    why = (_in_fresh_process(scenario.name) if scenario.family in FRESH_PROCESS
           else compare(scenario))
    assert why is None, why
