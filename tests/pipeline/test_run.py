"""The `Run` and its step pipeline, shared by the Guard and the framework callbacks, run by hand
the way a trainer runs them (the trainer steps its optimizer and scheduler whatever was
decided)."""

from __future__ import annotations

import copy
import math
import re
from pathlib import Path

import pytest
import torch

from trainguard import GuardConfig, RecoveryConfig, TrainingDiverged, UsageError, load_snapshot
from trainguard.params import WatchedParams
from trainguard.pipeline import Run, StepContext
from trainguard.pipeline.rewind import ScheduleRewind
from trainguard.pipeline.run import _agreed_setup

from ..conftest import Setup, advance, lambda_setup, lrs, make_setup

QUIET = {"sinks": {"console": False}}


def trainer_step(run: Run, setup: Setup, loss: torch.Tensor) -> None:
    """What a trainer does around its optimizer step, with the pipeline's two calls."""
    loss.backward()
    run.before_update(loss)
    setup.optimizer.step()
    if setup.scheduler is not None:
        setup.scheduler.step()
    run.after_update()
    setup.optimizer.zero_grad(set_to_none=True)


def test_schedule_rewind_undoes_a_scheduler_step() -> None:
    optimizer, scheduler = lambda_setup()
    advance(optimizer, scheduler)
    before = (copy.deepcopy(scheduler.state_dict()), lrs(optimizer))
    mark = ScheduleRewind(optimizer, [scheduler]).remember()
    advance(optimizer, scheduler)
    assert lrs(optimizer) != before[1]
    mark.restore()
    assert lrs(optimizer) == before[1]
    assert scheduler.state_dict() == before[0]
    advance(optimizer, scheduler)  # the schedule goes on from where it was
    assert lrs(optimizer) == pytest.approx([0.1 / 3])


def test_schedule_rewind_restores_a_tensor_learning_rate_in_place() -> None:
    param = torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.Adam([param], lr=torch.tensor(0.01))
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    lr_tensor = optimizer.param_groups[0]["lr"]
    mark = ScheduleRewind(optimizer, [scheduler]).remember()
    advance(optimizer, scheduler)
    mark.restore()
    assert optimizer.param_groups[0]["lr"] is lr_tensor
    assert float(lr_tensor) == pytest.approx(0.01)


def test_skipped_step_leaves_weights_optimizer_and_schedule_untouched() -> None:
    setup = make_setup()
    run = Run(setup.model, setup.optimizer, config=GuardConfig(**QUIET),
              scheduler=setup.scheduler,
              rewind_schedulers=[setup.scheduler])
    for _ in range(3):
        trainer_step(run, setup, setup.model.loss(setup.batch()))
    weights = copy.deepcopy(setup.model.state_dict())
    state = copy.deepcopy(setup.optimizer.state_dict())
    lr = lrs(setup.optimizer)
    schedule = copy.deepcopy(setup.scheduler.state_dict())

    loss = setup.model.loss(setup.batch()) * float("nan")
    loss.backward()
    ctx = run.before_update(loss)
    assert isinstance(ctx, StepContext) and ctx.decision is not None
    assert ctx.decision.action == "skipped"
    assert all(p.grad is None for p in setup.model.parameters())
    setup.optimizer.step()  # the trainer steps anyway: nothing to apply
    setup.scheduler.step()
    report = run.after_update()

    assert report is not None and report.step == 3 and report.action == "skipped"
    for name, value in setup.model.state_dict().items():
        assert torch.equal(value, weights[name]), name
    assert setup.optimizer.state_dict()["state"].keys() == state["state"].keys()
    for key, entry in setup.optimizer.state_dict()["state"].items():
        for name, value in entry.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(state["state"][key][name]))
    assert lrs(setup.optimizer) == lr
    assert setup.scheduler.state_dict() == schedule
    assert run.after_update() is None, "one report per checked step"
    run.close()


def test_a_monitoring_failure_leaves_the_step_to_the_trainer_clipped() -> None:
    setup = make_setup(warmup=0)
    run = Run(setup.model, setup.optimizer,
              config=GuardConfig(clip={"max_grad_norm": 1e-3}, **QUIET))
    loss = setup.model.loss(setup.batch())
    loss.backward()
    setup.optimizer.param_groups[0]["lr"] = "not a number"  # measure() cannot read it
    assert run.before_update(loss).unguarded is not None
    total = torch.linalg.vector_norm(
        torch.stack([p.grad.norm() for p in setup.model.parameters()]))
    assert float(total) == pytest.approx(1e-3, rel=1e-3)
    assert [e.kind for e in run.events] == ["monitor_error"]
    assert run.after_update() is None
    assert run.state.step == 1
    run.close()


