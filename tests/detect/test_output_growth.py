"""`instability_precursor` on synthetic log Z and Adam update RMS series
(`detect/output_growth.py`): silent on steady and noisy runs, on a model that raises log Z while
it learns and on a one-step burst; a warning with the signal, its level against its median, its
trend and the lead to expect when log Z keeps climbing (again for each further rise within the
episode) or one parameter's update RMS rises; the same after a state round trip."""

from __future__ import annotations

import json
from itertools import pairwise

import numpy as np

from trainguard.config import DetectorConfig
from trainguard.detect.instability_precursor import InstabilityPrecursor
from trainguard.detect.output_growth import Streaks
from trainguard.events import Event

from .synth import signals

NAMES = ["emb.weight", "block.fc.weight", "head.weight"]


def logz(steps: int, seed: int, climb_from: int | None = None, climb: float = 0.3,
         learning: int = 0) -> list[np.ndarray]:
    """A log Z of ~8 with noise; `learning` steps of a rise from ln(64) first (a model from
    scratch); from `climb_from`, a climb of `climb` nats per step."""
    rng = np.random.default_rng(seed)
    rows = []
    for step in range(steps):
        value = 8.0 + rng.normal(0.0, 0.2)
        if step < learning:
            value = np.log(64) + (8.0 - np.log(64)) * step / learning + rng.normal(0.0, 0.2)
        if climb_from is not None and step >= climb_from:
            value += climb * (step - climb_from + 1)
        rows.append(np.array([value, value + 1.0]))
    return rows


def updates(steps: int, seed: int, climb_from: int | None = None,
            climb: float = 1.2) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    level = np.array([0.15, 0.2, 0.1])
    rows = []
    for step in range(steps):
        row = level * np.exp(rng.normal(0.0, 0.2, size=3))
        if climb_from is not None and step >= climb_from:
            row[1] = min(1.0, row[1] * climb ** (step - climb_from + 1))
        rows.append(row)
    return rows


def run(detector: InstabilityPrecursor, key: str, rows: list[np.ndarray]) -> list[Event]:
    events = []
    for i, row in enumerate(rows):
        values = {"logz_mean": row[:1], "logz_max": row[1:]} if key == "logz" else {key: row}
        events += detector.check(signals(i, names=NAMES, precursors=values))
    return events


def test_silent_on_a_steady_noisy_log_z_and_on_one_that_rose_while_the_model_learned() -> None:
    for seed in range(5):
        assert run(InstabilityPrecursor(DetectorConfig()), "logz", logz(400, seed)) == []
        assert run(InstabilityPrecursor(DetectorConfig()), "logz",
                   logz(400, seed, learning=60)) == []


def test_silent_when_only_the_largest_position_climbs() -> None:
    """One position's log Z jumps on a small batch; logits that grow move the mean too."""
    rows = [np.array([8.0 + 0.1 * np.sin(i), row[1]]) for i, row in
            enumerate(logz(150, 0, climb_from=100))]
    assert run(InstabilityPrecursor(DetectorConfig()), "logz", rows) == []


def test_silent_on_a_one_step_burst_of_log_z() -> None:
    rows = logz(200, 0)
    rows[120] = rows[120] + 10.0
    assert run(InstabilityPrecursor(DetectorConfig()), "logz", rows) == []


def test_a_climbing_log_z_warns_with_its_level_trend_and_lead() -> None:
    events = run(InstabilityPrecursor(DetectorConfig()), "logz", logz(150, 0, climb_from=100))
    event = events[0]
    assert "since_step" not in event.details
    assert event.kind == "instability_precursor" and event.severity == "warning"
    assert event.param == "logits" and event.details["signal"] == "logz_max"
    assert event.details["trend"] == "rising" and event.details["steps_above"] >= 2
    assert event.value is not None and event.value - event.details["baseline"] >= 3.0
    assert event.details["ratio"] >= np.exp(3.0)
    assert event.details["expected_lead"]
    assert 100 + 9 <= event.step <= 100 + 16  # 3 nats at 0.3 a step, then two steps above
    assert "z-loss" in event.message


def test_log_z_that_keeps_climbing_is_reported_again_each_further_rise() -> None:
    """Within one episode: again each `precursor_logz_rise` nats above the last report."""
    rise = DetectorConfig().instability_precursor.logz_rise
    events = run(InstabilityPrecursor(DetectorConfig()), "logz", logz(150, 0, climb_from=100))
    assert len(events) >= 3
    for before, after in pairwise(events):
        assert after.details["since_step"] == before.step
        assert after.details["since_value"] == before.value
        assert after.value is not None and before.value is not None
        assert after.value >= before.value + rise and after.details["trend"] == "rising"
        # 0.3 nats a step, with noise: the next report about ten steps later
        assert 8 <= after.step - before.step <= 14
        assert "still growing" in after.message


def test_log_z_that_stops_climbing_after_the_warning_is_reported_once() -> None:
    rows = logz(150, 0, climb_from=100)
    warned = run(InstabilityPrecursor(DetectorConfig()), "logz", rows)[0].step
    held = rows[:warned + 1] + [rows[warned].copy() for _ in range(150 - warned - 1)]
    events = run(InstabilityPrecursor(DetectorConfig()), "logz", held)
    assert [e.step for e in events] == [warned]


def test_silent_on_steady_update_rms() -> None:
    for seed in range(5):
        assert run(InstabilityPrecursor(DetectorConfig()), "adam_update_rms",
                   updates(400, seed)) == []


