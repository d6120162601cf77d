"""`kl_blowup` on synthetic KL series: relative to the run's own level, warm-up aware."""

from __future__ import annotations

import math

import pytest

from tests.detect.synth import default_config, signals
from trainguard.detect.kl_blowup import KLBlowup


def _events(series: list[float], key: str = "kl") -> list[tuple[int, str]]:
    detector = KLBlowup(default_config())
    return [(e.step, e.severity) for i, kl in enumerate(series)
            for e in detector.check(signals(i, trainer_metrics={key: kl}))]


@pytest.mark.parametrize(("series", "expected"), [
    # a per-token KL growing slowly from 0 while the policy learns: quiet
    ([0.0, 0.0125, 0.012, 0.016, 0.026, 0.03, 0.038, 0.044, 0.046, 0.06], []),
    # the same KL jumping 100x in one update: one warning, at the jump
    ([0.0, 0.002, 0.002, 0.003, 2.08, 2.3, 2.2], [(4, "warning")]),
    # the first update takes the policy 0.27 nats per token from its reference
    ([0.0, 0.27, 0.2, 0.35, 1.09], [(1, "warning")]),
    # a per-sequence KL whose level is 1-3 nats moves without alarm
    ([0.5, 1.2, 2.0, 2.6, 3.1, 2.8, 3.3], []),
    # the K3 estimator's exp() overflowing: an error at once, once per episode
    ([0.0, 0.001, math.inf, math.inf, 0.001], [(2, "error")]),
    ([0.0, math.nan], [(1, "error")]),
])
def test_kl_series(series: list[float], expected: list[tuple[int, str]]) -> None:
    assert _events(series) == expected


def test_ppo_key_and_steps_without_kl() -> None:
    detector = KLBlowup(default_config())
    found = []
    for i, kl in enumerate([0.001, 0.002, None, 0.002, 5.0]):
        metrics = {} if kl is None else {"objective/kl": kl}
        found += detector.check(signals(i, trainer_metrics=metrics))
    assert [(e.step, e.param) for e in found] == [(4, "objective/kl")]


def test_the_blown_up_value_is_not_the_level() -> None:
    """A KL that stays up is one episode: it does not raise the level it is judged against."""
    detector = KLBlowup(default_config())
    for i, kl in enumerate([0.0, 0.002, 0.003] + [3.0] * 20):
        detector.check(signals(i, trainer_metrics={"kl": kl}))
    assert max(detector.history) == 0.003


DRIFT = [0.0, 0.004, 0.006, 0.008, 0.01, 0.012, 0.014, 0.016, 0.02, 0.024, 0.03, 0.035, 0.5]
"""A KL that crept up for a dozen steps, then left its level."""


@pytest.mark.parametrize(("series", "lrs", "cause"), [
    # a dozen steps of drift at a constant LR: the penalty did not hold the policy
    (DRIFT, [1e-3] * len(DRIFT), "beta_too_low"),
    # the same drift under a decaying LR: still the penalty's
    (DRIFT, [1e-3 * 0.97 ** i for i in range(len(DRIFT))], "beta_too_low"),
    # the same series, the LR raised 5x two steps before the jump: the updates threw it
    (DRIFT, [1e-3] * (len(DRIFT) - 2) + [5e-3] * 2, "lr_too_high"),
    # the first updates take the policy away: the LR, whatever beta
    ([0.0, 0.27, 0.2, 0.35, 1.09], [1e-3] * 5, "lr_too_high"),
    ([0.0, 0.002, 0.002, 0.003, 2.08], [1e-3] * 5, "lr_too_high"),
    # no LR known (a log without it): judged on the timing alone
    (DRIFT, [None] * len(DRIFT), "beta_too_low"),
])
def test_the_blowup_tells_its_cause_by_its_timing_and_the_lr(
        series: list[float], lrs: list[float | None], cause: str) -> None:
    detector = KLBlowup(default_config())
    found = [e for i, (kl, lr) in enumerate(zip(series, lrs, strict=True))
             for e in detector.check(signals(i, trainer_metrics={"kl": kl}, lr=lr))]
    assert [e.details["cause"] for e in found] == [cause]


def test_the_drift_count_survives_a_resume() -> None:
    detector = KLBlowup(default_config())
    for i, kl in enumerate(DRIFT[:-1]):
        detector.check(signals(i, trainer_metrics={"kl": kl}, lr=1e-3))
    resumed = KLBlowup(default_config())
    resumed.load_state_dict(detector.state_dict())
    [event] = resumed.check(signals(len(DRIFT) - 1, trainer_metrics={"kl": DRIFT[-1]}, lr=1e-3))
    assert event.details["cause"] == "beta_too_low"
