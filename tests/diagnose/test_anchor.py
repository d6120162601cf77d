"""Without a recover ring, `prove="on"` keeps good states of its own, so an LR fault whose damage
is older than the step that raised the error is proved by a window replay from before it; under
the default `prove="auto"` a run keeps the state from before an LR jump, which its halt replays
from."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from trainguard import Guard, TrainingDiverged
from trainguard.config import RecoveryConfig
from trainguard.diagnose.anchor import ANCHOR_FLAG, JUMP_FLAG, LR_JUMP, ProofAnchor
from trainguard.events import Event
from trainguard.snapshot import load_snapshot
from trainguard.transfer import transfer_count

from .test_incidents import (
    assert_same_run,
    batch_at,
    config,
    model_and_optimizer,
    mse,
    spike_loop,
)

FIXED_CADENCE = RecoveryConfig(ring_every=10, ring_budget=None)


def lr_spike_run(policy: str, prove: str, steps: int = 80, **kw):
    """Adam at 1e-3 whose loop gives steps 40-42 an LR 300x higher: the loss leaves its level
    at step 44 and the divergence error comes at step 55, when the LR is long back to normal."""
    model, opt = model_and_optimizer(dropout=0.2, lr=1e-3)
    guard = Guard(model, opt, config=config(policy=policy, recovery=FIXED_CADENCE,
                                            prove={"mode": prove, "budget_steps": 1000.0}, **kw),
                  replay_fn=mse)
    try:
        spike_loop(guard, model, opt, mse, steps)
    except TrainingDiverged:
        pass
    return guard, model


@pytest.mark.parametrize("policy", ["protect", "observe"])
def test_an_lr_spike_is_proved_from_the_anchor_under(policy: str) -> None:
    guard, _ = lr_spike_run(policy, "on")
    proofs = [e for e in guard.events if e.kind == "proof"]
    # the first bad step (a loss spike, an outlier batch at once, a warning at the next step
    # where the loss has not come back), and the divergence judged 11 steps later (an error: a
    # jump's proof does not stand for it)
    jump, again = (e for e in guard.events if e.kind == "loss_spike")
    error = next(e for e in guard.events if e.severity == "error")
    assert (jump.severity, again.severity, again.step) == ("info", "warning", jump.step + 1)
    assert {p.step for p in proofs} == {jump.step, error.step}
    at_jump = [p for p in proofs if p.step == jump.step]
    # the step alone is bad before its update: the previous good batch does not heal it
    assert at_jump[0].details["reproduced"] and not at_jump[0].details["confirmed"]
    assert "outlier_batch" in at_jump[0].details["ruled_out"]
    window = at_jump[-1]
    assert "lr_too_high" in window.details["confirmed"]
    # from a good state taken before the spike (step 40), none from inside the trouble
    assert f"steps 30-{jump.step}" in window.message and "good state of step 30" in window.message
    assert guard.diagnose()[0].code == "lr_too_high"
    guard.close()


def test_halt_proves_from_the_anchor_before_its_snapshot(tmp_path: Path) -> None:
    guard, _ = lr_spike_run("halt", "on", checkpoints={"snapshot_dir": str(tmp_path)})
    assert guard.run.closed
    proofs = [e for e in guard.events if e.kind == "proof"]
    assert proofs and "lr_too_high" in proofs[-1].details["confirmed"]
    assert "replayed from the good state" in proofs[-1].message
    (snapshot,) = tmp_path.glob("crash_step*.pt")
    assert any(e["kind"] == "proof" for e in load_snapshot(snapshot)["events"])


def test_the_anchor_changes_nothing_in_the_run() -> None:
    proved, proved_model = lr_spike_run("protect", "on")
    plain, plain_model = lr_spike_run("protect", "off")
    assert proved.run.state.anchor is not None and plain.run.state.anchor is None
    assert any("good state" in e.message for e in proved.events if e.kind == "proof")
    assert_same_run(proved, proved_model, plain, plain_model)


def test_replays_from_a_good_state_leave_the_optimizers_own_objects() -> None:
    """Loading a good state gives an optimizer new state and group objects: afterwards the run's
    own are back (a compiled step or a reference to a group must see the same ones)."""
    model, opt = model_and_optimizer(dropout=0.2, lr=1e-3)
    state, groups = opt.state, opt.param_groups
    guard = Guard(model, opt, config=config(policy="protect", recovery=FIXED_CADENCE,
                                            prove={"mode": "on", "budget_steps": 1000.0}),
                                            replay_fn=mse)
    spike_loop(guard, model, opt, mse, 60)
    assert any("good state" in e.message for e in guard.events if e.kind == "proof")
    assert opt.state is state and opt.param_groups is groups
    guard.close()


def test_good_states_come_only_from_calm_steps_before_the_trouble() -> None:
    guard, _ = lr_spike_run("protect", "on", steps=56)
    anchor = guard.run.state.anchor
    assert anchor is not None
    # candidates every 10 steps, each good after 5 calm steps; the loss spike at 44 dropped 40's;
    # 50's passed as good (nothing was raised from 46 to 54), but the state from before the
    # spike is pinned, and the divergence at 55 is replayed from it
    assert [s.step for s in anchor.ring.good][:2] == [20, 30]
    assert all(s.step < 40 or s.step > 45 for s in anchor.ring.good)
    assert any("good state of step 30" in e.message for e in guard.events
               if e.kind == "proof" and e.step == 55)
    # the prover keeps the window's batches only since the oldest of them
    assert min(w.step for w in guard.run.prover.window) >= 20
    guard.close()


def test_no_anchor_where_it_is_not_wanted() -> None:
    def anchor(**kw) -> ProofAnchor | None:
        model, opt = model_and_optimizer()
        guard = Guard(model, opt, config=config(**kw), replay_fn=kw.pop("replay_fn", mse))
        found = guard.run.state.anchor
        guard.close()
        return found

    assert anchor(prove={"mode": "on"}).good_states is not None
    # proving every incident was not asked for: a halt's proof needs only the state before an
    # LR jump, copied when one comes
    only_jumps = anchor(policy="halt", prove={"mode": "auto"})
    assert only_jumps is not None and only_jumps.good_states is None
    assert not only_jumps.ring.good and only_jumps.before_jump is None
    assert anchor(policy="observe", prove={"mode": "auto"}) is None  # observe never halts: no proof
    assert anchor(policy="halt", prove={"mode": "off"}) is None
    assert anchor(policy="recover", prove={"mode": "on"}) is None  # its ring serves
    model, opt = model_and_optimizer()
    guard = Guard(model, opt,
                  config=config(prove={"mode": "on"}))  # no loss to replay: nothing to prove
    assert guard.run.state.anchor is None
    guard.close()


def test_a_candidate_that_is_not_finite_never_becomes_good() -> None:
    model, opt = model_and_optimizer()
    anchor = ProofAnchor(model, opt, config(recovery=RecoveryConfig(confirm_steps=1),
                                            prove={"mode": "on"}))
    anchor.start(0)
    assert [s.step for s in anchor.ring.good] == [0]
    for step in range(1, 6):
        anchor.after_applied(step)
    assert anchor.ring.candidate is not None and anchor.extra()[ANCHOR_FLAG] is not None
    anchor.observe({ANCHOR_FLAG: np.array([float("nan")])}, [], applied=True, step=5)
    assert anchor.ring.candidate is None and [s.step for s in anchor.ring.good] == [0]
    for step in range(6, 11):
        anchor.after_applied(step)
    anchor.observe({ANCHOR_FLAG: np.array([1.0])}, [], applied=True, step=10)
    assert [s.step for s in anchor.ring.good] == [0, 10]


def test_a_jump_is_proved_only_when_every_incident_is_to_be_proved() -> None:
    guard, _ = lr_spike_run("protect", "auto")  # auto: a halt or the first rollback, no more
    assert any(e.kind == "loss_spike" for e in guard.events)
    assert not any(e.kind == "proof" for e in guard.events)
    guard.close()


def test_an_error_is_proved_after_an_outlier_batch_the_run_came_back_from() -> None:
    """A target 5 off in one sample at step 20 (a loss spike, an outlier batch the run comes
    back from) is proved first; the NaN sample at step 30 (an error) is proved too: a jump's
    proof does not stand for it."""
    model, opt = model_and_optimizer()
    guard = Guard(model, opt, config=config(policy="protect", prove={"mode": "on"}), replay_fn=mse)
    for step in range(40):
        batch = batch_at(step, nan_at=30)
        if step == 20:
            batch["y"][3] += 5.0
        loss = mse(model, batch)
        loss.backward()
        guard.step(loss, batch=batch)
        opt.zero_grad(set_to_none=True)
    spike = next(e for e in guard.events if e.kind == "loss_spike")
    assert spike.step == 20 and spike.severity == "info"
    proofs = {e.step: e for e in guard.events if e.kind == "proof"}
    assert set(proofs) == {20, 30}
    assert "outlier_batch" in proofs[20].details["confirmed"]
    assert list(proofs[30].details["confirmed"]) == ["nonfinite_input"]
    guard.close()


def test_an_error_pins_the_last_good_state_from_before_it() -> None:
    """States taken after an error can pass as good (the damage done, nothing raised yet); the
    state from before the error stays, so that a later alarm of the same trouble still replays
    from before it, for as long as a window from it fits the budget."""

    model, opt = model_and_optimizer()
    cadence = RecoveryConfig(confirm_steps=0, ring_every=5, ring_budget=None)
    anchor = ProofAnchor(model, opt, config(recovery=cadence,
                                            prove={"mode": "on", "budget_steps": 20.0}))
    anchor.start(0)

    def good_at(step: int) -> None:
        anchor.after_applied(step)
        anchor.observe({ANCHOR_FLAG: np.array([1.0])}, [], applied=True, step=step)

    def error_at(step: int) -> None:
        anchor.observe({}, [Event(kind="loss_spike", step=step, severity="error",
                                  message="")], applied=False, step=step)

    good_at(5)
    error_at(7)  # pins the state of step 5
    for step in (10, 15, 20):
        good_at(step)
    assert [s.step for s in anchor.ring.good] == [5, 15, 20]
    error_at(25)  # the same trouble: the pin stays
    good_at(27)
    assert [s.step for s in anchor.ring.good] == [5, 20, 27]
    good_at(30)  # 23 steps after the pinned alarm, out of a window's reach: it takes its turn
    assert [s.step for s in anchor.ring.good] == [20, 27] and anchor.ring.pinned is None
    error_at(40)  # a new incident: a new pin
    good_at(45)
    good_at(50)
    assert [s.step for s in anchor.ring.good] == [27, 45, 50]
    assert anchor.ring.pinned is not None and anchor.ring.pinned.step == 27
    good_at(55)
    assert [s.step for s in anchor.ring.good] == [27, 50, 55]
    good_at(65)
    assert [s.step for s in anchor.ring.good] == [55, 65] and anchor.ring.pinned is None


def jump_loop(guard: Guard, model: nn.Module, opt: torch.optim.Optimizer, steps: int, *,
              jumps: dict[int, float] | None = None, bad_batch_at: int | None = None,
              watch: Callable[[int], None] | None = None) -> None:
    """Train; at each step of `jumps` the loop multiplies the LR by its factor and leaves it
    there; the batch of `bad_batch_at` is 1000x its magnitude. `watch(step)` after each step."""
    jumps = jumps or {}
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] *= jumps.get(step, 1.0)
        batch = batch_at(step)
        if step == bad_batch_at:
            batch = {"x": batch["x"] * 1000, "y": batch["y"]}
        loss = mse(model, batch)
        loss.backward()
        guard.step(loss, batch=batch)
        opt.zero_grad(set_to_none=True)
        if watch is not None:
            watch(step)


def halted_run(tmp_path: Path, prove: str = "auto", **faults) -> Guard:
    """AdamW at 1e-2 under `halt` until it halts (an ample budget: what is proved must not
    depend on timings)."""
    model, opt = model_and_optimizer()
    guard = Guard(model, opt, replay_fn=mse, config=config(
        policy="halt", prove={"mode": prove, "budget_steps": 1000.0},
        checkpoints={"snapshot_dir": str(tmp_path)}))
    with pytest.raises(TrainingDiverged):
        jump_loop(guard, model, opt, 80, **faults)
    return guard


def test_the_default_halt_proves_an_lr_jump_from_the_state_before_it(tmp_path: Path) -> None:
    """The LR x1000 at step 60 breaks the model with step 60's update; step 61 halts. Its own
    replay starts from the broken state (a lower LR heals nothing there); from the state copied
    before step 60's update, LR x0.01 heals it."""
    guard = halted_run(tmp_path, jumps={60: 1000.0})
    proofs = [e for e in guard.events if e.kind == "proof"]
    assert [p.step for p in proofs] == [61, 61]
    assert not proofs[0].details["confirmed"]
    jump = proofs[1]
    assert "from the state before the LR jump of step 60" in jump.message
    assert "lr_too_high" in jump.details["confirmed"] and jump.details["reproduced"]
    top = guard.diagnose()[0]
    assert top.code == "lr_too_high" and top.proof == "confirmed"


