"""Conformance over every clip rule: the contract each must keep, whatever it computes.

Every rule (each kind, and chains of them) gets the same checks: coefficients in [0, 1], one per
parameter; a non-finite norm never yields a coefficient below 1 (the Guard skips such a step, it
does not clip it) and never enters the rule's statistics; the state survives a JSON round trip
and a rebuilt rule resumes identically; a rule makes no device-to-host transfer.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from trainguard.remedies import build_rule
from trainguard.transfer import transfer_count

from .test_spec import NAMES, RULES, norm_sequence, run


@pytest.mark.parametrize("name", list(RULES))
def test_coefficients_are_one_per_parameter_in_the_unit_interval(name: str) -> None:
    before = transfer_count()
    for coefs in run(RULES[name](), norm_sequence(seed=1)):
        assert coefs.shape == (len(NAMES),)
        assert np.isfinite(coefs).all()
        assert ((coefs >= 0.0) & (coefs <= 1.0)).all()
    assert transfer_count() == before


@pytest.mark.parametrize("name", list(RULES))
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_an_all_nonfinite_step_is_left_alone(name: str, bad: float) -> None:
    rule = RULES[name]()
    run(rule, norm_sequence(steps=20))
    coefs = rule.coefficients(np.full(len(NAMES), bad), bad, NAMES)
    assert (coefs == 1.0).all()


@pytest.mark.parametrize("name", list(RULES))
def test_a_nonfinite_step_does_not_change_what_follows(name: str) -> None:
    """A rule fed a NaN step in the middle clips the rest of the run exactly as one that never
    saw it: no NaN leaks into running statistics."""
    sequence = norm_sequence(steps=40, seed=2)
    clean, poisoned = RULES[name](), RULES[name]()
    run(clean, sequence[:20])
    run(poisoned, sequence[:20])
    poisoned.coefficients(np.full(len(NAMES), math.nan), math.nan, NAMES)
    for a, b in zip(run(clean, sequence[20:]), run(poisoned, sequence[20:]), strict=True):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("name", list(RULES))
def test_state_round_trips_through_json_and_resumes_identically(name: str) -> None:
    sequence = norm_sequence(seed=3)
    rule = RULES[name]()
    run(rule, sequence[:30])
    state = json.loads(json.dumps(rule.state_dict()))
    resumed = build_rule(json.loads(json.dumps(rule.spec())))
    resumed.load_state_dict(state)
    for a, b in zip(run(rule, sequence[30:]), run(resumed, sequence[30:]), strict=True):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("name", list(RULES))
def test_every_rule_describes_itself(name: str) -> None:
    text = RULES[name]().describe()
    assert isinstance(text, str) and text.strip()
