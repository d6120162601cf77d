"""A detector left out of a step it is idle on (`Detector.idle_without`) misses nothing: on the
busy run of `test_reads.py`, each step preceded by a copy of it without the optional fields (a
step between sampled ones, a step a trainer handed no metrics), a detector handed only the steps
its roster keeps raises the same events and ends in the same state as one handed every step."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from tests.detect.synth import default_config, event_key, signals
from trainguard.detect import DETECTOR_TYPES, Detector
from trainguard.detect.on_duty import OPTIONAL, OnDuty, held_mask, is_idle
from trainguard.signals import SampledStats, StepSignals

from .test_reads import _run

BLANK = {"trainer_metrics": dict, "sampled": list}


def _with_bare_steps() -> list[StepSignals]:
    """The busy run, each step preceded by a copy of it without the optional fields."""
    steps = []
    for s in _run():
        steps += [dataclasses.replace(s, **{name: empty() for name, empty in BLANK.items()}), s]
    return steps


def _state(detector: Detector) -> str:
    return json.dumps(detector.state_dict(), sort_keys=True, default=str)


def test_every_optional_field_has_a_blank_and_a_bit() -> None:
    assert set(BLANK) == set(OPTIONAL)
    full = _run()[0]
    full.sampled = [SampledStats(step=0, per_param={})]
    assert held_mask(full) == (1 << len(OPTIONAL)) - 1
    for i, name in enumerate(OPTIONAL):
        s = _run()[0]
        s.sampled = [SampledStats(step=0, per_param={})]
        setattr(s, name, BLANK[name]())
        assert held_mask(s) == (1 << len(OPTIONAL)) - 1 - (1 << i)
        assert OPTIONAL[name](s) is False


IDLE = [t for t in DETECTOR_TYPES if t.idle_without]


def test_idle_declarations_name_optional_fields_only() -> None:
    assert all(t.idle_without <= set(OPTIONAL) for t in DETECTOR_TYPES)
    assert len(IDLE) >= 10  # the RL detectors and the sampled-probe ones


@pytest.mark.parametrize("detector_type", IDLE, ids=[t.__name__ for t in IDLE])
def test_an_idle_step_left_out_changes_nothing(detector_type: type[Detector]) -> None:
    config = default_config()
    every, kept = detector_type(config), detector_type(config)
    events_every, events_kept = [], []
    idle_steps = 0
    for s in _with_bare_steps():
        before = _state(every)
        raised = every.check(s)
        events_every += [event_key(e) for e in raised]
        if is_idle(kept, held_mask(s)):
            idle_steps += 1
            assert not raised and _state(every) == before  # a no-op, as declared
            continue
        events_kept += [event_key(e) for e in kept.check(s)]
    assert idle_steps > 20
    assert events_kept == events_every
    # the busy run gives the detector something to raise or to remember
    assert events_every or _state(every) != _state(detector_type(config))
    assert _state(kept) == _state(every)


def test_a_plain_step_keeps_the_loss_detectors_and_leaves_the_rl_ones_out() -> None:
    detectors = [t(default_config()) for t in DETECTOR_TYPES]
    duty = OnDuty(detectors)
    plain = duty.of(signals(1, loss=2.0))
    kinds = {d.kind for d in plain}
    assert {"loss_spike", "grad_explosion", "nonfinite_loss", "instability_precursor",
            "reward_hacking"} <= kinds
    assert not kinds & {"kl_blowup", "entropy_collapse", "nonfinite_metric", "dead_units",
                        "nonfinite_weight"}
    assert duty.of(signals(2, loss=2.0)) is plain  # one list per shape of step
    busy = signals(3, loss=2.0, sampled=[SampledStats(step=2, per_param={})])
    busy.trainer_metrics = {"kl": 0.1}
    assert duty.of(busy) == detectors
    assert [d.kind for d in plain] == [d.kind for d in detectors if d in plain]  # run's order
    assert np.all([d in detectors for d in plain])
