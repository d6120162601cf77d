"""The calm lane (`pipeline/calm.py`): a run with it trains, detects, decides and records as the
same run checked in full at every step."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import nn

import trainguard
from trainguard.errors import TrainingDiverged

Fault = Callable[[int, dict[str, torch.Tensor], torch.optim.Optimizer], None]


@dataclass
class Outcome:
    reports: list[str] = field(default_factory=list)
    events: list[tuple[Any, ...]] = field(default_factory=list)
    state: str = ""
    weights: list[torch.Tensor] = field(default_factory=list)
    verdict: Any = None
    halted_at: int | None = None
    lane_steps: int = 0


def _train(lane: bool, *, steps: int = 360, policy: str = "protect", fault: Fault | None = None,
           batch: bool = True, seed: int = 0, model: Callable[[], nn.Module] | None = None,
           regression: bool = False, sgd: bool = False, config: dict[str, Any] | None = None,
           between: Callable[[int, trainguard.Guard], None] | None = None) -> Outcome:
    """`model`: another model than the MLP classifier; `regression`: a regression of the sum of
    the first three inputs (one output); `sgd`: SGD with momentum instead of AdamW; `between`:
    called after each step with the Guard."""
    torch.manual_seed(seed)
    net = (model() if model is not None
           else nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1 if regression else 4)))
    optimizer = (torch.optim.SGD(net.parameters(), lr=1e-2, momentum=0.9) if sgd
                 else torch.optim.AdamW(net.parameters(), lr=3e-3))
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    guard = trainguard.Guard(net, optimizer, scheduler,
                             config=trainguard.GuardConfig(policy=policy,
                                                           sinks={"console": False},
                                                           **(config or {})))
    if not lane:
        guard.run.calm = None
    out = Outcome()
    generator = torch.Generator().manual_seed(seed)
    try:
        for step in range(steps):
            data = {"x": torch.randn(32, 16, generator=generator)}
            data["y"] = (data["x"][:, :4].argmax(dim=1) + (step % 7 == 0)) % 4
            if fault is not None:
                fault(step, data, optimizer)
            scores = net(data["x"])
            loss = (nn.functional.mse_loss(scores.squeeze(-1), data["x"][:, :3].sum(1))
                    if regression else nn.functional.cross_entropy(scores, data["y"]))
            loss.backward()
            rows = len(guard.run.calm.rows) if guard.run.calm is not None else 0
            report = guard.step(loss, batch=data if batch else None)
            if guard.run.calm is not None and len(guard.run.calm.rows) > rows:
                out.lane_steps += 1
            optimizer.zero_grad(set_to_none=True)
            if between is not None:
                between(step, guard)
            assert report is not None
            out.reports.append(repr((report.step, report.loss, report.grad_norm, report.action,
                                     report.clip_coef, report.lr)))
    except TrainingDiverged as exc:
        out.halted_at = exc.report.step if exc.report is not None else -1
    guard.close()
    out.events = [(e.kind, e.step, e.severity, e.message) for e in guard.events]
    out.state = json.dumps(guard.run.state.detector_state(), sort_keys=True, default=str)
    out.weights = [p.detach().clone() for p in net.parameters()]
    out.verdict = repr(guard.verdict)
    return out


def _same(lane: Outcome, full: Outcome) -> None:
    assert lane.halted_at == full.halted_at
    assert lane.reports == full.reports
    assert sorted(lane.events, key=lambda e: (e[1], e[0])) == sorted(
        full.events, key=lambda e: (e[1], e[0]))
    assert lane.state == full.state
    assert all(torch.allclose(a, b, rtol=0.0, atol=0.0, equal_nan=True)
               for a, b in zip(lane.weights, full.weights, strict=True))
    assert lane.verdict == full.verdict


def test_a_healthy_run_takes_most_steps_in_the_lane_and_ends_as_checked_in_full() -> None:
    lane, full = _train(True), _train(False)
    _same(lane, full)
    assert lane.lane_steps >= 120 and full.lane_steps == 0


def test_a_batch_given_with_batch_inspection_off_takes_the_lane_as_well() -> None:
    """Nothing reads the batch's size then (its reference is set by the inspection)."""
    off = {"probes": {"inspect_batches": False}}
    lane, full = _train(True, config=off), _train(False, config=off)
    _same(lane, full)
    assert lane.lane_steps >= 120


def _clean_labels(step: int, data: dict[str, torch.Tensor], _: torch.optim.Optimizer) -> None:
    data["y"] = data["x"][:, :4].argmax(dim=1)


