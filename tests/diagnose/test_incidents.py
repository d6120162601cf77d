"""A guarded run proves its incidents where the policy says (halt, the first rollback,
`prove="on"`), on demand with `guard.prove()`, never on healthy steps, and goes on exactly as it
would have."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

import trainguard
from trainguard import Guard, GuardConfig, TrainingDiverged
from trainguard.config import RecoveryConfig
from trainguard.errors import UsageError
from trainguard.snapshot import load_snapshot

from .test_counterfactual import Amplify


def mse(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return nn.functional.mse_loss(model(batch["x"]), batch["y"])


def batch_at(step: int, *, nan_at: int | None = None) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    x = torch.randn(16, 8, generator=g)
    y = x[:, :2] * 0.5 + 0.1 * torch.randn(16, 2, generator=g)
    if step == nan_at:
        x[4, 2] = float("nan")  # one corrupt sample
    return {"x": x, "y": y}


def model_and_optimizer(dropout: float = 0.2, lr: float = 1e-2):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(dropout), nn.Linear(32, 2))
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


def train(guard: Guard, model: nn.Module, optimizer: torch.optim.Optimizer, steps: int,
          lr_jump: tuple[int, float] | None = None, **faults) -> None:
    """`lr_jump=(step, factor)`: the loop multiplies its LR by `factor` at that step."""
    for step in range(steps):
        if lr_jump is not None and step == lr_jump[0]:
            for group in optimizer.param_groups:
                group["lr"] *= lr_jump[1]
        batch = batch_at(step, **faults)
        loss = mse(model, batch)
        loss.backward()
        guard.step(loss, batch=batch)
        optimizer.zero_grad(set_to_none=True)


def config(**kw) -> GuardConfig:
    return GuardConfig(sinks={"console": False}, probes={"preflight": False}, **kw)


def test_halt_proves_the_step_before_its_crash_snapshot(tmp_path: Path) -> None:
    model, opt = model_and_optimizer()
    guard = Guard(model, opt, config=config(policy="halt",
                                            checkpoints={"snapshot_dir": str(tmp_path)}),
                  replay_fn=mse)
    with pytest.raises(TrainingDiverged) as raised:
        train(guard, model, opt, 40, nan_at=30)
    proof = next(e for e in guard.events if e.kind == "proof")
    assert proof.step == 30 and proof.details["reproduced"]
    assert list(proof.details["confirmed"]) == ["nonfinite_input"]
    top = guard.diagnose()[0]
    assert top.code == "nonfinite_input" and top.proof == "confirmed"
    assert top.evidence[0].startswith("confirmed by replay: without the flagged sample 4 the "
                                      "step's loss is")
    snapshot = load_snapshot(raised.value.snapshot_path)
    assert any(e["kind"] == "proof" for e in snapshot["events"])  # proved before it was written


def test_a_step_given_without_its_batch_is_not_proved_and_the_user_is_told_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model, opt = model_and_optimizer()
    guard = Guard(model, opt, config=config(policy="halt",
                                            checkpoints={"snapshot_dir": str(tmp_path)}),
                  replay_fn=mse)
    with pytest.raises(TrainingDiverged), caplog.at_level("WARNING", logger="trainguard"):
        for step in range(40):
            batch = batch_at(step, nan_at=30)
            loss = mse(model, batch)
            loss.backward()
            guard.step(loss)  # batch= forgotten
            opt.zero_grad(set_to_none=True)
    assert not any(e.kind == "proof" for e in guard.events)
    told = [r.getMessage() for r in caplog.records if "no batch was given" in r.getMessage()]
    assert told == ["trainguard: step 30 is not proved by replay: no batch was given for it "
                    "(guard.step(loss, batch=batch)), and a replay needs the step's batch"]


class Flaky(nn.Module):
    """A layer whose output goes NaN once, when armed: a transient device fault."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.armed:
            self.armed = False
            return x * float("nan")
        return x