def test_a_rising_update_rms_names_its_parameter() -> None:
    events = run(InstabilityPrecursor(DetectorConfig()), "adam_update_rms",
                 updates(150, 0, climb_from=100))
    assert len(events) == 1
    event = events[0]
    assert event.param == "block.fc.weight" and event.details["signal"] == "adam_update_rms"
    assert event.details["ratio"] >= 2.0 and event.value is not None and event.value >= 0.5
    assert event.details["trend"] in ("rising", "flat")


def test_the_same_decisions_after_a_state_round_trip() -> None:
    rows = logz(150, 1, climb_from=100)
    whole = run(InstabilityPrecursor(DetectorConfig()), "logz", rows)
    first = InstabilityPrecursor(DetectorConfig())
    before = run(first, "logz", rows[:125])  # inside the episode, between two reports
    second = InstabilityPrecursor(DetectorConfig())
    second.load_state_dict(json.loads(json.dumps(first.state_dict())))
    after = []
    for i, row in enumerate(rows[125:], start=125):
        after += second.check(signals(i, names=NAMES, precursors={"logz_mean": row[:1],
                                                                  "logz_max": row[1:]}))
    assert before and after  # the split falls between two reports of one episode
    assert [(e.step, e.param) for e in before + after] == [(e.step, e.param) for e in whole]


def test_silent_while_the_loss_still_comes_down() -> None:
    """A model that learns sharpens its logits: log Z climbs while the loss falls."""
    detector = InstabilityPrecursor(DetectorConfig())
    events = []
    for i, row in enumerate(logz(150, 0, climb_from=100)):
        loss = 1.0 if i < 100 else 0.97 ** (i - 99)
        events += detector.check(signals(i, names=NAMES, loss=loss,
                                         precursors={"logz_mean": row[:1],
                                                     "logz_max": row[1:]}))
    assert events == []


def test_the_quiet_step_shortcut_moves_the_state_as_the_full_rule_does() -> None:
    """`Streaks.update` skips its medians when no value can be high (below the lowest value kept
    plus the margin); a reference whose shortcut never applies (its floor at -inf) takes
    the same decisions and keeps the same state on series with bursts, climbs and NaN."""
    rng = np.random.default_rng(3)
    rows = []
    for step in range(400):
        row = rng.normal(0.0, 0.3, size=3)
        if step % 37 == 0:
            row[step % 3] += 5.0  # a burst
        if 200 <= step < 260:
            row[1] += 0.15 * (step - 200)  # a climb
        if step % 53 == 0:
            row[2] = np.nan
        rows.append(row)
    class Full(Streaks):
        def _lowest(self) -> np.ndarray:
            return np.full(3, -np.inf)  # the shortcut never applies

    fast, full = Streaks(50, 20, 5, 4), Full(50, 20, 5, 4)
    quiet_steps = 0
    for row in rows:
        a = fast.update(row, 1.0, 2.5, 0.1, allowed=lambda: np.array([True, True, False]))
        b = full.update(row, 1.0, 2.5, 0.1, allowed=np.array([True, True, False]))
        assert (a is None) == (b is None)
        if a is None or b is None:
            continue
        quiet_steps += int(np.isnan(a[1]).all())
        assert np.array_equal(a[0], b[0])
        assert np.array_equal(fast.streak, full.streak)
        assert np.array_equal(fast.first, full.first, equal_nan=True)
        assert all(np.array_equal(x, y, equal_nan=True)
                   for x, y in zip(fast.history, full.history, strict=True))
    assert 100 < quiet_steps < 380  # the shortcut was taken, and the full rule ran too


def test_the_warning_carries_the_lr_it_came_at() -> None:
    """For the ranking: a warning at an LR far above the first steps' came from an LR that rose."""
    detector = InstabilityPrecursor(DetectorConfig())
    events = []
    for i, row in enumerate(logz(130, 0, climb_from=100)):
        events += detector.check(signals(i, names=NAMES, lr=1e-3 * 1.01 ** i,
                                         precursors={"logz_mean": row[:1], "logz_max": row[1:]}))
    assert events and events[0].details["lr"] == 1e-3 * 1.01 ** events[0].step


def test_a_rise_of_log_z_past_what_a_float_shows_is_told_as_a_power_of_e() -> None:
    from trainguard.detect.output_growth import _z_times

    assert _z_times(3.0) == "20.1x"
    assert _z_times(1776.4) == "e^1776x"  # exp() would overflow (a capped ratio says 1e304)


def test_quiet_rows_in_one_go_are_hold_and_update_row_by_row() -> None:
    """`Streaks.quiet_rows`: rows known to take the quiet path, each after the steps held before
    it, leave the state `hold` and `update` leave one at a time, however many rows wrap the
    ring (more than its size in one go included)."""
    rng = np.random.default_rng(0)
    for held_most, rows in ((3, 12), (7, 40), (60, 3)):
        one, batch = Streaks(50, 20, 5, 4), Streaks(50, 20, 5, 4)
        for _ in range(30):  # a grown baseline, level 5
            value = np.array([5.0 + rng.normal(0.0, 0.1)])
            one.update(value, 3.0, 6.0, 0.05)
            batch.update(value, 3.0, 6.0, 0.05)
        measured = [(int(rng.integers(0, held_most + 1)),
                     np.array([5.0 + rng.normal(0.0, 0.1)])) for _ in range(rows)]
        for held, value in measured:
            one.hold(held)
            assert one.update(value, 3.0, 6.0, 0.05) is not None
            assert not one.streak.any()  # each row takes the quiet path
        batch.quiet_rows(measured)
        assert json.dumps(batch.state_dict()) == json.dumps(one.state_dict()), held_most
        assert [r.tolist() for r in batch.recent] == [r.tolist() for r in one.recent]
        assert batch.near(3.0) == one.near(3.0)