def _deeper() -> nn.Module:
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 4))


def test_a_classifier_that_learns_takes_its_steps_in_the_lane_as_checked_in_full() -> None:
    # its log Z climbs with its confidence while the loss comes down: the precursor may not
    # warn then, and the lane takes those steps (142 of 400 when it asked for log Z's bound)
    lane = _train(True, steps=400, fault=_clean_labels, model=_deeper)
    full = _train(False, steps=400, fault=_clean_labels, model=_deeper)
    _same(lane, full)
    assert lane.events == []
    assert lane.lane_steps >= 300


def _learning_then_creeping(step: int, data: dict[str, torch.Tensor],
                            optimizer: torch.optim.Optimizer) -> None:
    _clean_labels(step, data, optimizer)
    _creeping_lr(step, data, optimizer)


@pytest.mark.parametrize("policy", ["observe", "protect"])
def test_a_learner_whose_lr_then_creeps_up_warns_as_checked_in_full(policy: str) -> None:
    lane = _train(True, steps=400, policy=policy, fault=_learning_then_creeping, model=_deeper)
    full = _train(False, steps=400, policy=policy, fault=_learning_then_creeping, model=_deeper)
    _same(lane, full)
    assert any(kind == "instability_precursor" for kind, *_ in lane.events)


def test_rows_that_raise_nothing_are_handed_over_between_steps_and_the_lane_stays_open() -> None:
    """After `MAX_ROWS` calm steps the rows go to the detectors between two steps; when they
    raise nothing the next step is the lane's too, not a full check that would only hand them
    over (the run still ends as checked in full)."""
    from trainguard.pipeline.calm import MAX_ROWS

    kept: list[int] = []

    def rows_after(step: int, guard: trainguard.Guard) -> None:
        assert guard.run.calm is not None
        kept.append(len(guard.run.calm.rows))

    # a smooth regression sampled every 100 steps exactly (no cadence set by timing)
    setup: dict[str, Any] = {"regression": True, "batch": False, "steps": 500,
                             "config": {"probes": {"sample_every": 100, "sample_budget": None}}}
    lane = _train(True, between=rows_after, **setup)
    _same(lane, _train(False, **setup))
    assert max(kept) < MAX_ROWS
    handed = [i for i in range(1, len(kept) - 1) if kept[i - 1] == MAX_ROWS - 1 and kept[i] == 0]
    assert handed and all(kept[i + 1] == 1 for i in handed)  # the step after: in the lane