def test_a_transient_fault_is_reported_not_reproducible(tmp_path: Path) -> None:
    model, opt = model_and_optimizer(dropout=0.0)
    flaky = Flaky()
    model.insert(1, flaky)
    guard = Guard(model, opt, config=config(policy="halt",
                                            checkpoints={"snapshot_dir": str(tmp_path)}),
                  replay_fn=mse)
    with pytest.raises(TrainingDiverged):
        for step in range(40):
            flaky.armed = step == 25
            batch = batch_at(step)
            loss = mse(model, batch)
            loss.backward()
            guard.step(loss, batch=batch)
            opt.zero_grad(set_to_none=True)
    proof = next(e for e in guard.events if e.kind == "proof")
    assert proof.step == 25 and not proof.details["reproduced"]
    assert "not reproducible" in proof.message and proof.details["confirmed"] == {}


def final_state(prove: str) -> tuple[list[torch.Tensor], torch.Tensor, list[trainguard.Event]]:
    model, opt = model_and_optimizer(dropout=0.3)
    guard = Guard(model, opt, config=config(policy="protect", prove={"mode": prove}), replay_fn=mse)
    train(guard, model, opt, 60, nan_at=30)
    guard.close()
    return ([p.detach().clone() for p in model.parameters()], torch.get_rng_state(),
            guard.events)


def test_a_proved_run_goes_on_exactly_as_an_unproved_one() -> None:
    """Dropout, Adam's moments and the RNG after the proof are those of the run without it."""
    proved, rng_proved, events = final_state("on")
    plain, rng_plain, plain_events = final_state("off")
    assert [e.kind for e in events if e.kind == "proof"] == ["proof"]
    assert not any(e.kind == "proof" for e in plain_events)
    assert all(torch.equal(a, b) for a, b in zip(proved, plain, strict=True))
    assert torch.equal(rng_proved, rng_plain)


def test_healthy_steps_never_prove_and_guard_prove_finds_nothing_to_heal() -> None:
    model, opt = model_and_optimizer()
    guard = Guard(model, opt, config=config(policy="protect", prove={"mode": "on"}), replay_fn=mse)
    train(guard, model, opt, 40)
    assert guard.run.prover.attempts == 0 and not any(e.kind == "proof" for e in guard.events)
    proof = guard.prove(batch_at(40))
    assert not proof.reproduced and proof.confirmed == {}
    assert proof.summary().startswith("nothing to heal")
    assert guard.events[-1].kind == "proof"
    guard.close()


def test_a_resumed_run_proves_against_the_healthy_baseline_it_had() -> None:
    """The prover is run state: its healthy baseline and its counts travel in the checkpoint;
    the batch references and step times of the process that ran them do not."""
    model, opt = model_and_optimizer()
    guard = Guard(model, opt, config=config(policy="protect", prove={"mode": "on"}), replay_fn=mse)
    train(guard, model, opt, 30)
    guard.run.prover.attempts = 2  # as after two proofs
    state = guard.state_dict()
    model2, opt2 = model_and_optimizer()
    resumed = Guard(model2, opt2, config=config(policy="protect", prove={"mode": "on"}),
                    replay_fn=mse)
    resumed.load_state_dict(state)
    prover, before = resumed.run.prover, guard.run.prover
    assert prover.baseline() == before.baseline() and prover.baseline().loss is not None
    assert prover.attempts == 2 and prover.state_dict() == state["prover"]
    assert prover.previous_batch is None and not prover.step_times
    guard.close()
    resumed.close()


def test_guard_prove_needs_the_loss() -> None:
    model, opt = model_and_optimizer()
    guard = Guard(model, opt, config=config())
    train(guard, model, opt, 3)
    with pytest.raises(UsageError, match="replay_fn"):
        guard.prove()
    guard.close()