def test_the_default_halt_still_proves_a_bad_batch_on_its_own_step(tmp_path: Path) -> None:
    guard = halted_run(tmp_path, bad_batch_at=60)
    (proof,) = [e for e in guard.events if e.kind == "proof"]
    assert proof.step == 60 and "outlier_batch" in proof.details["confirmed"]
    assert guard.diagnose()[0].code == "outlier_batch"
    anchor = guard.run.state.anchor
    assert anchor is not None and anchor.unread is None and anchor.before_jump is None


def test_with_good_states_the_ring_serves_an_lr_jump(tmp_path: Path) -> None:
    """Under `prove="on"` a good state of the ring from before the jump is replayed from; no
    copy is taken at the jump."""
    guard = halted_run(tmp_path, prove="on", jumps={60: 1000.0})
    anchor = guard.run.state.anchor
    assert anchor is not None and anchor.unread is None and anchor.before_jump is None
    proofs = [e for e in guard.events if e.kind == "proof"]
    assert "lr_too_high" in proofs[-1].details["confirmed"]
    assert "from the good state of step" in proofs[-1].message


def test_the_state_before_a_jump_is_kept_for_the_budgets_span_in_one_copy() -> None:
    """LR x10 at steps 30 and 41 (1e-3 to 0.1, which this model takes): the state from before
    each jump's update is replayable from the step after it (its finite flag rides that step's
    transfer: no transfer more than without it), the second in the first one's buffers, and
    given back more than 20 steps (`prove_budget_steps`) after the last jump."""
    kept: dict[int, int | None] = {}
    buffers: dict[int, set[int]] = {}

    def run(prove: str) -> list[int]:
        model, opt = model_and_optimizer(lr=1e-3)
        guard = Guard(model, opt, replay_fn=mse, config=config(policy="halt",
                                                               prove={"mode": prove}))
        anchor = guard.run.state.anchor
        assert guard.config.prove.budget_steps == 20
        transfers = [transfer_count()]

        def watch(step: int) -> None:
            transfers.append(transfer_count())
            if anchor is None:
                return
            # what the next step's proof could replay from
            state = anchor.jump_state(step + 1, [g["lr"] for g in opt.param_groups])
            kept[step] = None if state is None else state.step
            if state is not None:
                buffers[state.step] = {t.data_ptr() for t in state.model.values()}

        jump_loop(guard, model, opt, 80, jumps={30: 10.0, 41: 10.0}, watch=watch)
        assert [(e.step, round(e.details["ratio"])) for e in guard.events
                if e.kind == "lr_change"] == [(30, 10), (41, 10)]
        assert not any(e.kind == "proof" for e in guard.events)
        guard.close()
        return [b - a for a, b in itertools.pairwise(transfers)]

    assert run("auto") == run("off")
    assert {kept[s] for s in range(31)} == {None}  # the flag comes with step 31's transfer
    assert {kept[s] for s in range(31, 41)} == {30}
    assert kept[41] is None  # the first jump's state gave its buffers to the second's copy
    assert {kept[s] for s in range(42, 62)} == {41}
    assert {kept[s] for s in range(62, 80)} == {None}
    assert buffers[41] == buffers[30]  # one copy: the second jump's in the first one's buffers