def _regression_run(lane: bool, steps: int, lr_at: Callable[[int], float] = lambda _: 1.0,
                    stop: Callable[[trainguard.Guard], bool] | None = None
                    ) -> tuple[list[tuple[Any, ...]], trainguard.Guard]:
    """A smooth regression sampled every 100 steps exactly, under a `LambdaLR` of `lr_at`: its
    reports (step, action, event kinds) and its Guard, still open; `stop(guard)` True after a
    step ends the loop there."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(net.parameters(), lr=3e-4)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
    guard = trainguard.Guard(net, optimizer, scheduler, config=trainguard.GuardConfig(
        policy="protect", sinks={"console": False},
        probes={"sample_every": 100, "sample_budget": None}))
    if not lane:
        guard.run.calm = None
    generator = torch.Generator().manual_seed(0)
    reports: list[tuple[Any, ...]] = []
    for _ in range(steps):
        x = torch.randn(32, 16, generator=generator)
        loss = nn.functional.mse_loss(net(x).squeeze(-1), x[:, :3].sum(1))
        loss.backward()
        report = guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
        assert report is not None
        reports.append((report.step, report.action, sorted(e.kind for e in report.events)))
        if stop is not None and stop(guard):
            break
    return reports, guard


def test_an_lr_jump_just_after_rows_handed_over_between_steps_is_the_full_checks() -> None:
    """The scheduler's step after the lane handed its rows over raises the LR 100x: the next
    step is compared with the LR of the step before it, as every lane step is, and goes to the
    full check, which tells the jump at that step."""
    from trainguard.pipeline.calm import MAX_ROWS

    kept: list[int] = []

    def rows_kept(guard: trainguard.Guard) -> bool:
        assert guard.run.calm is not None
        kept.append(len(guard.run.calm.rows))
        return False

    _, guard = _regression_run(True, 600, stop=rows_kept)
    guard.close()
    handed = next(i for i in range(1, len(kept)) if kept[i - 1] == MAX_ROWS - 1 and kept[i] == 0)

    def jump(step: int) -> float:  # the scheduler's step after step `handed` takes it up
        return 1.0 if step <= handed else 100.0

    lane, guard = _regression_run(True, handed + 3, jump)
    guard.close()
    full, guard = _regression_run(False, handed + 3, jump)
    guard.close()
    assert lane == full and "lr_change" in lane[handed + 1][2]


@pytest.mark.parametrize("read_between", [False, True])
def test_what_rows_handed_over_between_steps_raise_is_told(
        monkeypatch: pytest.MonkeyPatch, read_between: bool) -> None:
    """A detector raises on the rows handed over after `MAX_ROWS` (a warning made up here, on
    the last row): the lane stays closed, and the next step, a full one, reports it with its
    row's step for its decision to read; the run's events read between the two steps tell it
    too, once."""
    from trainguard.events import Event
    from trainguard.pipeline import calm

    judged = calm._judged

    def raising(detector: Any, rows: list[Any], columns: Any) -> list[Event]:
        found = judged(detector, rows, columns)
        if len(rows) >= calm.MAX_ROWS and detector.kind == "loss_spike":
            found.append(Event(kind="loss_spike", step=rows[-1].signals.step,
                               severity="warning", message="made up on the last calm row"))
        return found

    monkeypatch.setattr(calm, "_judged", raising)
    made_up: list[int] = []

    def held(guard: trainguard.Guard) -> bool:
        lane = guard.run.calm
        assert lane is not None
        made_up.extend(e.step for e in lane.held)
        return bool(lane.held)

    _, guard = _regression_run(True, 600, stop=held)
    assert made_up and guard.run.calm is not None and guard.run.calm.bounds is None
    told_between = ([e.step for e in guard.events if e.message.startswith("made up")]
                    if read_between else [])  # (reading the events hands them over)
    x = torch.randn(32, 16)
    model = guard.model
    loss = nn.functional.mse_loss(model(x).squeeze(-1), x[:, :3].sum(1))
    loss.backward()
    report = guard.step(loss)
    guard.close()
    assert report is not None and report.step == made_up[0] + 1
    in_report = [e.step for e in report.events if e.message.startswith("made up")]
    told = [e.step for e in guard.events if e.message.startswith("made up")]
    assert told == made_up
    if read_between:
        assert told_between == made_up and in_report == []
    else:
        assert in_report == made_up


def test_without_a_batch_too() -> None:
    _same(_train(True, batch=False), _train(False, batch=False))


def _spike(step: int, data: dict[str, torch.Tensor], _: torch.optim.Optimizer) -> None:
    if step == 200:
        data["x"] = data["x"] * 300.0


def _nan(step: int, data: dict[str, torch.Tensor], _: torch.optim.Optimizer) -> None:
    if step == 250:
        data["x"][0, 0] = math.nan


def _lr_jump(step: int, _: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer) -> None:
    if step == 180:
        for group in optimizer.param_groups:
            group["lr"] *= 100.0


def _creeping_lr(step: int, _: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer
                 ) -> None:
    if step >= 150:  # the loop's own LR, 1.04x a step: a slow divergence
        for group in optimizer.param_groups:
            group["lr"] *= 1.04


def _short_batches(step: int, data: dict[str, torch.Tensor], _: torch.optim.Optimizer) -> None:
    if step >= 300:
        data["x"], data["y"] = data["x"][:20], data["y"][:20]


def _unfrozen(step: int, _: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer) -> None:
    if step in (0, 200):  # the first layer frozen in the optimizer, then trained from step 200
        for param in optimizer.param_groups[0]["params"][:2]:
            param.requires_grad_(step == 200)


@pytest.mark.parametrize("fault", [_spike, _nan, _lr_jump, _creeping_lr, _short_batches,
                                   _unfrozen])
@pytest.mark.parametrize("policy", ["observe", "protect", "halt"])
def test_a_faulty_run_is_told_and_acted_on_as_checked_in_full(fault: Fault, policy: str) -> None:
    lane, full = (_train(on, policy=policy, fault=fault) for on in (True, False))
    _same(lane, full)
    assert lane.lane_steps >= 50
    assert full.events


class _Gated(nn.Module):
    """A classifier with a branch its gate holds at 0 for the first 200 training forwards: the
    branch's gradients are computed, and exactly zero, until the gate opens."""

    def __init__(self) -> None:
        super().__init__()
        self.main = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4))
        self.branch = nn.Linear(16, 4)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.main(x) + float(self.calls > 200) * self.branch(x)


