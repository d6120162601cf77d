"""`ClipLimits` (`remedies/limit.py`): the one computation of the global clip limit in force."""

from __future__ import annotations

import pytest

from trainguard import GuardConfig
from trainguard.remedies.limit import ClipLimits, clip_limits
from trainguard.remedies.robust import RobustClipLimit


@pytest.mark.parametrize(("limits", "alarm", "in_force", "adaptive"), [
    (ClipLimits(fixed=None), False, None, False),
    (ClipLimits(fixed=None, fallback=1.0), False, 1.0, False),
    (ClipLimits(fixed=0.5, fallback=1.0), False, 0.5, False),
    (ClipLimits(fixed=None, adaptive=40.0, alarmed=2.0), False, 40.0, True),
    (ClipLimits(fixed=None, adaptive=40.0, alarmed=2.0), True, 2.0, True),
    (ClipLimits(fixed=0.5, adaptive=40.0, alarmed=2.0), True, 0.5, False),
    (ClipLimits(fixed=5.0, adaptive=40.0, alarmed=2.0), True, 2.0, True),
    (ClipLimits(fixed=None, alarmed=2.0), True, None, False),  # no adaptive clip, no alarm
])
def test_the_limit_in_force_is_the_lowest_else_the_configured_one(
        limits: ClipLimits, alarm: bool, in_force: float | None, adaptive: bool) -> None:
    assert limits.in_force(alarm) == in_force
    assert limits.adaptive_in_force(alarm) is adaptive


def test_the_adaptive_clip_gives_its_limit_and_its_alarm_limit() -> None:
    auto = RobustClipLimit(GuardConfig(detectors={"common": {"warmup_steps": 2}}))
    assert clip_limits(None, auto, None, 0) == ClipLimits(
        fixed=None, adaptive=auto.ceiling, alarmed=auto.ceiling)  # before the first norm
    for norm in (1.0, 1.0, 1.0):
        auto.observe(norm, float("inf"))
    limits = clip_limits(3.0, auto, None, 5)
    assert limits.alarmed == pytest.approx(1.0) and limits.adaptive == pytest.approx(20.0)
    assert limits.in_force() == 3.0 and limits.in_force(alarm=True) == pytest.approx(1.0)
    auto.alarm(5)  # in an alarm the adaptive limit is the alarm's
    assert clip_limits(3.0, auto, None, 5).adaptive == pytest.approx(1.0)
