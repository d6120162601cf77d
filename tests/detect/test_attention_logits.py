"""`instability_precursor` on synthetic attention logits (`detect/attention_logits.py`):
silent on logits that rise while attention sharpens and then hold, on high but steady logits,
on a one-step burst and while the baseline is young; a warning naming the layer, its level and
trend when one layer's logits keep growing, again each time they grow as much again; the same
decisions after a state round trip; and a vote for `attention_logit_growth`."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np

from trainguard.config import DetectorConfig
from trainguard.detect.instability_precursor import InstabilityPrecursor
from trainguard.diagnose.causes import CAUSES
from trainguard.diagnose.ranking import rank_causes
from trainguard.events import Event

from .synth import signals

LAYERS = ["blocks.0", "blocks.1"]


def logits(steps: int, seed: int, grow_from: int | None = None, growth: float = 1.04,
           level: tuple[float, float] = (8.0, 20.0)) -> list[dict[str, float]]:
    """Noisy logits around `level` per layer; from `grow_from` the second layer's grow by
    `growth` a step."""
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(steps):
        row = np.array(level) * np.exp(rng.normal(0.0, 0.03, size=2))
        if grow_from is not None and step >= grow_from:
            row[1] *= growth ** (step - grow_from + 1)
        rows.append(dict(zip(LAYERS, (float(v) for v in row), strict=True)))
    return rows


def run(detector: InstabilityPrecursor, rows: list[dict[str, float]]) -> list[Event]:
    events = []
    for step, row in enumerate(rows):
        events += detector.check(signals(step, attention_logits=row))
    return events


def test_silent_on_logits_that_rise_then_hold_and_on_high_steady_ones() -> None:
    sharpening = [{name: v * min(1.0, (i + 1) / 60) for name, v in row.items()}
                  for i, row in enumerate(logits(300, 0, level=(30.0, 90.0)))]
    assert run(InstabilityPrecursor(DetectorConfig()), sharpening) == []
    steady = logits(300, 1, level=(150.0, 400.0))  # large, as a pre-trained model's can be
    assert run(InstabilityPrecursor(DetectorConfig()), steady) == []


def test_silent_on_a_burst_and_while_young() -> None:
    rows = logits(200, 2)
    rows[100]["blocks.1"] = 500.0  # one step: not a growth
    assert run(InstabilityPrecursor(DetectorConfig()), rows) == []
    young = logits(15, 3, grow_from=0, growth=1.5)  # grows from the start: no baseline yet
    assert run(InstabilityPrecursor(DetectorConfig()), young) == []


def test_growing_logits_warn_naming_the_layer_then_again_as_they_grow() -> None:
    rows = logits(260, 4, grow_from=100, growth=1.04)
    events = run(InstabilityPrecursor(DetectorConfig()), rows)
    assert events and all(e.kind == "instability_precursor" for e in events)
    first = events[0]
    assert first.severity == "warning" and first.param == "blocks.1"
    details = first.details
    assert details["signal"] == "attn_logit_max" and details["layer"] == "blocks.1"
    assert first.value is not None and first.value >= 100.0
    assert details["ratio"] >= 2.0 and details["steps_above"] == 3
    assert details["trend"] == "rising" and details["expected_lead"]
    assert "blocks.1" in first.message and "attention logit" in first.message
    # 20 * 1.04^k passes 100 at k = 42; a warning 3 measurements later
    assert 100 + 40 <= first.step <= 100 + 50
    # each later warning comes once the logit doubled again
    values = [e.value or 0.0 for e in events]
    assert len(events) >= 3
    assert all(b >= 2.0 * a for a, b in itertools.pairwise(values))


def test_growing_logits_are_never_told_as_falling() -> None:
    """A growing layer whose measurements are noisy can start a streak on a high one: the
    trend is read against the logit before the streak, and the message names it."""
    rows = logits(300, 4, grow_from=100, growth=1.04)
    rng = np.random.default_rng(14)
    for row in rows[100:]:
        row["blocks.1"] *= float(np.exp(rng.normal(0.0, 0.08)))
    events = run(InstabilityPrecursor(DetectorConfig()), rows)
    assert events
    assert "falling" not in {e.details["trend"] for e in events}, [e.message for e in events]
    for event in events:
        assert f"{event.details['before']:.3g} before them" in event.message


def test_non_finite_and_missing_values_are_left_out() -> None:
    rows = logits(120, 5)
    for row in rows[60:70]:
        row["blocks.0"] = math.nan
    rows[80] = {}
    rows[81] = {"blocks.1": math.inf}
    assert run(InstabilityPrecursor(DetectorConfig()), rows) == []


def test_the_same_decisions_after_a_state_round_trip() -> None:
    rows = logits(260, 6, grow_from=100)
    whole = InstabilityPrecursor(DetectorConfig())
    expected = run(whole, rows)
    first = InstabilityPrecursor(DetectorConfig())
    run(first, rows[:150])
    again = InstabilityPrecursor(DetectorConfig())
    again.load_state_dict(json.loads(json.dumps(first.state_dict())))
    later = [e for step, row in enumerate(rows[150:], start=150)
             for e in again.check(signals(step, attention_logits=row))]
    assert [(e.step, e.param) for e in later] == [(e.step, e.param) for e in expected
                                                  if e.step >= 150]


def test_the_warning_votes_for_attention_logit_growth() -> None:
    assert "attention_logit_growth" in CAUSES
    events = run(InstabilityPrecursor(DetectorConfig()), logits(200, 7, grow_from=100))
    ranked = rank_causes(events)
    codes = [r.code for r in ranked]
    assert codes[0] == "attention_logit_growth" and "lr_too_high" in codes


def test_after_the_trouble_the_attention_warning_votes_little() -> None:
    warnings = run(InstabilityPrecursor(DetectorConfig()), logits(200, 7, grow_from=100))
    spike = Event(kind="loss_spike", step=warnings[0].step - 1, severity="warning",
                  message="the loss jumped")
    ranked = rank_causes([spike, *warnings])
    scores = {r.code: r.score for r in ranked}
    assert ranked[0].code != "attention_logit_growth"
    assert scores["attention_logit_growth"] == 1.0


def test_the_probe_is_due_every_step_while_young_or_near_and_at_its_cadence_else() -> None:
    """Logits far below the bound are measured every 4th step once the baseline is in; a layer
    growing towards the bound is measured every step from half of it, so the 3 measurements in
    a row that warn are 3 steps."""
    detector = InstabilityPrecursor(DetectorConfig())
    tracker, warmup = detector.attention, DetectorConfig().attention_logits.warmup
    assert tracker.due(1)  # nothing measured yet
    rows = logits(120, 4, grow_from=60, growth=1.08)
    due, step = [], 0
    for step, row in enumerate(rows):
        due.append(tracker.due(step))
        if due[-1]:
            detector.check(signals(step, attention_logits=row))
        if row["blocks.1"] > 60.0:
            break
    assert all(due[:warmup])
    calm = due[warmup:60]
    assert calm == [s % 4 == 0 for s in range(warmup, 60)]
    assert tracker.due(step + 1) and tracker.due(step + 2)  # near: every step
    # the state carries the cadence over a resume
    resumed = InstabilityPrecursor(DetectorConfig())
    resumed.load_state_dict(json.loads(json.dumps(detector.state_dict())))
    assert resumed.attention.due(step + 1)