def test_halt_writes_a_snapshot_from_before_the_update(tmp_path: Path) -> None:
    setup = make_setup()
    run = Run(setup.model, setup.optimizer, run_dir=tmp_path,
              config=GuardConfig(policy="halt", **QUIET), scheduler=setup.scheduler,
              rewind_schedulers=[setup.scheduler])
    trainer_step(run, setup, setup.model.loss(setup.batch()))
    weights = copy.deepcopy(setup.model.state_dict())
    batch = setup.batch()
    loss = setup.model.loss(batch) * float("inf")
    loss.backward()
    with pytest.raises(TrainingDiverged) as caught:
        run.before_update(loss, batch=batch)
    assert caught.value.snapshot_path == str(tmp_path / "crash_step1.pt")
    snapshot = load_snapshot(tmp_path / "crash_step1.pt")
    assert snapshot["step"] == 1
    assert torch.equal(snapshot["batch"], batch)
    for name, value in snapshot["model"].items():
        assert torch.equal(value, weights[name]), name
    assert all(p.grad is None for p in setup.model.parameters())
    assert run.closed
    with pytest.raises(UsageError, match="closed"):
        run.before_update(loss)


def test_rollback_under_a_trainer_rewinds_its_scheduler_step_and_backs_the_lr_off() -> None:
    setup = make_setup(warmup=4)
    config = GuardConfig(policy="recover", recovery=RecoveryConfig(
        ring_every=5, confirm_steps=1, rollback_after_skips=2), **QUIET)
    run = Run(setup.model, setup.optimizer, config=config, scheduler=setup.scheduler,
              rewind_schedulers=[setup.scheduler])
    for _ in range(12):
        trainer_step(run, setup, setup.model.loss(setup.batch()))
    plain = [float(setup.scheduler.lr_lambdas[0](s)) * 3e-3 for s in range(20)]
    for _ in range(2):
        trainer_step(run, setup, setup.model.loss(setup.batch()) * math.nan)
    rollback = next(e for e in run.events if e.kind == "rollback")
    back_to = rollback.details["to_step"]
    assert back_to == 10
    # the trainer stepped the scheduler after the rollback; the run put it back where it
    # was (the schedule goes on from there), under the backoff
    assert setup.scheduler.last_epoch == 12
    # below the highest LR among the updates the rollback undid (steps 10 to 13)
    ceiling = rollback.details["lr_ceiling"]
    assert ceiling == pytest.approx(config.recovery.lr_ceiling * max(plain[back_to:13]))
    assert lrs(setup.optimizer)[0] == pytest.approx(0.1 * min(plain[12], ceiling))
    trainer_step(run, setup, setup.model.loss(setup.batch()))
    assert lrs(setup.optimizer)[0] == pytest.approx(
        (0.1 + 0.9 / config.recovery.lr_ramp_steps) * min(plain[13], ceiling))
    assert all(torch.isfinite(p).all() for p in setup.model.parameters())
    run.close()


@pytest.mark.parametrize("run_dir, message", [
    ("", "run_dir is empty"), ("  ", "run_dir is empty"),
    (123, "run_dir must be a path (str or pathlib.Path) or None, got int 123"),
])
def test_a_run_dir_that_is_no_directory_is_one_clear_error(run_dir: object, message: str) -> None:
    from trainguard import Guard

    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(UsageError, match=re.escape(message)):
        Guard(model, optimizer, run_dir=run_dir,  # type: ignore[arg-type]
              config=GuardConfig(sinks={"console": False}))


def test_ranks_agree_on_the_config_less_what_a_rank_may_set_for_itself() -> None:
    watched = WatchedParams(names=["w"], params=[torch.zeros(1)])
    mine = _agreed_setup(GuardConfig(sinks={"console": False, "store": False},
                                     checkpoints={"snapshot_dir": "rank0"}), watched)
    theirs = _agreed_setup(GuardConfig(checkpoints={"snapshot_dir": "rank1"}), watched)
    assert mine == theirs
    assert mine != _agreed_setup(GuardConfig(checkpoints={"block_poisoned": True}), watched)
    assert mine != _agreed_setup(GuardConfig(detectors={"loss_spike": {"ratio": 3.0}}), watched)


def test_what_detect_found_before_it_failed_reaches_the_run(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure inside `detect` leaves the step unchecked; the findings it had made by then (the
    LR journal's, the first loss's) are still the run's."""
    from trainguard.finding import Finding
    from trainguard.pipeline import detect as detect_stage

    setup = make_setup(warmup=0)
    run = Run(setup.model, setup.optimizer, config=GuardConfig(**QUIET))
    found = Finding(check="warmup", severity="warning", message="no warm-up", fix="warm up")
    monkeypatch.setattr(run.state.journal, "observe_lrs", lambda lrs: [found])

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a monitoring bug")

    monkeypatch.setattr(detect_stage, "run_detectors", broken)
    loss = setup.model.loss(setup.batch())
    loss.backward()
    assert run.before_update(loss).unguarded is not None
    assert found in run.findings
    run.after_update()
    run.close()


def test_a_run_whose_steps_are_all_skipped_to_the_end_stalled_not_recovered() -> None:
    """Every step from 40 on has a NaN gradient and is skipped (none applied; fewer than the
    skips in a row that halt): the loss stays where the weights were left, which says nothing
    of recovering."""
    from trainguard import Guard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    guard = Guard(model, optimizer,
                  config=GuardConfig(policy="protect", sinks={"console": False}))
    x, y = torch.randn(64, 4), torch.randn(64, 1)
    for step in range(60):
        if step == 40:
            model[0].weight.register_hook(lambda grad: grad * math.nan)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad()
    guard.close()
    verdict = guard.run.verdict
    assert verdict is not None
    assert verdict.verdict == "stalled", verdict
    assert "every step skipped (none applied) from step 40" in verdict.message
