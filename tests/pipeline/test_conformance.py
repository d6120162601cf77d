"""Contract tests over the step pipeline's stages: their order, one host transfer per step,
NaN inputs, the decision made once, and the runtime state's round trip."""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable
from typing import Any, get_type_hints

import pytest
import torch

from trainguard import Guard, GuardConfig, RecoveryConfig
from trainguard.pipeline import AFTER_UPDATE, BEFORE_UPDATE, STAGE_NAMES, Run, StepContext
from trainguard.pipeline.context import Detected, Measured, Settled
from trainguard.pipeline.deferred import LATE
from trainguard.pipeline.policy import Decision
from trainguard.pipeline.services import Services
from trainguard.pipeline.state import RunState
from trainguard.ranked_cause import RankedCause
from trainguard.remedies import AdaptiveClip
from trainguard.transfer import blocking_transfer_count, transfer_count

from ..conftest import make_setup

QUIET = {"sinks": {"console": False}}


def test_the_stage_order_is_written_once() -> None:
    assert STAGE_NAMES == ("measure", "detect", "explain", "decide", "act", "settle", "record")
    assert len(BEFORE_UPDATE) + len(AFTER_UPDATE) == len(STAGE_NAMES)


def test_each_stage_is_a_function_of_the_step_the_state_and_the_services() -> None:
    for stage in BEFORE_UPDATE + AFTER_UPDATE:
        assert list(inspect.signature(stage).parameters)[:3] == ["ctx", "state", "services"]
    setup = make_setup()
    run = Run(setup.model, setup.optimizer, config=GuardConfig(**QUIET))
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.services.model = setup.model  # type: ignore[misc]
    run.close()


def test_the_stages_hand_each_other_typed_results() -> None:
    """What measure, detect, explain, decide and settle produce is their return value, and each
    later stage is handed, by its parameters, the results it reads: no stage reads from the
    context what another stage wrote there before the update."""
    stages = {stage.__name__: stage for stage in BEFORE_UPDATE + AFTER_UPDATE}
    returns = {name: get_type_hints(stage)["return"] for name, stage in stages.items()}
    assert returns == {"measure": Measured, "detect": Detected, "explain": list[RankedCause],
                       "decide": Decision, "act": type(None), "settle": Settled,
                       "record": type(None)}
    inputs = {name: {param: hint for param, hint in get_type_hints(stage).items()
                     if param not in ("ctx", "state", "services", "return")}
              for name, stage in stages.items()}
    assert inputs == {"measure": {}, "detect": {"measured": Measured},
                      "explain": {"found": Detected},
                      "decide": {"measured": Measured, "found": Detected},
                      "act": {"measured": Measured, "decision": Decision},
                      "settle": {}, "record": {"settled": Settled}}


def test_the_deferred_judgement_has_the_shape_of_the_check() -> None:
    """`StepPipeline.judge` runs both: each late stage takes and returns what its blocking
    counterpart does."""
    for late, blocking in zip(LATE, BEFORE_UPDATE, strict=True):
        late_hints, blocking_hints = get_type_hints(late), get_type_hints(blocking)
        assert late_hints == blocking_hints, (late.__name__, blocking.__name__)


def test_the_step_context_keeps_only_what_passes_the_update() -> None:
    """The context carries the caller's inputs (the calm lane's measurement of a step it found
    not calm, and what the detectors raised on the steps it took, among them) and what the
    check hands its settling; the stages' results before the update travel as return values."""
    names = {f.name for f in dataclasses.fields(StepContext)}
    assert len(names) <= 23
    assert not names & {"signals", "grads", "extra", "batch_stats", "clip_limit", "report",
                        "queued", "sample_next", "nonfinite_input", "batch_inspected"}


def test_every_step_runs_the_stages_in_order() -> None:
    setup = make_setup()
    guard = Guard(setup.model, setup.optimizer, config=GuardConfig(**QUIET))
    seen: list[tuple[int, str]] = []
    pipeline = guard.run.steps
    pipeline.before = tuple(_Spy(stage, seen) for stage in pipeline.before)
    pipeline.after = tuple(_Spy(stage, seen) for stage in pipeline.after)
    for _ in range(3):
        loss = setup.model.loss(setup.batch())
        loss.backward()
        guard.step(loss)
        setup.optimizer.zero_grad(set_to_none=True)
    guard.close()
    assert seen == [(step, name) for step in range(3) for name in STAGE_NAMES]