def test_a_branch_whose_gradients_are_zero_then_flow_is_told_as_checked_in_full() -> None:
    """The lane's usual step measures gradients that are there (zeros included): the branch
    that opens is told as a path that was blocked, as the full check tells it."""
    lane, full = (_train(on, model=_Gated) for on in (True, False))
    _same(lane, full)
    assert lane.lane_steps >= 150
    assert any(kind == "params_unfrozen" and "blocked" in message
               for kind, _, _, message in lane.events)


def test_norms_within_the_clips_epsilon_of_its_limit_are_clipped_as_in_full() -> None:
    """A linear regression that converges until its norms are millionths: the adaptive limit
    falls under the clip's 1e-6, which the full check clips at and the lane must leave to it."""
    lane, full = (_train(on, steps=500, regression=True, sgd=True,
                         model=lambda: nn.Linear(16, 1),
                         config={"probes": {"sample_every": 100000}}) for on in (True, False))
    _same(lane, full)
    assert lane.lane_steps >= 250
    assert any("'clipped'" in report for report in full.reports)


def test_a_state_loaded_in_the_middle_of_the_lane_trains_on_as_checked_in_full() -> None:
    """`Guard.load_state_dict` between two calm steps: the rows before are told to the state it
    replaces, and the loaded state (here one in the adaptive clip's alarm) is what the next
    steps are checked against."""
    saved: dict[str, Any] = {}

    def save_then_load(step: int, guard: trainguard.Guard) -> None:
        if step == 103:
            saved["state"] = copy.deepcopy(guard.state_dict())
        if step == 230:
            guard.load_state_dict(copy.deepcopy(saved["state"]))

    lane, full = (_train(on, fault=_spike100, between=save_then_load) for on in (True, False))
    _same(lane, full)
    assert lane.lane_steps >= 150


def _spike100(step: int, data: dict[str, torch.Tensor], _: torch.optim.Optimizer) -> None:
    if step == 100:
        data["x"] = data["x"] * 300.0


def test_a_layer_frozen_in_the_optimizer_keeps_the_lane_open_until_it_wakes() -> None:
    lane, full = (_train(on, fault=_unfrozen) for on in (True, False))
    _same(lane, full)
    assert lane.lane_steps >= 250
    assert [(kind, step) for kind, step, *_ in lane.events if kind == "params_unfrozen"] == [
        ("params_unfrozen", 200)]


def test_reading_the_events_between_steps_hands_the_calm_steps_over() -> None:
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    guard = trainguard.Guard(model, optimizer, config=trainguard.GuardConfig(
        sinks={"console": False}))
    for step in range(200):
        x = torch.randn(16, 8)
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
        if step >= 120 and guard.run.calm is not None and len(guard.run.calm.rows) >= 2:
            break
    assert guard.run.calm is not None and guard.run.calm.rows
    assert guard.events == []
    assert not guard.run.calm.rows
    state = guard.state_dict()
    assert state
    guard.close()
    assert guard.verdict is not None and guard.verdict.verdict == "healthy"


def _gpt2_run(lane: bool, steps: int = 160) -> tuple[Outcome, trainguard.Guard]:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64,
                                       n_positions=16))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    guard = trainguard.Guard(model, optimizer, config=trainguard.GuardConfig(
        sinks={"console": False}))
    if not lane:
        guard.run.calm = None
    out = Outcome()
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        ids = torch.randint(0, 16, (4, 16), generator=generator) * 4 % 64
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        rows = len(guard.run.calm.rows) if guard.run.calm is not None else 0
        report = guard.step(loss, batch={"input_ids": ids})
        if guard.run.calm is not None and len(guard.run.calm.rows) > rows:
            out.lane_steps += 1
        optimizer.zero_grad(set_to_none=True)
        assert report is not None
        out.reports.append(repr((report.step, report.loss, report.grad_norm, report.action)))
    guard.close()
    out.events = [(e.kind, e.step, e.severity, e.message) for e in guard.events]
    out.state = json.dumps(guard.run.state.detector_state(), sort_keys=True, default=str)
    out.weights = [p.detach().clone() for p in model.parameters()]
    out.verdict = repr(guard.verdict)
    return out, guard


def test_a_small_language_model_with_its_attention_and_log_z_probes() -> None:
    """The attention probe's steps take the full check; the others, the precursor probes'
    included, the lane."""
    (lane, _), (full, _) = _gpt2_run(True), _gpt2_run(False)
    _same(lane, full)
    assert lane.lane_steps >= 40