def test_a_rise_below_a_jump_keeps_nothing_and_a_jump_changes_nothing_in_the_run() -> None:
    """An LR raised x5 (an `lr_change` still) copies nothing; one raised x10 copies the state
    and leaves the run as it was without a copy: the same weights and events."""
    def run(factor: float, prove: str) -> tuple[Guard, nn.Module]:
        model, opt = model_and_optimizer(lr=1e-3)
        guard = Guard(model, opt, replay_fn=mse, config=config(policy="protect",
                                                               prove={"mode": prove}))
        anchor = guard.run.state.anchor

        def nothing_kept(step: int) -> None:
            assert anchor is not None and anchor.unread is None
            assert anchor.before_jump is None

        jump_loop(guard, model, opt, 50, jumps={30: factor},
                  watch=nothing_kept if factor < LR_JUMP and prove == "auto" else None)
        return guard, model

    below, _ = run(5.0, "auto")
    assert [e.step for e in below.events if e.kind == "lr_change"] == [30]
    below.close()
    proved, proved_model = run(LR_JUMP, "auto")
    anchor = proved.run.state.anchor
    assert anchor is not None and anchor.before_jump is not None
    plain, plain_model = run(LR_JUMP, "off")
    assert plain.run.state.anchor is None
    assert_same_run(proved, proved_model, plain, plain_model)


