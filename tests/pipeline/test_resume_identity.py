"""A run resumed from a checkpoint decides exactly as the run that was never interrupted.

The run has trouble on both sides of the checkpoint (a NaN batch, a loss spike, evaluation
metrics that first show learning and then collapse, batches checked before the forward pass)
under the `recover` policy. The checkpoint holds what a user's checkpoint holds: the model, the
optimizer, the scheduler, `guard.state_dict()` and the RNG. From the checkpoint on, the resumed
run must take the same actions, raise the same events at the same steps, clip at the same limits,
sample the same steps and end with the same verdict. Any piece of run state missing from
`state_dict` shows up here as a diverging decision.
"""

from __future__ import annotations

import copy
import io
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from trainguard import Guard, GuardConfig, RecoveryConfig

STEPS = 70
CHECKPOINT = 30
"""The checkpoint is taken after this many steps (a ring capture, confirmed before it)."""
NAN_BATCH = (24, 29, 52)
SHORT_BATCH = (29, 30)
"""Two short batches in a row are truncation: the second, after the checkpoint, says so."""
SPIKE = (26, 56)
ROLLBACK_AFTER = 49
"""The loop asks for a rollback after this step (to the ring's newest good state)."""
EVAL_EVERY = 5
CLASSES = 4


def _config() -> GuardConfig:
    # a fixed ring cadence: the measured one depends on the machine's timing
    return GuardConfig(policy="recover", recovery=RecoveryConfig(ring_every=10, ring_budget=None),
                       sinks={"console": False, "store": False}, probes={"num_classes": CLASSES,
                                                                         "sample_every": 7,
                                                                         "batch_size": 16})


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, CLASSES))


def _batch(step: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(16, 8, generator=gen)
    y = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()
    if step in SHORT_BATCH:
        x, y = x[:12], y[:12]
    if step in NAN_BATCH:
        x[3, 2] = math.nan
    if step in SPIKE:
        x = x * 400.0
    return {"x": x, "y": y}


def _accuracy(model: nn.Module, step: int) -> float:
    if step >= CHECKPOINT:
        return 0.26  # chance for four classes: the model stopped telling them apart
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(256, 8, generator=gen)
    y = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()
    with torch.no_grad():
        return float((model(x).argmax(-1) == y).float().mean())


@dataclass
class Trace:
    steps: list[tuple[Any, ...]] = field(default_factory=list)
    evals: list[tuple[Any, ...]] = field(default_factory=list)
    events: list[tuple[Any, ...]] = field(default_factory=list)
    verdict: Any = None


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, guard: Guard,
           first: int, last: int, trace: Trace) -> None:
    for step in range(first, last):
        batch = _batch(step)
        guard.check_batch(batch)
        loss = nn.functional.cross_entropy(model(batch["x"]), batch["y"])
        loss.backward()
        report = guard.step(loss, batch=batch)
        optimizer.zero_grad(set_to_none=True)
        trace.steps.append((report.step, report.action, report.sampled,
                            sorted((e.kind, e.step) for e in report.events),
                            guard.run.state.clip_limit(), guard.run.state.clip.fixed_limit))
        if step == ROLLBACK_AFTER:
            guard.rollback("the loop asked for it")
        if step % EVAL_EVERY == 0:
            trace.evals.append((step, [(e.kind, e.step, e.details.get("rule"))
                                       for e in guard.observe_eval(
                                           {"eval_accuracy": _accuracy(model, step)})]))


def _setup() -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    model = _model()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + 0.01 * s))
    return model, optimizer, scheduler


def _finish(guard: Guard, trace: Trace) -> Trace:
    guard.close()
    trace.events = [(e.kind, e.step, e.details.get("to_step")) for e in guard.events]
    assert guard.verdict is not None
    trace.verdict = (guard.verdict.to_dict(), guard.skipped_data)
    return trace


def test_a_resumed_run_decides_as_the_uninterrupted_one() -> None:
    # the uninterrupted run, checkpointed on the way as a user's loop would
    model, optimizer, scheduler = _setup()
    guard = Guard(model, optimizer, scheduler, config=_config())
    whole = Trace()
    _train(model, optimizer, scheduler, guard, 0, CHECKPOINT, whole)
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "guard": guard.state_dict(),
                "rng": torch.get_rng_state()}, buffer)
    before = copy.deepcopy(whole)
    _train(model, optimizer, scheduler, guard, CHECKPOINT, STEPS, whole)
    whole = _finish(guard, whole)

    # a fresh process: everything rebuilt, then loaded from the checkpoint
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    model, optimizer, scheduler = _setup()
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    torch.set_rng_state(saved["rng"])
    resumed_guard = Guard(model, optimizer, scheduler, config=_config(), resume=True)
    resumed_guard.load_state_dict(saved["guard"])
    resumed = Trace()
    _train(model, optimizer, scheduler, resumed_guard, CHECKPOINT, STEPS, resumed)
    resumed = _finish(resumed_guard, resumed)

    # the scenario has trouble on both sides of the checkpoint, and recovery acts after it
    kinds_after = {kind for kind, step, _ in whole.events if step >= CHECKPOINT}
    assert {"metric_collapse", "batch_nonfinite", "batch_size", "rollback"} <= kinds_after, \
        whole.events
    actions_after = {s[1] for s in whole.steps[CHECKPOINT:]}
    assert actions_after & {"skipped", "rolled_back"}, whole.steps

    assert resumed.steps == whole.steps[len(before.steps):]
    assert resumed.evals == whole.evals[len(before.evals):]
    assert resumed.events == [e for e in whole.events if e[1] >= CHECKPOINT]
    assert resumed.verdict == whole.verdict