def test_recover_proves_its_first_rollback_from_the_good_state() -> None:
    """The loop raises the LR 300x mid-run: by the rollback the weights are damaged, so the
    replay from the state the rollback returns to confirms the LR."""
    model, opt = model_and_optimizer(dropout=0.0, lr=3e-3)
    # a budget no loaded machine runs out of: what is tested is what the replay confirms
    guard = Guard(model, opt, config=config(policy="recover", prove={"budget_steps": 10_000}),
                  replay_fn=mse)
    train(guard, model, opt, 80, lr_jump=(40, 300))
    rollbacks = [e for e in guard.events if e.kind == "rollback"]
    proofs = [e for e in guard.events if e.kind == "proof"]
    assert rollbacks and proofs and all(p.step == rollbacks[0].step for p in proofs)
    assert any("lr_too_high" in p.details["confirmed"] for p in proofs), [
        p.message for p in proofs]
    assert guard.diagnose()[0].code == "lr_too_high"
    guard.close()


def test_a_proved_float16_overflow_gives_the_event_that_halts_a_later_rollback() -> None:
    from trainguard.diagnose.counterfactual import Baseline, Outcome, Proof

    model, opt = model_and_optimizer()
    guard = Guard(model, opt, config=config(policy="recover"), replay_fn=mse)
    prover = guard.run.prover
    nan = float("nan")
    prover.proofs.append(Proof(10, Outcome("as_it_happened", "as it happened", nan, nan, nan),
                               Baseline(0.2, 1.0), True, "the step's loss is NaN",
                               confirmed={"fp16_overflow": "confirmed by replay: in bf16 the "
                                                           "step's loss is 0.21 instead of NaN"}))

    halt = prover.precision_fault(30)
    assert halt is not None and halt.severity == "critical" and halt.kind == "precision_fault"
    assert "switch to bf16" in halt.message and "step 10" in halt.message
    assert prover.precision_fault(10) is None  # the proof's own step
    prover.proofs[0].confirmed = {"outlier_batch": "confirmed"}
    assert prover.precision_fault(30) is None
    guard.close()


def test_a_float16_run_that_overflows_is_proved_then_halted_with_the_bf16_advice(
        tmp_path: Path) -> None:
    """A real float16 run under `recover`: its first rollback's replay confirms the overflow in
    bf16, and the rollback after it halts with the advice to switch (no rollback changes the
    precision)."""
    model = Amplify()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cpu")
    guard = Guard(model, opt, scaler=scaler,
                  config=config(policy="recover", checkpoints={"snapshot_dir": str(tmp_path)}),
                  replay_fn=mse)
    with pytest.raises(TrainingDiverged):
        for step in range(40):
            batch = batch_at(step)
            with torch.autocast("cpu", dtype=torch.float16):
                loss = mse(model, batch)
            scaler.scale(loss).backward()
            guard.step(loss, batch=batch)
            opt.zero_grad(set_to_none=True)
    proofs = [e for e in guard.events if e.kind == "proof"]
    halt = next(e for e in guard.events if e.kind == "precision_fault")
    proved = next(p for p in proofs if "fp16_overflow" in p.details["confirmed"])
    assert "in bf16" in proved.details["confirmed"]["fp16_overflow"]
    rollbacks = [e for e in guard.events if e.kind == "rollback"]
    assert rollbacks and rollbacks[0].step == proved.step < halt.step
    assert halt.severity == "critical" and "switch to bf16" in halt.message
    assert f"step {proved.step}" in halt.message
    assert guard.diagnose()[0].code == "fp16_overflow"


class Clock:
    """Time that passes only when the loss is computed, one unit a forward: a budget in steps
    then counts replayed forwards (a training step is one), whatever the machine's speed."""

    def __init__(self) -> None:
        self.now = 0.0
        self.forwards = 0

    def __call__(self) -> float:
        return self.now

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        self.now += 1.0
        self.forwards += 1
        return mse(model, batch)