class _Spy:
    def __init__(self, stage: Callable[..., Any], seen: list[tuple[int, str]]) -> None:
        self.stage, self.seen = stage, seen
        self.__name__ = stage.__name__

    def __call__(self, ctx: StepContext, state: RunState, services: Services,
                 *results: Any) -> Any:
        self.seen.append((ctx.step, self.__name__))
        return self.stage(ctx, state, services, *results)


@pytest.mark.parametrize("config", [
    GuardConfig(**QUIET),
    GuardConfig(probes={"sample_all_steps": True}, **QUIET),
    GuardConfig(policy="recover", recovery=RecoveryConfig(ring_every=2, confirm_steps=1),
                clip={"rule": AdaptiveClip(warmup_steps=2)}, **QUIET),
], ids=["default", "all_probes", "recover_with_rule"])
def test_the_stages_make_one_host_transfer_per_step(config: GuardConfig) -> None:
    setup = make_setup()
    guard = Guard(setup.model, setup.optimizer, setup.scheduler, config=config)
    counts, blocking = [], []
    for step in range(8):
        batch = setup.batch()
        loss = setup.model.loss(batch)
        if step == 5:
            loss = loss * math.nan
        loss.backward()
        before, blocked = transfer_count(), blocking_transfer_count()
        guard.step(loss, batch=batch)
        counts.append(transfer_count() - before)
        blocking.append(blocking_transfer_count() - blocked)
        setup.optimizer.zero_grad(set_to_none=True)
    guard.close()
    # a NaN step inspects its batch in full (one more transfer, on an anomaly only)
    assert counts[:5] == [1] * 5 and counts[6:] == [1] * 2
    assert counts[5] <= 2
    assert blocking == counts  # the host waits for every one of them


def test_nan_everywhere_is_skipped_not_fatal() -> None:
    setup = make_setup()
    guard = Guard(setup.model, setup.optimizer, config=GuardConfig(**QUIET))
    for _ in range(3):
        loss = setup.model.loss(setup.batch())
        loss.backward()
        for p in setup.model.parameters():
            p.grad.fill_(math.nan)
        report = guard.step(loss * math.nan)
        setup.optimizer.zero_grad(set_to_none=True)
        assert report.action == "skipped"
        assert {"nonfinite_loss", "nonfinite_grad"} <= {e.kind for e in report.events}
    guard.close()
    assert all(torch.isfinite(p).all() for p in setup.model.parameters())


def test_a_step_is_decided_once() -> None:
    ctx = StepContext(step=0, loss=None)
    ctx.decide(Decision("applied"))
    with pytest.raises(RuntimeError, match="already decided"):
        ctx.decide(Decision("skipped"))
    with pytest.raises(AttributeError):
        ctx.decision.action = "skipped"  # type: ignore[misc, union-attr]


def test_the_runtime_state_round_trips_with_rule_and_recovery_state() -> None:
    config = GuardConfig(policy="recover", clip={"rule": AdaptiveClip(warmup_steps=3)}, **QUIET)
    setup = make_setup(seed=1)
    guard = Guard(setup.model, setup.optimizer, config=config)
    for _ in range(12):
        loss = setup.model.loss(setup.batch())
        loss.backward()
        guard.step(loss)
        setup.optimizer.zero_grad(set_to_none=True)
    state = guard.state_dict()
    guard.close()
    assert state["step"] == 12
    assert state["clip_rule"] and state["recovery"] and state["detectors"]
    other = make_setup(seed=1)
    resumed = Run(other.model, other.optimizer, config=config)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state
    resumed.close()


def test_the_config_holds_no_state() -> None:
    """Two runs from one config share no rule statistics."""
    config = GuardConfig(clip={"rule": AdaptiveClip(warmup_steps=2)}, **QUIET)
    first, second = make_setup(seed=0), make_setup(seed=0)
    a = Run(first.model, first.optimizer, config=config)
    b = Run(second.model, second.optimizer, config=config)
    assert a.state.clip.rule is not b.state.clip.rule
    for _ in range(4):
        loss = first.model.loss(first.batch())
        loss.backward()
        a.before_update(loss)
        first.optimizer.step()
        a.after_update()
        first.optimizer.zero_grad(set_to_none=True)
    assert a.state_dict()["clip_rule"] != b.state_dict()["clip_rule"]
    a.close()
    b.close()
