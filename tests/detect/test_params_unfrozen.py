"""`params_unfrozen`: a layer unfrozen mid-run is reported on the step its gradients first reach
it; a forgotten backward that ends, or a branch used every other batch, is not."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from trainguard import Guard, GuardConfig
from trainguard.config import DetectorConfig
from trainguard.detect.params_unfrozen import ParamsUnfrozen
from trainguard.diagnose.ranking import rank_causes
from trainguard.events import Event
from trainguard.signals import StepSignals

NAMES = ["body.weight", "body.bias", "head.weight"]


def signals(step: int, norms: list[float], absent: bool = True) -> StepSignals:
    """A zero norm is a parameter without a gradient tensor (frozen) when `absent`, as measure
    reports it, else a gradient computed all zeros."""
    return StepSignals(step=step, loss=1.0, grad_norm=float(np.linalg.norm(norms)),
                       param_grad_norm=np.asarray(norms, dtype=np.float32),
                       param_names=NAMES,
                       grads_absent=tuple(i for i, v in enumerate(norms) if v == 0.0 and absent))


def run(norms_at, steps: int = 40, absent: bool = True, **config) -> list[Event]:
    detector = ParamsUnfrozen(DetectorConfig(**config))
    return [e for step in range(steps)
            for e in detector.check(signals(step, norms_at(step), absent))]


def test_the_body_unfrozen_at_step_20_is_reported_there_once() -> None:
    events = run(lambda s: [0.0, 0.0, 1.0] if s < 20 else [0.5, 0.1, 1.0])
    assert [(e.step, e.severity) for e in events] == [(20, "info")]
    assert events[0].details["params"] == ["body.weight", "body.bias"]
    assert events[0].details["silent_steps"] == 20 and events[0].details["blocked"] == []
    assert "body.weight, body.bias" in events[0].message and "unfrozen" in events[0].message


def test_gradients_computed_all_zero_are_a_blocked_path_not_an_unfreezing() -> None:
    """Gradients that were there, all zeros, for 20 steps (a collapsed model's dead path, a gate
    at 0): nothing was frozen, and the event says so."""
    events = run(lambda s: [0.0, 0.0, 1.0] if s < 20 else [0.5, 0.1, 1.0], absent=False)
    [event] = events
    assert event.step == 20 and event.details["blocked"] == ["body.weight", "body.bias"]
    assert "computed but exactly zero" in event.message and "unfrozen" not in event.message
    # frozen, then computed all zeros, then flowing: not blocked on every silent step
    detector = ParamsUnfrozen(DetectorConfig())
    mixed = [e for step in range(30) for e in detector.check(signals(
        step, [0.0, 0.0, 1.0] if step < 25 else [0.5, 0.1, 1.0], absent=step < 20))]
    assert [e.step for e in mixed] == [25] and mixed[0].details["blocked"] == []
    # a log's rows say nothing of which it was: the event does not say blocked
    detector = ParamsUnfrozen(DetectorConfig())
    for step in range(21):
        row = signals(step, [0.0, 0.0, 1.0] if step < 20 else [0.5, 0.1, 1.0])
        row.grads_absent = None
        logged = detector.check(row)
    assert logged[0].details["blocked"] == [] and "unfrozen" in logged[0].message


def test_what_is_not_an_unfreezing() -> None:
    # a forgotten backward from step 10 to 29: every gradient comes back at once
    assert run(lambda s: [0.0] * 3 if 10 <= s < 30 else [0.5, 0.1, 1.0]) == []
    # a branch used every other batch, and one silent for fewer than `frozen_steps` steps
    assert run(lambda s: [0.5 * (s % 2), 0.1, 1.0]) == []
    assert run(lambda s: [0.0 if 10 <= s < 19 else 0.5, 0.1, 1.0]) == []
    # NaN is a gradient: a frozen parameter's NaN is not silence, and raises nothing here
    assert run(lambda s: [float("nan"), 0.1, 1.0]) == []
    # the bound is the config's
    events = run(lambda s: [0.0 if 10 <= s < 15 else 0.5, 0.1, 1.0], params_unfrozen={"steps": 5})
    assert [e.step for e in events] == [15]


def test_parameters_added_start_the_count_over_and_the_state_round_trips() -> None:
    detector = ParamsUnfrozen(DetectorConfig())
    for step in range(12):
        detector.check(signals(step, [0.0, 0.1, 1.0]))
    again = ParamsUnfrozen(DetectorConfig())
    again.load_state_dict(detector.state_dict())
    assert [e.step for e in again.check(signals(12, [0.3, 0.1, 1.0]))] == [12]
    grown = StepSignals(step=13, loss=1.0, grad_norm=1.0,
                        param_grad_norm=np.ones(4, dtype=np.float32), param_names=[*NAMES, "x"])
    assert again.check(grown) == []


def test_a_real_run_names_the_unfrozen_body() -> None:
    """A newcomer's loop: the body is frozen, then unfrozen at step 60."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 4))
    model[0].requires_grad_(False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x_all = torch.randn(512, 16)
    y_all = (x_all[:, :4] * 3).argmax(1)
    guard = Guard(model, optimizer, config=GuardConfig(sinks={"console": False}))
    for step in range(80):
        if step == 60:
            model[0].requires_grad_(True)
        i = torch.randint(0, 512, (32,))
        loss = nn.functional.cross_entropy(model(x_all[i]), y_all[i])
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    [unfrozen] = [e for e in guard.events if e.kind == "params_unfrozen"]
    assert unfrozen.step == 60 and unfrozen.details["params"] == ["0.weight", "0.bias"]
    assert unfrozen.details["blocked"] == [] and "unfrozen" in unfrozen.message
    # it casts no vote: trouble after a routine unfreezing has causes of its own
    trouble = Event(kind="ddp_desync", step=65, severity="error", message="replicas differ")
    assert rank_causes([unfrozen, trouble])[0].code == "ddp_desync"


def test_a_real_run_tells_a_gate_opened_from_an_unfreezing() -> None:
    """A branch scaled by 0 for its first 30 steps (its gradients computed, all zeros), then by
    1: the event names the path that opened, not a layer unfrozen."""
    torch.manual_seed(0)
    head, branch = nn.Linear(16, 4), nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    optimizer = torch.optim.SGD([*head.parameters(), *branch.parameters()], lr=0.05)
    model = nn.ModuleDict({"head": head, "branch": branch})
    x_all = torch.randn(512, 16)
    y_all = (x_all[:, :4] * 3).argmax(1)
    guard = Guard(model, optimizer, config=GuardConfig(sinks={"console": False}))
    for step in range(50):
        i = torch.randint(0, 512, (32,))
        gate = 0.0 if step < 30 else 1.0
        loss = nn.functional.cross_entropy(head(x_all[i]) + gate * branch(x_all[i]), y_all[i])
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    [opened] = [e for e in guard.events if e.kind == "params_unfrozen"]
    assert opened.step == 30 and opened.severity == "info"
    assert opened.details["blocked"] == opened.details["params"] == [
        "branch.0.weight", "branch.0.bias", "branch.2.weight", "branch.2.bias"]
    assert "computed but exactly zero" in opened.message
