"""The heavy probes' cadence: every `sample_every` steps, further apart on steps so short that
sampling costs more than its budget; on a clock the test moves, then on real runs."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import trainguard
from trainguard.config import DetectorConfig, RecoveryConfig
from trainguard.events import Event
from trainguard.probes import sample_cadence
from trainguard.probes.sample_cadence import EARLY_STEPS, MULTIPLES, SampleCadence
from trainguard.recovery.controller import RecoveryController


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run(cadence: SampleCadence, clock: Clock, steps: int, step_s: float, extra_s: float,
        start: int = 0, pause_at: int | None = None) -> list[int]:
    """`steps` steps of `step_s` from `start`, a sampled one and the one after it `extra_s`
    longer together; returns the sampled steps (as the schedule decides them)."""
    sampled: list[int] = []
    cadence.observe(False)
    for step in range(start, start + steps):
        now = cadence.scheduled(step)
        if now:
            sampled.append(step)
            cadence.ran(step)
        clock.now += step_s + (extra_s if now else 0.0) + (60.0 if step == pause_at else 0.0)
        cadence.observe(now)
    return sampled


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(sample_cadence.time, "perf_counter", fake)
    return fake


def test_without_a_budget_every_sample_every_steps(clock: Clock) -> None:
    cadence = SampleCadence(10, None)
    sampled = run(cadence, clock, 400, step_s=0.001, extra_s=0.1)
    assert sampled == list(range(0, 400, 10))


def test_short_steps_stretch_the_interval_after_the_early_samples(clock: Clock) -> None:
    """2 ms steps whose samples cost 10 ms: every 50 steps is 10% of the time; 8x further apart
    is as far as it goes (still above 1%, as far apart as allowed)."""
    cadence = SampleCadence(50, 0.01)
    sampled = run(cadence, clock, 4000, step_s=0.002, extra_s=0.010)
    assert [s for s in sampled if s < EARLY_STEPS] == list(range(0, EARLY_STEPS, 50))
    assert cadence.multiple == MULTIPLES[-1]
    assert [s for s in sampled if s >= EARLY_STEPS] == list(range(800, 4000, 400))


@pytest.mark.parametrize(("extra_s", "multiple"), [(0.0009, 1), (0.0015, 2), (0.003, 4),
                                                    (0.006, 8)])
def test_the_interval_is_the_shortest_within_the_budget(clock: Clock, extra_s: float,
                                                        multiple: int) -> None:
    cadence = SampleCadence(50, 0.01)  # 1% of 50 steps of 2 ms: 1 ms per sample
    run(cadence, clock, 1000, step_s=0.002, extra_s=extra_s)
    assert cadence.multiple == multiple
    assert cadence.interval(1000) == 50 * multiple
    assert cadence.interval(EARLY_STEPS - 1) == 50  # the early steps keep it
    assert SampleCadence(100, 0.01).interval(999) == 100  # or the first 10 samples


def test_a_cadence_of_every_other_step_has_no_unsampled_step_to_weigh_it_against(
        clock: Clock) -> None:
    cadence = SampleCadence(2, 0.01)
    sampled = run(cadence, clock, 2000, step_s=0.002, extra_s=0.010)
    assert sampled == list(range(0, 2000, 2)) and cadence.step_s is None


def test_long_steps_keep_every_sample(clock: Clock) -> None:
    """A GPT-2 step of a second pays a sample's 10 ms easily."""
    cadence = SampleCadence(50, 0.01)
    sampled = run(cadence, clock, 2000, step_s=1.0, extra_s=0.010)
    assert sampled == list(range(0, 2000, 50))


def test_a_pause_between_steps_moves_neither_the_step_time_nor_the_interval(clock: Clock) -> None:
    """An evaluation of a minute between two steps (one of them a sample's) is not a step's time
    nor a sample's cost."""
    calm = SampleCadence(50, 0.01)
    run(calm, clock, 2000, step_s=0.002, extra_s=0.0009)
    paused = SampleCadence(50, 0.01)
    run(paused, clock, 2000, step_s=0.002, extra_s=0.0009, pause_at=1200)
    assert calm.multiple == paused.multiple == 1
    assert paused.step_s == pytest.approx(0.002, rel=0.2)


