"""`judge` (`pipeline/decide.py`): a step's decision from its signals, events, the limits and
what the run holds, with no model, optimizer or run."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trainguard import Guard
from trainguard.config import GuardConfig
from trainguard.events import Event, Severity
from trainguard.pipeline.decide import ClipLimits, PolicyState, judge, undone_update
from trainguard.recovery.controller import Verdict
from trainguard.remedies.clip_chain import ClipChain
from trainguard.signals import StepSignals

from ..conftest import make_setup


def signals(norm: float = 1.0, loss: float | None = 2.0, step: int = 7) -> StepSignals:
    return StepSignals(step=step, loss=loss, grad_norm=norm,
                       param_grad_norm=np.array([norm], dtype=np.float64), param_names=["w"])


def event(kind: str, severity: Severity = "error", step: int = 7) -> Event:
    return Event(kind=kind, step=step, severity=severity, message=kind)


class Judgement:
    """The recover policy's side, reduced to the verdict it gives."""

    def __init__(self, verdict: Verdict | None, ring: bool = True,
                 fails: bool = False) -> None:
        self.verdict, self.ring, self.fails = verdict, ring, fails
        self.seen: list[tuple[list[str], bool]] = []

    def review(self, events: list[Event], applies_update: bool) -> Verdict | None:
        self.seen.append(([e.kind for e in events], applies_update))
        if self.fails:
            raise RuntimeError("review broke")
        return self.verdict

    def can_roll_back(self) -> bool:
        return self.ring

    def rollbacks(self) -> int:
        return 3


PROTECT = GuardConfig(policy="protect", sinks={"console": False})
RECOVER = GuardConfig(policy="recover", sinks={"console": False})
AUTO = ClipLimits(fixed=None, adaptive=50.0, alarmed=2.0)


@pytest.mark.parametrize(("norm", "limits", "action", "limit", "coef"), [
    (1.0, AUTO, "applied", 50.0, 1.0),
    (100.0, AUTO, "clipped", 50.0, 0.5),
    (4.0, ClipLimits(fixed=1.0), "clipped", 1.0, 0.25),
    (4.0, ClipLimits(fixed=None, fallback=2.0), "clipped", 2.0, 0.5),  # the state holds none
    (4.0, ClipLimits(fixed=None), "applied", None, 1.0),  # no clipping at all
    (100.0, ClipLimits(fixed=0.5, adaptive=50.0, alarmed=2.0), "clipped", 0.5, 0.005),
])
def test_the_limit_in_force_is_the_lowest_one_the_run_holds(
        norm: float, limits: ClipLimits, action: str, limit: float | None, coef: float) -> None:
    decision = judge(signals(norm), [], limits, PolicyState(PROTECT))
    assert (decision.action, decision.clip_limit) == (action, limit)
    assert decision.clip_coef == pytest.approx(coef)
    assert decision.clip_alarm is None


def test_a_clip_alarm_kind_clips_the_step_at_the_typical_norm() -> None:
    decision = judge(signals(10.0), [event("grad_explosion")], AUTO, PolicyState(PROTECT))
    assert (decision.action, decision.clip_limit, decision.clip_alarm) == (
        "clipped", 2.0, "trouble")
    assert "adaptive" in decision.reason
    precursor = judge(signals(10.0), [event("instability_precursor", "warning")], AUTO,
                      PolicyState(PROTECT))
    assert (precursor.clip_limit, precursor.clip_alarm) == (2.0, "precursor")
    both = judge(signals(10.0), [event("instability_precursor", "warning"),
                                 event("loss_spike", "warning")], AUTO, PolicyState(PROTECT))
    assert both.clip_alarm == "trouble"


def test_no_alarm_without_an_adaptive_clip_and_none_from_rank_local_events() -> None:
    fixed = judge(signals(10.0), [event("grad_explosion")], ClipLimits(fixed=20.0),
                  PolicyState(PROTECT))
    assert (fixed.action, fixed.clip_alarm, fixed.clip_limit) == ("applied", None, 20.0)
    halt = GuardConfig(policy="halt", sinks={"console": False})
    local = judge(signals(), [event("batch_labels")], AUTO, PolicyState(halt))
    assert local.action == "applied"  # a batch finding differs between ranks: it decides nothing
    assert judge(signals(), [event("nonfinite_loss")], AUTO, PolicyState(halt)).action == "halted"


@pytest.mark.parametrize(("skips", "action", "raised"), [
    (0, "skipped", ()), (PROTECT.recovery.max_consecutive_skips - 1, "halted", ("skip_limit",))])
def test_a_nonfinite_step_is_skipped_until_the_skip_limit(skips: int, action: str,
                                                         raised: tuple[str, ...]) -> None:
    decision = judge(signals(math.nan, math.nan), [event("nonfinite_loss")], AUTO,
                     PolicyState(PROTECT, consecutive_skips=skips))
    assert decision.action == action
    assert tuple(e.kind for e in decision.events) == raised


