"""`policy_off_reference` on the first step's implicit rewards and KL."""

from __future__ import annotations

import math

import pytest

from tests.detect.synth import default_config, signals
from trainguard.detect.policy_off_reference import PolicyOffReference


@pytest.mark.parametrize(("steps", "expected"), [
    # a policy made from its reference: 0 at the first step, moving after
    ([{"rewards/chosen": 0.0, "rewards/rejected": 0.0}, {"rewards/chosen": 0.38}], []),
    ([{"kl": 0.0}, {"kl": 0.3}], []),
    # dropout on in the policy: the first rewards already away from 0
    ([{"rewards/chosen": 0.046, "rewards/rejected": -0.0005}, {"rewards/chosen": 0.37}],
     [(0, ["rewards/chosen"])]),
    ([{"kl": 0.02}], [(0, ["kl"])]),
    # steps before the trainer logs such metrics are not the first
    ([{}, {"rewards/chosen": 0.0}, {"rewards/chosen": 0.5}], []),
    # judged once: a later value is learning
    ([{"kl": 0.0}, {"kl": 0.5}, {"kl": 0.6}], []),
    # a NaN is nonfinite_metric's
    ([{"kl": math.nan}], []),
])
def test_first_step_series(steps: list[dict[str, float]],
                           expected: list[tuple[int, list[str]]]) -> None:
    detector = PolicyOffReference(default_config())
    found = [(e.step, e.details["metrics"]) for i, metrics in enumerate(steps)
             for e in detector.check(signals(i, trainer_metrics=metrics))]
    assert found == expected