def lr_spike_run(prove: str, budget: float = 1000.0,
                 clock: Clock | None = None) -> tuple[Guard, nn.Module]:
    """Adam at 1e-3 whose loop gives steps 40-42 an LR 300x higher, then the usual one: by the
    rollback (step 54) the steps at the spike are long past and the LR is back to normal. The
    rollback comes as late as after trouble that does not follow a raise of the LR at once
    (`jump_steps=0`), where only a window replay can prove the LR."""
    loss_fn = clock.loss if clock is not None else mse
    model, opt = model_and_optimizer(dropout=0.2, lr=1e-3)
    # a fixed ring cadence and an ample budget: what is proved must not depend on timings
    recovery = RecoveryConfig(ring_every=10, ring_budget=None, jump_steps=0)
    guard = Guard(model, opt, config=config(policy="recover", recovery=recovery,
                                            prove={"mode": prove, "budget_steps": budget}),
                                            replay_fn=loss_fn)
    spike_loop(guard, model, opt, loss_fn, 80)
    return guard, model


def spike_loop(guard: Guard, model: nn.Module, opt: torch.optim.Optimizer, loss_fn,
               steps: int) -> None:
    """The loop of `lr_spike_run`: steps 40-42 at LR 0.3, the others at 1e-3."""
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = 0.3 if 40 <= step < 43 else 1e-3
        batch = batch_at(step)
        loss = loss_fn(model, batch)
        loss.backward()
        guard.step(loss, batch=batch)
        opt.zero_grad(set_to_none=True)


def test_a_window_replay_confirms_an_lr_spike_one_step_cannot() -> None:
    guard, _ = lr_spike_run("auto")
    rollback = next(e for e in guard.events if e.kind == "rollback")
    proofs = [e for e in guard.events if e.kind == "proof"]
    assert [p.step for p in proofs] == [rollback.step] * 3
    # the bad step alone, from its own state and from the good state: healthy at its normal LR
    assert [p.details["reproduced"] for p in proofs[:2]] == [False, False]
    # ...and the first replayed the bad step as it ran (dropout included): older damage, not a
    # transient; the second starts from another state, where the step's own loss says nothing
    assert proofs[0].details["faithful"] is True and "replays as it ran" in proofs[0].message
    assert proofs[1].details["faithful"] is None and "not reproducible" in proofs[1].message
    window = proofs[2]
    assert window.details["reproduced"] and "lr_too_high" in window.details["confirmed"]
    assert "replayed from the good state of step" in window.message
    assert "the median loss of the last 5 steps is" in window.details["confirmed"]["lr_too_high"]
    # the run's own losses stood for the window as it happened
    assert "as the run recorded it" in window.details["confirmed"]["lr_too_high"]
    assert guard.diagnose()[0].code == "lr_too_high"
    # only the steps since the oldest good state are kept, as references
    ring = guard.run.state.recovery.ring
    assert min(w.step for w in guard.run.prover.window) >= ring.good[0].step
    guard.close()


def test_a_window_replay_puts_the_run_back_exactly() -> None:
    proved, proved_model = lr_spike_run("auto")
    plain, plain_model = lr_spike_run("off")
    assert any("replayed from the good state" in e.message for e in proved.events
               if e.kind == "proof")
    assert_same_run(proved, proved_model, plain, plain_model)


def assert_same_run(proved: Guard, proved_model: nn.Module, plain: Guard,
                    plain_model: nn.Module) -> None:
    """The proved run went on exactly as the one without proofs: the same weights and events."""
    assert not any(e.kind == "proof" for e in plain.events)
    assert all(torch.equal(a, b) for a, b in zip(proved_model.parameters(),
                                                  plain_model.parameters(), strict=True))
    assert [(e.step, e.kind) for e in proved.events if e.kind != "proof"] == [
        (e.step, e.kind) for e in plain.events]
    proved.close()
    plain.close()


