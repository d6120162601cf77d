"""A blown-up start has no bad step to replay: under `prove="on"` the first steps, replayed from
the state training started from, leave the loss at twice its first value again, and with the LR
x0.1 they do not."""

from __future__ import annotations

from benchmarks.scenarios import scenario
from benchmarks.scenarios.runner import run_scenario

from trainguard import GuardConfig


def test_a_blown_up_start_is_proved_from_the_initial_state() -> None:
    result = run_scenario(scenario("lstm_lr_too_high_x100"), "trainguard", seed=0,
                          config=GuardConfig(policy="protect", prove={"mode": "on"},
                                             sinks={"console": False}))
    start = next(e for e in result.events if e["kind"] == "bad_start")
    (proof,) = [e for e in result.events if e["kind"] == "proof"]
    details = proof["details"]
    assert proof["step"] == start["step"] and details["reproduced"]
    assert "steps 0-" in proof["message"] and "good state of step 0" in proof["message"]
    assert details["warned"] == "the median loss of the last steps"
    assert list(details["confirmed"]) == ["lr_too_high"]
    healed = next(t for t in details["trials"] if t["healed"])
    assert healed["name"] == "lr_x0.1" and healed["signal"] < start["details"]["bound"]
    assert result.diagnosis[0] == "lr_too_high"
