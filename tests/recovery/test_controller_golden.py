"""The recover policy's judgement gives exactly the recorded verdicts on a fixed set of runs.

Seeded runs of host signals and events (spikes that settle or not, bursts of non-finite steps,
bad batches, the kinds that roll back at once, alone and together, kinds the judgement ignores,
events of info severity) under varied settings; `controller_golden.json` holds each run's
verdicts (step, action, onset, suspect steps) and a digest of the reasons and the final
state. A change of the judgement shows here; a deliberate one is recorded again with
`python -m tests.recovery.test_controller_golden`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trainguard import DetectorConfig, Event, RecoveryConfig
from trainguard.recovery import RecoveryController
from trainguard.signals import StepSignals

GOLDEN = Path(__file__).with_name("controller_golden.json")
RUNS = 80
STEPS = 60
SEED = 20240612

AT_ONCE = ["loss_divergence", "nonfinite_weight", "nonfinite_optimizer_state", "extreme_weight"]
WATCHED = ["loss_spike", "grad_explosion"]
IGNORED = ["fp16_overflow", "bad_start", "batch_nonfinite", "batch_outlier", "batch_size",
           "rollback", "monitor_error", "my_own_kind"]
SEVERITIES = ["warning", "error", "error", "critical", "info"]


@dataclass
class Step:
    loss: float
    grad_norm: float
    kinds: list[tuple[str, str]] = field(default_factory=list)
    """(kind, severity) of the step's events."""
    applies_update: bool = True
    bad_input: bool = False
    amp_overflow: bool = False


@dataclass
class Run:
    settings: dict[str, Any]
    sample_every: int
    steps: list[Step]


def _some(rng: random.Random, kinds: list[str]) -> list[tuple[str, str]]:
    return [(k, rng.choice(SEVERITIES)) for k in rng.sample(kinds, rng.choice([1, 2]))]


def _steps(rng: random.Random) -> list[Step]:
    steps: list[Step] = []
    elevated = 0
    for _ in range(STEPS):
        loss = 2.0 * (1 + 0.05 * rng.random())
        step = Step(loss=loss, grad_norm=1.0)
        if elevated:  # the aftermath of a spike: still up, or back
            elevated -= 1
            step.loss = rng.choice([loss * 30, loss * 2.5, loss * 1.1])
            step.applies_update = rng.random() < 0.7
        draw = rng.random()
        if draw < 0.08:
            step.loss = loss * rng.choice([25.0, 40.0])
            step.kinds = _some(rng, WATCHED)
            elevated = rng.choice([0, 2, 8])
        elif draw < 0.14:
            step.loss, step.grad_norm = rng.choice([(math.nan, math.nan), (loss, math.inf),
                                                    (math.inf, math.nan)])
            step.kinds = [("nonfinite_loss", "error"), ("nonfinite_grad", "error")]
            step.bad_input = rng.random() < 0.3
            step.amp_overflow = math.isfinite(step.loss) and rng.random() < 0.5
        elif draw < 0.19:
            step.kinds = _some(rng, AT_ONCE)
            if rng.random() < 0.3:
                step.kinds.append((rng.choice(WATCHED), "error"))
        elif draw < 0.27:
            step.kinds = [(rng.choice(IGNORED), rng.choice(SEVERITIES))]
        rng.shuffle(step.kinds)
        steps.append(step)
    return steps


@functools.cache
def runs() -> list[Run]:
    rng = random.Random(SEED)
    return [Run(settings={"settle_steps": rng.choice([3, 5, 10]),
                          "rollback_after_skips": rng.choice([2, 3]),
                          "max_rollbacks": rng.choice([1, 3, 5])},
                sample_every=rng.choice([10, 50]), steps=_steps(rng)) for _ in range(RUNS)]


def play(run: Run, controller_type: Callable[..., Any] = RecoveryController) -> dict[str, Any]:
    """Judge every step as the recovery does (rolled back after each rollback verdict)."""
    c = controller_type(RecoveryConfig(**run.settings), DetectorConfig(),
                        sample_every=run.sample_every)
    verdicts, reasons = [], []
    for index, s in enumerate(run.steps):
        signals = StepSignals(step=index, loss=s.loss, grad_norm=s.grad_norm,
                              param_grad_norm=np.array([s.grad_norm]), param_names=["w"],
                              amp_overflow=s.amp_overflow)
        events = [Event(kind=k, step=index, severity=sev, message=k)  # type: ignore[arg-type]
                  for k, sev in s.kinds]
        verdict = c.review(signals, events, s.applies_update, bad_input=s.bad_input)
        if verdict is None:
            continue
        verdicts.append([index, verdict.action, verdict.onset, verdict.bad_steps])
        reasons.append(verdict.reason)
        if verdict.action == "rollback":
            c.rolled_back()
    full = json.dumps([reasons, c.state_dict()], sort_keys=True)
    return {"verdicts": verdicts, "digest": hashlib.sha256(full.encode()).hexdigest()[:16]}


def record(controller_type: Callable[..., Any] = RecoveryController) -> list[dict[str, Any]]:
    return [play(run, controller_type) for run in runs()]


@pytest.fixture(scope="module")
def golden() -> list[dict[str, Any]]:
    return json.loads(GOLDEN.read_text())


def test_the_runs_meet_every_reaction() -> None:
    seen = {k for run in runs() for s in run.steps for k, _ in s.kinds}
    assert set(AT_ONCE + WATCHED + IGNORED) <= seen
    together = [s for run in runs() for s in run.steps
                if len({k for k, _ in s.kinds} & set(AT_ONCE)) == 2]
    assert together, "kinds that roll back at once, arriving together"


@pytest.mark.parametrize("index", range(RUNS))
def test_the_judgement_gives_the_recorded_verdicts(golden, index: int) -> None:
    got = play(runs()[index])
    assert got["verdicts"] == golden[index]["verdicts"]
    assert got["digest"] == golden[index]["digest"]  # reasons and the final state too


if __name__ == "__main__":  # record the current judgement's verdicts (after a deliberate change)
    GOLDEN.write_text(json.dumps(record(), separators=(",", ":")) + "\n")