def test_the_recorded_losses_stand_for_the_window_as_it_happened() -> None:
    """Only the LR x0.1 and good-data windows are replayed (x0.01 is spared once x0.1 healed),
    after one forward that checks the window's first step gives the loss the run recorded."""
    clock = Clock()
    guard, _ = lr_spike_run("auto", clock=clock)
    window = guard.run.prover.proofs[-1]
    assert window.plain.recorded and window.window > 0
    # LR x0.1 heals; the good data in place of the window's does not (the LR is at fault)
    assert [(i.name, h) for i, _, h in window.trials] == [("lr_x0.1", True),
                                                          ("good_data", False)]
    single = 2 + 2  # the bad step from its own state and from the good state: its update, after
    damage = 1  # the model at the bad step on the window's first batch
    assert clock.forwards - 80 == single + damage + 1 + 2 * (window.window + 2)
    guard.close()


def test_the_window_replay_fits_a_budget_of_one_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """A budget that holds the LR window (its steps, the bad step, one more forward) but not the
    plain window as well: the window replay runs and confirms the LR. Counted in forwards."""
    clock = Clock()
    monkeypatch.setattr(time, "perf_counter", clock)
    guard, _ = lr_spike_run("auto", budget=40.0, clock=clock)
    proofs = guard.run.prover.proofs
    window = proofs[-1]
    assert 2 * (window.window + 2) > 40 - 4 >= window.window + 2 + 1
    assert window.window and "lr_too_high" in window.confirmed
    guard.close()
    guard, _ = lr_spike_run("auto", budget=20.0, clock=clock)
    proofs = guard.run.prover.proofs
    assert len(proofs) == 2 and not any(p.window for p in proofs)  # a window it cannot hold
    guard.close()


def test_a_window_starts_first_from_the_newest_good_state_before_the_loss_left_its_level(
) -> None:
    """Good states at 30, 40, 50, a bad step at 54, losses above the typical level from step 44:
    the window from 40 is tried first (ruling nothing out), then the rollback's from 30; the
    state at 50 is too close to the bad step for the last steps' median."""
    from trainguard.diagnose.counterfactual import Baseline, WindowStep
    from trainguard.diagnose.incidents import IncidentProver

    prover = IncidentProver()
    prover.window.extend(WindowStep(s, None, (1e-3,), loss=0.3 if s < 44 else 2.0)
                         for s in range(30, 55))
    states = [SimpleNamespace(step=s) for s in (30, 40, 50)]
    ring = SimpleNamespace(good=states)
    starts = prover._starts(ring, states[0], 54, Baseline(0.3, 1.0))  # type: ignore[arg-type]
    assert [(s.step, rules_out) for s, rules_out in starts] == [(40, False), (30, True)]
    prover.window[5] = WindowStep(35, None, (1e-3,), loss=2.0)  # the loss left its level at 35
    starts = prover._starts(ring, states[0], 54, Baseline(0.3, 1.0))  # type: ignore[arg-type]
    assert [(s.step, rules_out) for s, rules_out in starts] == [(30, True)]
    assert prover._starts(ring, states[0], 54, Baseline()) == [(states[0],
                                                                True)]  # type: ignore[arg-type]


def scaled_outside_loop(guard: Guard, model: nn.Module, opt: torch.optim.Optimizer, loss_fn,
                        batches, at: int, *, loss_scale: float = 1.0,
                        grad_scale: float = 1.0) -> None:
    """A loop that, at step `at`, scales the loss it gives the Guard (and backpropagates) or the
    gradients, outside the loss function the replays call: until it halts."""
    with pytest.raises(TrainingDiverged):
        for step, batch in enumerate(batches):
            loss = loss_fn(model, batch)
            if step == at:
                loss = loss * loss_scale
            loss.backward()
            if step == at:
                for p in model.parameters():
                    p.grad.mul_(grad_scale)
            guard.step(loss, batch=batch)
            opt.zero_grad(set_to_none=True)


