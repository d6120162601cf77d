"""The KL penalty a drift the penalty did not hold raises: PPO's adaptive rule, engaged only by
the evidence, within the beta the run was given and `MAX_FACTOR` times it."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from trainguard.errors import UsageError
from trainguard.events import Event
from trainguard.recovery.kl_penalty import (
    FACTOR,
    MAX_FACTOR,
    KLPenalty,
    check_holder,
    holds_beta,
)

RATIO = 10.0
LEVEL = 0.05
TARGET = LEVEL * RATIO ** 0.5


@dataclass
class Holder:
    beta: float


def _blowup(cause: str = "beta_too_low", level: float = LEVEL) -> Event:
    return Event(kind="kl_blowup", step=30, severity="warning", message="kl jumped",
                 value=10 * level, details={"cause": cause, "level": level})


def test_nothing_changes_without_a_drift_the_penalty_did_not_hold() -> None:
    holder = Holder(0.01)
    penalty = KLPenalty(holder, RATIO)
    assert penalty.follow([], 5.0) is None  # a high KL alone is the detector's to judge
    assert penalty.follow([_blowup(cause="lr_too_high")], 5.0) is None  # the LR's: rollback
    assert holder.beta == 0.01 and not penalty.engaged


def test_a_drift_raises_beta_until_the_kl_is_back_in_its_band_then_lowers_it() -> None:
    holder = Holder(1e-3)
    penalty = KLPenalty(holder, RATIO)
    message = penalty.follow([_blowup()], 10 * LEVEL)
    assert penalty.engaged and penalty.target == pytest.approx(TARGET)
    assert holder.beta == pytest.approx(1e-3 * FACTOR)
    assert message is not None and "raised" in message
    assert penalty.follow([], 2 * TARGET) is not None
    assert holder.beta == pytest.approx(1e-3 * FACTOR ** 2)
    assert penalty.follow([], None) is None  # a step without the KL logged changes nothing
    assert penalty.follow([], TARGET) is None  # inside the band: left as it is
    assert holder.beta == pytest.approx(1e-3 * FACTOR ** 2)
    assert penalty.follow([], TARGET / 2) is not None  # below it: back down ...
    assert holder.beta == pytest.approx(1e-3 * FACTOR)
    penalty.follow([], TARGET / 2)
    assert holder.beta == pytest.approx(1e-3)
    assert penalty.follow([], TARGET / 2) is None  # ... never below the beta it was given
    assert holder.beta == pytest.approx(1e-3)


def test_beta_never_goes_above_its_cap() -> None:
    holder = Holder(1e-4)
    penalty = KLPenalty(holder, RATIO)
    penalty.follow([_blowup()], 1.0)
    for _ in range(40):
        penalty.follow([], 1.0)
    assert holder.beta == pytest.approx(MAX_FACTOR * 1e-4)
    assert penalty.follow([], 1.0) is None


@pytest.mark.parametrize("beta", [0.0, float("nan"), None, True])
def test_no_penalty_to_raise(beta: object) -> None:
    """A trainer at beta 0 made no reference model: there is no KL term to strengthen."""
    holder = Holder(beta)  # type: ignore[arg-type]
    assert not holds_beta(holder)
    penalty = KLPenalty(holder, RATIO)
    assert penalty.follow([_blowup()], 1.0) is None and not penalty.engaged


def test_a_resumed_run_keeps_the_penalty_it_had_reached() -> None:
    holder = Holder(1e-3)
    penalty = KLPenalty(holder, RATIO)
    penalty.follow([_blowup()], 1.0)
    penalty.follow([], 1.0)
    state = penalty.state_dict()
    fresh = Holder(1e-3)
    resumed = KLPenalty(fresh, RATIO)
    resumed.load_state_dict(state)
    assert fresh.beta == holder.beta and resumed.target == penalty.target
    assert resumed.given == pytest.approx(1e-3)
    # one never engaged leaves the beta as the job set it
    untouched = Holder(0.2)
    KLPenalty(untouched, RATIO).load_state_dict(KLPenalty(Holder(0.1), RATIO).state_dict())
    assert untouched.beta == 0.2


@pytest.mark.parametrize("holder", [0.04, Holder("0.04"), object()])  # type: ignore[arg-type]
def test_a_holder_with_no_beta_to_raise_is_a_clear_error(holder: object) -> None:
    with pytest.raises(UsageError, match="kl_penalty must be the object whose `beta`"):
        check_holder(holder)
    check_holder(None)
    check_holder(Holder(0.0))  # no KL term: nothing to raise, no error either
