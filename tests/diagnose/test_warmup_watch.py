"""A guarded run reports "no warmup" from the LRs its first steps really use: a loop that warms
the LR up itself (writing the param groups before each step) gets no finding; a run whose LR
starts at its peak gets it once its first steps have shown so."""

from __future__ import annotations

import math

import pytest
import torch

import trainguard
from trainguard import Guard, GuardConfig
from trainguard.diagnose.preflight import RunSetup
from trainguard.diagnose.warmup_watch import WarmupWatch, watch_steps

from ..conftest import make_setup


def warmup_findings(guard: Guard) -> list:
    return [f for f in guard.findings if f.check == "warmup"]


def run_loop(guard: Guard, setup, steps: int, lr_at=None) -> None:
    """The user's loop; `lr_at(step)` is the LR it writes into every param group first."""
    for step in range(steps):
        if lr_at is not None:
            for group in setup.optimizer.param_groups:
                group["lr"] = lr_at(step)
        loss = setup.model.loss(setup.batch())
        loss.backward()
        guard.step(loss)
        setup.optimizer.zero_grad(set_to_none=True)


@pytest.mark.parametrize("lr_at", [
    lambda step: 5e-2 * min(1.0, step / 100),  # from 0
    lambda step: 5e-2 * min(1.0, (step + 1) / 100),
])
def test_a_loop_that_warms_the_lr_up_itself_gets_no_warmup_finding(tmp_path, lr_at) -> None:
    setup = make_setup(lr=5e-2, warmup=0)  # built at its peak, no scheduler
    guard = Guard(setup.model, setup.optimizer, run_dir=tmp_path,
                  config=GuardConfig(sinks={"console": False}))
    run_loop(guard, setup, 15, lr_at)
    guard.close()
    assert warmup_findings(guard) == []
    stored = trainguard.RunReader(tmp_path).meta().get("preflight", [])
    assert "warmup" not in [f["check"] for f in stored]


def test_a_constant_lr_gets_the_finding_once_its_first_steps_show_it(tmp_path, capsys) -> None:
    setup = make_setup(lr=5e-2, warmup=0)
    guard = Guard(setup.model, setup.optimizer, run_dir=tmp_path,
                  config=GuardConfig(sinks={"console": True}))
    assert warmup_findings(guard) == [], "not known before the run has stepped"
    run_loop(guard, setup, watch_steps(None) - 1)
    assert warmup_findings(guard) == []
    run_loop(guard, setup, 1)
    [finding] = warmup_findings(guard)
    assert finding.cause == "missing_warmup" and finding.severity == "warning"
    assert finding.evidence["observed_steps"] == watch_steps(None)
    assert f"the first {watch_steps(None)} steps" in finding.message
    guard.close()
    assert "WARNING warmup: No learning-rate warmup (the first 10" in capsys.readouterr().err
    stored = trainguard.RunReader(tmp_path).meta()["preflight"]
    assert [f["check"] for f in stored].count("warmup") == 1


def test_the_lr_the_loop_writes_is_judged_not_the_one_it_was_built_with() -> None:
    setup = make_setup(lr=1e-5, warmup=0)  # a note at this LR...
    guard = Guard(setup.model, setup.optimizer, config=GuardConfig(sinks={"console": False}))
    run_loop(guard, setup, watch_steps(None), lambda step: 5e-2)  # ...but the run uses 5e-2
    [finding] = warmup_findings(guard)
    assert finding.severity == "warning" and finding.evidence["lr_head"][0] == 5e-2
    guard.close()


def test_a_schedule_without_warmup_is_confirmed_and_one_with_it_is_not_watched() -> None:
    setup = make_setup(lr=5e-2, warmup=0)
    decay = torch.optim.lr_scheduler.CosineAnnealingLR(setup.optimizer, T_max=1000)
    guard = Guard(setup.model, setup.optimizer, decay, config=GuardConfig(sinks={"console": False}))
    for _ in range(watch_steps(1000)):
        run_loop(guard, setup, 1)
        decay.step()
    assert [f.cause for f in warmup_findings(guard)] == ["missing_warmup"]
    guard.close()
    warm = make_setup(lr=5e-2, warmup=20)
    guard = Guard(warm.model, warm.optimizer, warm.scheduler,
                  config=GuardConfig(sinks={"console": False}))
    assert guard.run.state.journal.warmup_watch is None, \
        "the probed schedule warms up: nothing to watch"
    guard.close()


def test_a_run_shorter_than_the_watch_is_judged_on_what_it_used() -> None:
    setup = make_setup(lr=5e-2, warmup=0)
    guard = Guard(setup.model, setup.optimizer, config=GuardConfig(sinks={"console": False}))
    run_loop(guard, setup, 3)
    guard.close()
    assert [f.evidence["observed_steps"] for f in warmup_findings(guard)] == [3]
    assert "missing_warmup" in [c.code for c in guard.diagnose()]
    unstepped = Guard(setup.model, setup.optimizer, config=GuardConfig(sinks={"console": False}))
    unstepped.close()
    assert warmup_findings(unstepped) == [], "no step: nothing is known"


def test_the_watch_decides_on_group_lrs() -> None:
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    watch = WarmupWatch(RunSetup(model, [optimizer]), steps=4)
    assert watch.observe((1e-3,)) is None
    assert watch.observe((math.nan,)) is None, "an unreadable LR is not a step seen"
    assert watch.observe((1e-3 * 0.999,)) is None  # decaying: still at its peak
    assert watch.observe((1e-3,)) is None
    [finding] = watch.observe((1e-3,))
    assert finding.cause == "missing_warmup" and finding.evidence["observed_steps"] == 4
    ramp = WarmupWatch(RunSetup(model, [optimizer]), steps=4)
    assert ramp.observe((1e-4,)) is None
    assert ramp.observe((2e-4,)) == [], "seen ramping: dropped at once"
    assert watch_steps(None) == 10 and watch_steps(100_000) == 10 and watch_steps(100) == 3