def test_a_loss_scaled_outside_the_replay_is_said_so_and_confirms_nothing(tmp_path: Path) -> None:
    """A GPT-2 LM whose loop multiplies the model's loss by 1e6 at step 30: the replay of the step
    gives the model's own loss, not the one the run recorded, so the trouble lies outside what the
    replay computes. It is said (with both losses, for the cause ranking), and no fix, from this
    state or from a good state before it, is confirmed from a replay that never had the fault."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from trainguard.demo import MarkovLanguage

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64,
                                       n_positions=32, bos_token_id=0, eos_token_id=0))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    language = MarkovLanguage(vocab_size=64, seed=0)
    batches = [{"input_ids": ids, "labels": ids} for ids in (language.batch(8, 17)
                                                              for _ in range(40))]

    def lm_loss(m: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return m(**batch).loss

    # an ample budget: what is proved must not depend on the machine's speed
    guard = Guard(model, opt, config=config(policy="halt",
                                            prove={"mode": "on", "budget_steps": 1000},
                                            checkpoints={"snapshot_dir": str(tmp_path)}),
                  replay_fn=lm_loss)
    scaled_outside_loop(guard, model, opt, lm_loss, batches, 30, loss_scale=1e6)
    proofs = [e for e in guard.events if e.kind == "proof"]
    assert [p.step for p in proofs] == [30]  # no replay from a good state: none can show it
    details = proofs[0].details
    assert details["replay_differs"] and not details["reproduced"]
    assert details["recorded_loss"] == pytest.approx(1e6 * details["replayed_loss"], rel=1e-3)
    assert "the trouble lies outside what the replay computes" in proofs[0].message
    assert all(p.details["confirmed"] == {} for p in proofs)
    assert not any(c.proof for c in guard.diagnose())
    guard.close()


def test_a_window_whose_bad_step_the_replay_does_not_compute_is_replayed_as_it_happened(
        tmp_path: Path) -> None:
    """The loop multiplies the gradients by 1e6 at step 40, after the loss: the run's record of
    that step (its gradient norm) is not what a replay computes, so the record does not stand
    for the window replayed from a good state. Replayed, the window is healthy: no fix is
    confirmed by healing what was never broken in the replay."""
    model, opt = model_and_optimizer()
    guard = Guard(model, opt, config=config(policy="halt",
                                            prove={"mode": "on", "budget_steps": 1000},
                                            checkpoints={"snapshot_dir": str(tmp_path)}),
                  replay_fn=mse)
    scaled_outside_loop(guard, model, opt, mse, [batch_at(s) for s in range(60)], 40,
                        grad_scale=1e6)
    proofs = guard.run.prover.proofs
    windows = [p for p in proofs if p.window]
    assert windows and not any(p.plain.recorded for p in windows)
    assert not any(p.reproduced for p in windows)
    assert all(p.confirmed == {} for p in proofs)
    guard.close()


def test_the_in_run_proof_names_the_fixes_of_the_update_it_could_not_try(tmp_path: Path) -> None:
    """The loop sets the LR x1000 at step 30; the next step halts, bad before its own update (the
    damage is step 30's update). Its proof could not try the LR fixes from that state and says
    so, with what would let it: prove="on", which keeps good states from before the damage."""
    model, opt = model_and_optimizer()
    guard = Guard(model, opt, config=config(policy="halt",
                                            checkpoints={"snapshot_dir": str(tmp_path)}),
                  replay_fn=mse)
    with pytest.raises(TrainingDiverged):
        train(guard, model, opt, 60, lr_jump=(30, 1000))
    proof = next(e for e in guard.events if e.kind == "proof")
    assert proof.details["cannot_try"][:2] == ["lr_x0.1", "lr_x0.01"]
    assert "could not try lr_x0.1, lr_x0.01" in proof.message
    assert "is bad before its update" in proof.message
    assert ('prove="on", which keeps good states from before the damage to replay from, would '
            "let them be tried") in proof.message