def test_a_step_the_device_clipped_is_judged_at_the_device_limit() -> None:
    decision = judge(signals(100.0), [event("grad_explosion")],
                     ClipLimits(fixed=None, adaptive=50.0, alarmed=2.0, device=50.0),
                     PolicyState(PROTECT, on_device=True))
    assert (decision.action, decision.clip_limit, decision.clip_alarm) == (
        "clipped", 50.0, "trouble")
    assert decision.clip_coef == pytest.approx(0.5)


@pytest.mark.parametrize(("verdict", "ring", "on_device", "action", "raised"), [
    (None, True, False, "applied", ()),
    (Verdict("skip", "spike"), True, False, "skipped", ()),
    (Verdict("skip", "spike"), True, True, "applied", ()),  # the device applied it already
    (Verdict("rollback", "diverging"), True, False, "rolled_back", ()),
    (Verdict("rollback", "diverging"), False, False, "halted", ("rollback_limit",)),
    (Verdict("halt", "too many rollbacks"), True, False, "halted", ("rollback_limit",)),
])
def test_the_recover_policy_turns_the_base_decision(
        verdict: Verdict | None, ring: bool, on_device: bool, action: str,
        raised: tuple[str, ...]) -> None:
    recovery = Judgement(verdict, ring=ring)
    decision = judge(signals(), [event("loss_spike", "warning")], AUTO,
                     PolicyState(RECOVER, recovery=recovery, on_device=on_device,
                                 unhealable=None))
    assert decision.action == action
    assert tuple(e.kind for e in decision.events) == raised
    assert recovery.seen == [(["loss_spike"], True)]
    if action == "rolled_back":
        assert decision.verdict is verdict and decision.clip_coef == 1.0
    if raised:
        assert decision.events[0].value == 3.0 and "recovery gives up" in \
            decision.events[0].message
    if on_device:
        assert "applied before it was judged" in decision.reason


def test_a_failed_review_leaves_the_base_decision() -> None:
    decision = judge(signals(100.0), [], AUTO,
                     PolicyState(RECOVER, recovery=Judgement(None, fails=True)))
    assert (decision.action, decision.clip_limit) == ("clipped", 50.0)


def test_a_rollback_an_earlier_proof_says_cannot_heal_halts_instead() -> None:
    fault = event("precision_fault", "critical")
    rollback = Judgement(Verdict("rollback", "diverging"))
    decision = judge(signals(), [], AUTO,
                     PolicyState(RECOVER, recovery=rollback, unhealable=fault))
    assert (decision.action, decision.instead_of) == ("halted", "rolled_back")
    assert decision.events == (fault,) and decision.verdict is not None
    skip = judge(signals(), [], AUTO, PolicyState(
        RECOVER, recovery=Judgement(Verdict("skip", "spike")), unhealable=fault))
    assert (skip.action, skip.events, skip.instead_of) == ("skipped", (), None)


def test_an_update_a_late_rollback_undid_is_dropped() -> None:
    decision = undone_update(12, rolled_back=11)
    assert decision.action == "skipped" and not decision.applies_update
    assert "rollback at step 11" in decision.reason


def test_a_step_reads_the_clip_chain_once_and_decides_at_its_limits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`measure` reads the chain's limits and `decide` judges at the same ones (nothing moves the
    chain between them): one reading a step, and a step whose explosion alarms the adaptive clip
    is clipped at the typical norm those limits hold."""
    readings: list[tuple[int, ClipLimits]] = []
    read = ClipChain.limits

    def counted(chain: ClipChain, step: int) -> ClipLimits:
        limits = read(chain, step)
        readings.append((step, limits))
        return limits

    monkeypatch.setattr(ClipChain, "limits", counted)
    setup = make_setup()
    guard = Guard(setup.model, setup.optimizer, setup.scheduler,
                  config=GuardConfig(sinks={"console": False}))
    reports = []
    for step in range(30):
        loss = setup.model.loss(setup.batch())
        (loss * (1e4 if step == 25 else 1.0)).backward()  # an explosion at step 25
        readings_before = len(readings)
        reports.append(guard.step(loss))
        assert len(readings) == readings_before + 1, step
        setup.optimizer.zero_grad(set_to_none=True)
    guard.close()
    exploded = reports[25]
    assert [e.kind for e in guard.events if e.step == 25] == ["grad_explosion"]
    limits = dict(readings)[exploded.step]  # the chain's steps are the reports' own
    assert limits.alarmed is not None and exploded.action == "clipped"
    assert exploded.clip_coef == pytest.approx(limits.alarmed / exploded.grad_norm)
