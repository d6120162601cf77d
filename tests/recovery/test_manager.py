"""The recover policy driven by a real Guard in a real training loop."""

from __future__ import annotations

import math

import pytest
import torch

from trainguard import Guard, GuardConfig, RecoveryConfig, TrainingDiverged, UsageError

from .helpers import make_workload, recover_guard, run


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_rolling_back_and_replaying_the_same_data_gives_the_same_losses() -> None:
    w = make_workload()
    guard = recover_guard(w, clip=1.0, lr_backoff=1.0, lr_ceiling=1.0,  # exact restore
                          max_grad_norm=1.0, rewind_schedule=True, restore_rng=True)
    first = [r.loss for r in run(guard, w, range(30))]
    event = guard.rollback(to_step=20)
    assert event.details["to_step"] == 20 and event.details["steps_undone"] == 10
    again = [r.loss for r in run(guard, w, range(20, 30))]
    assert again == first[20:]  # bitwise: weights, Adam moments, schedule and dropout RNG
    guard.close()


def test_damaged_weights_are_rolled_back_with_lr_backed_off_and_clipping_tightened() -> None:
    w = make_workload()
    guard = recover_guard(w, settle_steps=5)
    before = run(guard, w, range(40))
    typical = sorted(r.loss for r in before[30:])[5]
    with torch.no_grad():  # a destructive update, as a huge bad batch would make
        for p in w.model.parameters():
            p.mul_(30.0)
    reports = run(guard, w, range(40, 60))
    actions = [r.action for r in reports]
    assert actions[0] == "skipped"  # the spike: its update is kept out
    back = next(i for i, r in enumerate(reports) if r.action == "rolled_back")
    assert all(a == "skipped" for a in actions[1:back])  # still spiking: kept out too
    event = next(e for e in reports[back].events if e.kind == "rollback")
    to_step = event.details["to_step"]
    assert to_step <= 40 and to_step % 10 == 0
    # the next step trains from the restored state: losses are back to their earlier level
    assert reports[1].loss > 100 * typical
    assert max(r.loss for r in reports[back + 1:back + 6]) < 3 * typical
    assert guard.run.state.clip.fixed_limit == 0.5
    pure = 1e-2 * min(1.0, (w.scheduler.last_epoch + 1) / 10)  # the plain schedule's LR
    assert 0.1 * pure <= w.optimizer.param_groups[0]["lr"] < pure
    guard.close()


def test_state_right_after_a_rollback_is_the_good_state() -> None:
    w = make_workload()
    guard = recover_guard(w, lr_backoff=1.0, rewind_schedule=True)
    states = {}
    for step in range(25):
        states[step] = _state(w.model)
        run(guard, w, range(step, step + 1))
    guard.rollback(to_step=20)
    for name, value in w.model.state_dict().items():
        assert torch.equal(value, states[20][name]), name
    assert w.scheduler.last_epoch == 20


def test_a_nan_streak_from_clean_batches_rolls_back_and_blames_the_data() -> None:
    w = make_workload()
    guard = recover_guard(w, rollback_after_skips=3)
    run(guard, w, range(20), data_ids=True)
    reports = run(guard, w, range(20, 26), data_ids=True,
                  loss_scale={20: math.nan, 21: math.nan, 22: math.nan})
    assert [r.action for r in reports[:3]] == ["skipped", "skipped", "rolled_back"]
    assert {20, 21, 22} <= guard.skipped_data
    assert all(torch.isfinite(p).all() for p in w.model.parameters())
    assert reports[-1].action in ("applied", "clipped")


def test_rollbacks_are_capped_then_the_run_halts_with_a_diagnosis(tmp_path) -> None:
    w = make_workload()
    guard = recover_guard(w, rollback_after_skips=2, max_rollbacks=2)
    guard.config.checkpoints.snapshot_dir = str(tmp_path)
    run(guard, w, range(20))
    always_nan = {s: math.nan for s in range(20, 40)}
    with pytest.raises(TrainingDiverged) as info:
        run(guard, w, range(20, 40), loss_scale=always_nan)
    kinds = [e.kind for e in guard.events]
    assert kinds.count("rollback") == 2 and kinds[-1] == "rollback_limit"
    assert info.value.diagnosis and info.value.snapshot_path is not None
    assert "recovery gives up" in str(info.value)