def test_the_recover_policy_dates_a_sampled_fault_from_the_interval_in_force(
        clock: Clock) -> None:
    """A fault the heavy probes find went bad since the probes ran last: at the interval in
    force, and whatever it is when the fault is judged (a deferred run judges it a step late)."""
    cadence = SampleCadence(50, 0.01)
    run(cadence, clock, 1200, step_s=0.002, extra_s=0.003)
    assert cadence.interval(1200) == 200 and list(cadence.samples)[-2:] == [800, 1000]
    cadence.ran(1200)
    controller = RecoveryController(RecoveryConfig(), DetectorConfig(), 50, cadence)
    fixed = RecoveryController(RecoveryConfig(), DetectorConfig(), 50)
    event = Event(kind="nonfinite_weight", severity="error", step=1200, message="")
    assert controller._onset(event, 1200) == 1000
    cadence.multiple = 1
    assert controller._onset(event, 1200) == 1000
    assert fixed._onset(event, 1200) == 1150


# -- real runs ---------------------------------------------------------------------------------
def _sampled_steps(config: trainguard.GuardConfig, steps: int) -> list[int]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    guard = trainguard.Guard(model, optimizer, config=config)
    x, y = torch.randn(32, 16), torch.randint(0, 4, (32,))
    sampled = []
    try:
        for _ in range(steps):
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            report = guard.step(loss)
            if report.sampled:
                sampled.append(report.step)
            optimizer.zero_grad(set_to_none=True)
    finally:
        guard.close()
    return sampled


def test_a_tiny_model_samples_less_often_after_its_early_steps_and_not_without_a_budget(
) -> None:
    """A tiny model's step takes well under a millisecond and a sample some: after its first
    500 steps the run samples 8 times less often; `sample_budget=None` keeps every sample, and
    so does a run sampled every other step (no unsampled step to weigh the samples against)."""
    quiet: dict = {"sinks": {"console": False}}
    steps = EARLY_STEPS + 200
    budgeted = _sampled_steps(trainguard.GuardConfig(probes={"sample_every": 5}, **quiet), steps)
    fixed = _sampled_steps(trainguard.GuardConfig(
        probes={"sample_every": 5, "sample_budget": None}, **quiet), steps)
    assert fixed == list(range(0, steps, 5))
    assert [s for s in budgeted if s < EARLY_STEPS] == list(range(0, EARLY_STEPS, 5))
    later = [s for s in budgeted if s >= EARLY_STEPS]
    assert later == list(range(520, steps, 40))
    dense = _sampled_steps(trainguard.GuardConfig(probes={"sample_every": 2}, **quiet), steps)
    assert dense == list(range(0, steps, 2))


def test_a_resumed_run_goes_on_at_the_interval_in_force() -> None:
    model = nn.Linear(4, 2)
    guard = trainguard.Guard(model, torch.optim.SGD(model.parameters(), lr=0.1),
                             config=trainguard.GuardConfig(sinks={"console": False}))
    guard.run.state.cadence.multiple = 4
    state = guard.state_dict()
    guard.close()
    for budget, multiple in ((0.01, 4), (None, 1)):
        fresh = trainguard.Guard(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                 config=trainguard.GuardConfig(sinks={"console": False},
                                                               probes={"sample_budget": budget}))
        fresh.load_state_dict(state)
        assert fresh.run.state.cadence.multiple == multiple
        fresh.close()


def test_the_budget_is_a_share() -> None:
    with pytest.raises(trainguard.ConfigError, match=r"probes\.sample_budget"):
        trainguard.GuardConfig(probes={"sample_budget": 0})
    assert trainguard.GuardConfig(probes={"sample_budget": None}).probes.sample_budget is None
