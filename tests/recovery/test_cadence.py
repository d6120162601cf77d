"""The good-state ring's cadence follows the measured cost of a capture against a step."""

from __future__ import annotations

import math

from trainguard import Guard, GuardConfig, RecoveryConfig
from trainguard.recovery.cadence import RingCadence

from .helpers import make_workload, run


def test_a_cheap_capture_is_taken_every_5_steps_and_a_costly_one_rarely() -> None:
    cadence = RingCadence(max_every=50, budget=0.02)
    assert cadence.wished(100) == 5, "nothing measured yet: the shortest"
    cadence.observe_capture(0.001)
    cadence.observe_step(0.1)
    assert cadence.wished(100) == 5  # 1 ms per 5 x 100 ms: 0.2%
    costly = RingCadence(max_every=50, budget=0.02)
    costly.observe_capture(0.05)
    costly.observe_step(0.1)
    assert costly.wished(100) == 25  # 50 ms per 25 x 100 ms: 2%
    slowest = RingCadence(max_every=50, budget=0.02)
    slowest.observe_capture(1.0)
    slowest.observe_step(0.1)
    assert slowest.wished(100) == 50, "never beyond ring_every"
    assert slowest.wished(49) == 5, "early in the run: every 5 steps whatever it costs"
    assert RingCadence(max_every=8, budget=0.02).intervals() == [5, 8]


def test_the_longest_wish_of_any_rank_applies_to_all() -> None:
    cadence = RingCadence(max_every=50, budget=0.02)
    cadence.agree([5.0, 25.0])
    assert cadence.interval(100) == 25
    cadence.agree([math.nan, 10.0])
    assert cadence.interval(100) == 10


def test_a_nan_burst_at_step_30_loses_at_most_10_steps_by_default() -> None:
    w = make_workload()
    guard = Guard(w.model, w.optimizer, w.scheduler,
                  config=GuardConfig(policy="recover",
                                     recovery=RecoveryConfig(rollback_after_skips=3),
                                     sinks={"console": False}))
    run(guard, w, range(30))
    reports = run(guard, w, range(30, 40), loss_scale={30: math.nan, 31: math.nan,
                                                      32: math.nan})
    assert [r.action for r in reports[:3]] == ["skipped", "skipped", "rolled_back"]
    rollback = next(e for e in guard.events if e.kind == "rollback")
    assert rollback.details["steps_undone"] <= 10, rollback.details
    assert guard.config.recovery.ring_every == 50, "the fixed default would have undone 33"
    guard.close()