def test_guard_state_round_trip_keeps_baselines_skip_list_and_backoff() -> None:
    w = make_workload()
    guard = recover_guard(w, rollback_after_skips=2)
    run(guard, w, range(30), data_ids=True)
    run(guard, w, range(30, 33), loss_scale={30: math.nan, 31: math.nan}, data_ids=True)
    state = guard.state_dict()
    assert guard.recovery.controller.rollbacks == 1
    resumed = Guard(w.model, w.optimizer, w.scheduler,
                    config=GuardConfig(policy="recover", recovery=RecoveryConfig(ring_every=10),
                                       sinks={"console": False}))
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state
    assert resumed.skipped_data == guard.skipped_data == {30, 31}
    assert resumed.recovery.lr.factor() == guard.recovery.lr.factor() < 1
    assert resumed.run.state.clip.fixed_limit == 0.5
    assert resumed.global_step == guard.global_step


def test_healthy_run_never_rolls_back_and_matches_protect() -> None:
    results = {}
    for policy in ("protect", "recover"):
        w = make_workload()
        guard = Guard(w.model, w.optimizer, w.scheduler,
                      config=GuardConfig(policy=policy, sinks={"console": False}))
        results[policy] = [r.loss for r in run(guard, w, range(120))]
        assert guard.events == []
        guard.close()
    assert results["recover"] == results["protect"]


def test_rollback_needs_the_recover_policy() -> None:
    w = make_workload()
    guard = Guard(w.model, w.optimizer, w.scheduler, config=GuardConfig(sinks={"console": False}))
    with pytest.raises(UsageError, match="recover"):
        guard.rollback()


def test_by_default_the_schedule_goes_on_from_where_it_is() -> None:
    w = make_workload()
    guard = recover_guard(w, lr_backoff=1.0, lr_ceiling=1.0)
    run(guard, w, range(25))
    guard.rollback(to_step=20)
    assert w.scheduler.last_epoch == 25  # the weights are from step 20, the schedule is not
    assert w.optimizer.param_groups[0]["lr"] == pytest.approx(1e-2)


def test_nan_batches_are_skipped_without_a_rollback() -> None:
    """A streak of batches that hold NaN says nothing about the state: skip, do not roll back."""
    w = make_workload()
    guard = recover_guard(w, rollback_after_skips=2)
    run(guard, w, range(20))

    def nan_input(step: int) -> dict[str, torch.Tensor]:
        batch = w.batch(step)
        batch["x"][0, 0] = math.nan
        return batch

    for step in range(20, 25):
        batch = nan_input(step)
        loss = w.loss(batch)
        loss.backward()
        assert guard.step(loss, batch=batch).action == "skipped"
        w.optimizer.zero_grad(set_to_none=True)
    assert guard.recovery.controller.rollbacks == 0
    assert {20, 21, 22, 23, 24} <= guard.skipped_data


@pytest.mark.parametrize("keep_lr", [False, True])
def test_a_rollback_after_a_proved_bad_batch_keeps_the_lr(keep_lr: bool) -> None:
    from trainguard.recovery.controller import Verdict

    w = make_workload()
    guard = recover_guard(w)
    run(guard, w, range(40))
    lrs = [g["lr"] for g in w.optimizer.param_groups]
    assert guard.recovery is not None
    plan = guard.recovery.rollback(Verdict("rollback", "a bad batch", onset=30), 39,
                                   mid_step=False, keep_lr=keep_lr)
    after = [g["lr"] for g in w.optimizer.param_groups]
    if keep_lr:
        assert plan.lr_factor == 1.0 and after == lrs and plan.lr_ceiling is None
    else:
        assert plan.lr_factor < 1.0 and all(a < b for a, b in zip(after, lrs, strict=True))
    guard.close()