def test_a_state_before_a_jump_that_is_not_finite_is_never_replayed_from() -> None:
    model, opt = model_and_optimizer()
    anchor = ProofAnchor(model, opt, config(policy="halt"))
    jump = Event(kind="lr_change", step=5, severity="info", message="", value=0.2,
                 details={"ratio": 20.0, "groups": [0]})
    anchor.before_update([jump], 5, (0.2,))
    assert anchor.unread is not None and JUMP_FLAG in anchor.extra()
    anchor.read({}, 5)  # its flag has not come yet
    assert anchor.jump_state(6, (0.2,)) is None and anchor.unread is not None
    anchor.read({JUMP_FLAG: np.array([float("nan")])}, 6)
    assert anchor.jump_state(6, (0.2,)) is None and anchor.unread is None
    anchor.before_update([jump], 7, (0.2,))
    anchor.read({JUMP_FLAG: np.array([1.0])}, 8)
    state = anchor.jump_state(8, (0.2,))
    assert state is not None and state.step == 7 and JUMP_FLAG not in anchor.extra()
    # the LR the jump raised taken back 10x: the step runs at the usual LR
    assert anchor.jump_state(8, (0.1,)) is not None and anchor.jump_state(8, (0.02,)) is None


def test_a_spike_the_loop_took_back_is_not_replayed_from_before_it(tmp_path: Path) -> None:
    """Steps 40-42 at LR 0.3, then 1e-3 again: the divergence that halts at step 55 runs at the
    usual LR, and the step replayed from before the spike at that LR shows nothing of it; the
    copy is kept (15 steps, within the budget's span) but not replayed from."""
    guard, _ = lr_spike_run("halt", "auto", checkpoints={"snapshot_dir": str(tmp_path)})
    anchor = guard.run.state.anchor
    assert guard.run.halted and anchor is not None
    assert anchor.before_jump is not None and anchor.before_jump.step == 40
    proofs = [e for e in guard.events if e.kind == "proof"]
    assert proofs and not any("LR jump" in p.message for p in proofs)
