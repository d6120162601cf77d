"""`instability_precursor` on synthetic Adam ratios: silent on steady and noisy runs and on a
one-step burst, a warning naming the parameter and its trend when one parameter's ratio climbs,
and the same decisions after a state round trip."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from trainguard.config import DetectorConfig
from trainguard.detect.instability_precursor import InstabilityPrecursor, SkippedSteps
from trainguard.events import Event

from .synth import signals

NAMES = ["emb.weight", "h.0.ln.bias", "head.weight"]


def ratios(steps: int, seed: int, climb_from: int | None = None, climb: float = 1.25,
           index: int = 1) -> list[np.ndarray]:
    """Log-normal noise around a level of ~1 per parameter; from `climb_from`, parameter
    `index` grows by `climb` per step."""
    rng = np.random.default_rng(seed)
    level = np.array([0.9, 1.3, 1.1])
    rows = []
    for step in range(steps):
        row = level * np.exp(rng.normal(0.0, 0.25, size=3))
        if climb_from is not None and step >= climb_from:
            row[index] *= climb ** (step - climb_from + 1)
        rows.append(row)
    return rows


def run(detector: InstabilityPrecursor, rows: list[np.ndarray], start: int = 0) -> list[Event]:
    events = []
    for i, row in enumerate(rows):
        events += detector.check(signals(start + i, names=NAMES,
                                         precursors={"adam_ratio_rms": row}))
    return events


def test_silent_on_steady_noisy_ratios() -> None:
    for seed in range(5):
        assert run(InstabilityPrecursor(DetectorConfig()), ratios(400, seed)) == []


def test_a_climbing_parameter_is_named_with_its_trend_before_it_is_far_gone() -> None:
    detector = InstabilityPrecursor(DetectorConfig())
    events = run(detector, ratios(100, 0, climb_from=70))
    assert len(events) == 1
    event = events[0]
    assert event.kind == "instability_precursor" and event.severity == "warning"
    assert event.param == "h.0.ln.bias" and event.details["trend"] == "rising"
    assert event.details["ratio"] >= 2.0 and event.details["steps_above"] >= 2
    # 1.25 per step reaches 2x in about 3 steps, and two steps above it are needed
    assert 70 + 2 <= event.step <= 70 + 7
    assert "a loss spike often follows" in event.message


def test_a_climbing_parameter_is_never_told_as_falling() -> None:
    """Noise on a steady climb can make a streak's first step its highest: the trend is read
    against the ratio before the streak, and the message names that ratio."""
    events = [event for seed in range(3) for event in run(
        InstabilityPrecursor(DetectorConfig()), ratios(100, seed, climb_from=70, climb=1.12))]
    assert len(events) >= 3
    assert [e.details["trend"] for e in events] == ["rising"] * len(events), [
        e.message for e in events]
    for event in events:
        before = event.details["before"]
        assert before < event.value and f"up from {before:.3g} before them" in event.message
        assert "falling" not in event.message


def test_a_one_step_burst_is_no_precursor() -> None:
    rows = ratios(120, 1)
    rows[80] = rows[80] * np.array([1.0, 20.0, 1.0])
    assert run(InstabilityPrecursor(DetectorConfig()), rows) == []


def test_a_parameter_waking_up_is_no_precursor() -> None:
    """Two steps at 15x and 20x its level out of nowhere (a dead unit getting a gradient again,
    its v near 0): not the slow outgrowing of a lagging moment."""
    rows = ratios(120, 1)
    rows[80] = rows[80] * np.array([1.0, 15.0, 1.0])
    rows[81] = rows[81] * np.array([1.0, 20.0, 1.0])
    assert run(InstabilityPrecursor(DetectorConfig()), rows) == []
    # the same two steps found by a detector that takes any jump
    jumpy = InstabilityPrecursor(DetectorConfig(instability_precursor={"sudden_ratio": 1e9,
                                                                       "trend_window": 0}))
    assert [e.step for e in run(jumpy, rows)] == [81]


def test_silent_while_the_baseline_is_young() -> None:
    rows = ratios(40, 2, climb_from=5)
    config = DetectorConfig(instability_precursor={"warmup": 30})
    events = run(InstabilityPrecursor(config), rows)
    assert all(e.step >= 30 for e in events)


def test_steps_with_nothing_measured_do_not_age_the_baseline() -> None:
    """A GradScaler calibrating from a large init_scale skips its first steps: Adam has no state
    yet and every ratio reads 0. The baseline is young until `precursor_warmup` steps were
    measured, however many came before: a climb 20 measured steps in is not judged."""
    empty = [np.zeros(3)] * 30
    rows = ratios(45, 5, climb_from=20)
    assert run(InstabilityPrecursor(DetectorConfig()), empty + rows) == []
    # the same climb after a full baseline is found
    assert run(InstabilityPrecursor(DetectorConfig()), ratios(75, 5, climb_from=50))


def test_parameters_without_a_value_are_left_out() -> None:
    rows = ratios(100, 3, climb_from=70, index=2)
    for row in rows:
        row[0] = 0.0  # never a gradient
    events = run(InstabilityPrecursor(DetectorConfig()), rows)
    assert [e.param for e in events] == ["head.weight"]


def test_a_state_round_trip_decides_the_same() -> None:
    rows = ratios(110, 4, climb_from=75)
    whole = InstabilityPrecursor(DetectorConfig())
    expected = run(whole, rows)
    first = InstabilityPrecursor(DetectorConfig())
    run(first, rows[:72])
    resumed = InstabilityPrecursor(DetectorConfig())
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    got = run(resumed, rows[72:], start=72)
    assert [(e.step, e.param) for e in got] == [(e.step, e.param) for e in expected]
    assert expected


class _AlwaysJudged(InstabilityPrecursor):
    """The detector without its shortcut for quiet steps: every step goes through `_judge`."""

    def _quiet(self, values: np.ndarray, logs: np.ndarray) -> bool:
        return False


def test_the_quiet_step_shortcut_decides_and_remembers_as_the_full_judgement() -> None:
    for seed in range(5):
        # quiet, a climb that fires, quiet again (the episode re-arms), a one-step burst
        rows = (ratios(80, seed) + ratios(30, seed + 10, climb_from=0)[:30]
                + ratios(60, seed + 20))
        rows[150][2] = 40.0
        fast, full = InstabilityPrecursor(DetectorConfig()), _AlwaysJudged(DetectorConfig())
        fast_events, full_events = run(fast, rows), run(full, rows)
        assert fast_events, seed
        assert [e.to_dict() for e in fast_events] == [e.to_dict() for e in full_events]
        assert json.dumps(fast.state_dict()) == json.dumps(full.state_dict())


def test_a_burst_from_a_low_level_is_no_precursor_but_a_creeping_level_is() -> None:
    """Three steps at 3-4x out of a stretch that sat below its level (a healthy run's noise on a
    small tensor) do not warn; the same three steps after ten at 1.5x, a level creeping up, do."""
    burst = [row.copy() for row in ratios(120, 2)]
    for step in range(70, 80):
        burst[step][1] *= 0.6
    for step, factor in zip(range(80, 83), (3.0, 3.4, 4.0), strict=True):
        burst[step][1] = 1.3 * factor
    assert run(InstabilityPrecursor(DetectorConfig()), burst) == []
    # the same burst, judged without the trend condition
    untrended = InstabilityPrecursor(DetectorConfig(instability_precursor={"trend_window": 0}))
    assert [e.param for e in run(untrended, burst)] == ["h.0.ln.bias"]

    creeping = [row.copy() for row in burst]
    for step in range(70, 80):
        creeping[step][1] = 1.3 * 1.5
    events = run(InstabilityPrecursor(DetectorConfig()), creeping)
    assert [(e.param, e.step) for e in events] == [("h.0.ln.bias", 81)]


# -- rises that are not the weights going wrong --------------------------------------------------
def test_a_rise_its_smaller_batch_explains_is_no_precursor() -> None:
    """A batch of a quarter of the typical elements has a gradient noise four times the
    variance: up to 2x on the ratio, taken off before it is judged; the same rise on a batch of
    the typical size warns."""
    rows = ratios(120, 5)
    for step in range(80, 86):
        rows[step] = rows[step] * np.array([1.0, 3.0, 1.0])

    def sized(sizes: list[int]) -> list[Event]:
        detector = InstabilityPrecursor(DetectorConfig())
        return [e for i, row in enumerate(rows) for e in detector.check(signals(
            i, names=NAMES, precursors={"adam_ratio_rms": row}, batch_elements=sizes[i]))]

    typical = [512] * len(rows)
    assert [80 <= e.step < 86 for e in sized(typical)] == [True]
    short = [128 if 80 <= i < 86 else 512 for i in range(len(rows))]
    assert sized(short) == []


def test_a_batch_that_explains_next_to_nothing_is_not_named() -> None:
    """A warning on a batch a few elements short of the typical one says nothing of the batch
    (it read "once the 1x that its batch explains ... is taken off")."""
    rows = ratios(100, 0, climb_from=70)
    detector = InstabilityPrecursor(DetectorConfig())
    events = [e for i, row in enumerate(rows) for e in detector.check(signals(
        i, names=NAMES, precursors={"adam_ratio_rms": row},
        batch_elements=510 if i >= 70 else 512))]
    assert events and all(1.0 < e.details["batch_discount"] < 1.05 for e in events)
    assert all("its batch explains" not in e.message for e in events)


def test_a_rise_the_clip_takes_off_is_no_precursor() -> None:
    """The probe's g is the gradient before clipping, v was fed the clipped ones: on steps whose
    norm is 3x the clip limit the ratio is 3x what Adam sees, and is judged at the clipped
    gradient."""
    rows = ratios(120, 6)
    for step in range(80, 86):
        rows[step] = rows[step] * 3.0

    def clipped(limit: float | None) -> list[Event]:
        detector = InstabilityPrecursor(DetectorConfig())
        return [e for i, row in enumerate(rows) for e in detector.check(signals(
            i, names=NAMES, precursors={"adam_ratio_rms": row}, clip_limit=limit,
            grad_norm=3.0 if 80 <= i < 86 else 0.9))]

    assert [80 <= e.step < 86 for e in clipped(None)] == [True]
    assert clipped(1.0) == []


def test_a_rise_while_the_loss_still_comes_down_is_learning() -> None:
    """A model that starts to use a layer grows its gradients faster than Adam's average of
    them while its loss falls; the same rise on a loss that stays put warns."""
    rows = ratios(100, 0, climb_from=70)

    def with_losses(losses: np.ndarray) -> list[Event]:
        detector = InstabilityPrecursor(DetectorConfig())
        return [e for i, row in enumerate(rows) for e in detector.check(signals(
            i, names=NAMES, loss=float(losses[i]), precursors={"adam_ratio_rms": row}))]

    assert [e.step for e in with_losses(np.full(len(rows), 1.0))] != []
    falling = 2.0 * np.exp(-np.arange(len(rows)) / 30)
    assert with_losses(falling) == []


def test_a_length_curriculum_that_restarts_is_no_precursor() -> None:
    """A real GPT-2 language model whose sequences grow from 8 to 32 tokens and start short
    again at step 60 (a curriculum sampler's restart): the short batches' noisier gradients
    lift g^2 against Adam's v, which remembers the long ones. Before the batch's size was taken
    into account, this run warned at step 63."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    import trainguard
    from trainguard.demo.data import MarkovLanguage

    torch.manual_seed(2)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=64,
                                       n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0,
                                       attn_pdrop=0.0, bos_token_id=None, eos_token_id=None))
    language = MarkovLanguage(64, 3, seed=2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: min(1.0, (t + 1) / 20))
    guard = trainguard.Guard(model, optimizer, scheduler,
                             config=trainguard.GuardConfig(policy="observe",
                                                           sinks={"console": False}))
    reports = []
    for step in range(75):
        length = 8 + (step % 60) * 24 // 59
        ids = language.batch(8, length)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        reports.append(guard.step(loss, batch={"input_ids": ids}))
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    assert [e.message for e in guard.events if e.severity != "info"] == []
    # the restart, as the detector saw it: from the batch's shape
    assert [r.signals.batch_elements for r in reports[59:61]] == [8 * 32, 8 * 8]


def test_a_regression_head_clipped_at_one_is_no_precursor() -> None:
    """A real GPT-2 regression head on noisy targets, clipped at 1.0 as the Hugging Face
    Trainer does by default, AdamW 1e-3 decaying linearly: most steps' norms are above 1, so
    Adam's v holds the clipped gradients while the probe's g is the gradient before the clip.
    Before the ratio was judged at the clipped gradient, this run warned at step 96 on a
    LayerNorm bias of 64 elements (its ratio at 22.9, 4x its median, on a norm above 1)."""
    import torch
    from transformers import GPT2Config, GPT2ForSequenceClassification

    import trainguard
    from trainguard.demo.data import MarkovLanguage

    torch.manual_seed(1)
    model = GPT2ForSequenceClassification(GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=64, n_positions=32, num_labels=1,
        problem_type="regression", pad_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0))
    language = MarkovLanguage(64, 3, seed=1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: max(0.0, 1 - t / 150))
    guard = trainguard.Guard(model, optimizer, scheduler, config=trainguard.GuardConfig(
        policy="observe", sinks={"console": False}, clip={"max_grad_norm": 1.0}))
    noise = torch.Generator().manual_seed(2)
    clipped = 0
    for _ in range(100):
        ids = language.batch(16, 32)
        share = (ids < 16).float().mean(1) - (ids >= 48).float().mean(1)
        labels = share / 0.2 + torch.randn(16, generator=noise)
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        report = guard.step(loss, batch={"input_ids": ids, "labels": labels})
        clipped += report is not None and report.action == "clipped"
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    assert [e.message for e in guard.events if e.severity != "info"] == []
    assert clipped > 50  # the clip is what the optimizer saw on most steps


def run_on_cadence(detector: InstabilityPrecursor, rows: list[np.ndarray]) -> tuple[
        list[Event], list[int]]:
    """As a guarded run feeds it: the probes measure only the steps `due` says, the others carry
    no precursor values but their gradient norms (here as if Adam's second moment were 1, so a
    ratio that rises is a gradient that grows)."""
    events, measured = [], []
    for step, row in enumerate(rows):
        measure = detector.due(step)
        if measure:
            measured.append(step)
        events += detector.check(signals(
            step, names=NAMES, param_grad_norm=row,
            precursors={"adam_ratio_rms": row} if measure else {}))
    return events, measured


def test_far_from_the_bound_the_probes_measure_every_few_steps() -> None:
    detector = InstabilityPrecursor(DetectorConfig())
    steady = [np.array([0.9, 1.0, 1.1])] * 100
    events, measured = run_on_cadence(detector, steady)
    assert events == [] and measured[:3] == [0, 4, 8] and len(measured) == 25
    # the steps skipped are estimated from their gradient norms: the baseline is as old as the run
    assert len(detector.history) == min(100, DetectorConfig().common.baseline_window)


def test_near_the_bound_the_probes_measure_every_step() -> None:
    detector = InstabilityPrecursor(DetectorConfig())
    near = [np.array([0.9, 1.0, 1.3])] * 20  # 1.3: over half way to abs_min (2.5)
    _, measured = run_on_cadence(detector, near)
    assert measured == list(range(20))


def test_the_cadence_survives_a_state_round_trip() -> None:
    detector = InstabilityPrecursor(DetectorConfig())
    run_on_cadence(detector, [np.array([0.9, 1.0, 1.1])] * 9)
    restored = InstabilityPrecursor(DetectorConfig())
    restored.load_state_dict(json.loads(json.dumps(detector.state_dict())))
    assert [restored.due(s) for s in range(9, 14)] == [detector.due(s) for s in range(9, 14)]
    assert restored.measured == 8


def run_with_ratio_hold(detector: InstabilityPrecursor, rows: list[np.ndarray],
                        second_moment: list[float] | None = None) -> tuple[list[Event], list[int]]:
    """As `run_on_cadence`, with the ratio measured only at the due steps `ratio_due` says (log
    Z, a constant here, at every due step); `second_moment`: Adam's v at each step (1 when not
    given), which the ratio is divided by and the estimate from the gradient norm does not see."""
    events, measured = [], []
    for step, row in enumerate(rows):
        precursors: dict[str, np.ndarray] = {}
        if detector.due(step):
            precursors["logz_max"] = np.array([3.0])
            if detector.ratio_due(step):
                measured.append(step)
                v = 1.0 if second_moment is None else second_moment[step]
                precursors["adam_ratio_rms"] = row / v
        events += detector.check(signals(step, names=NAMES, param_grad_norm=row,
                                         precursors=precursors))
    return events, measured


def test_a_ratio_its_estimates_match_is_measured_less_often() -> None:
    detector = InstabilityPrecursor(DetectorConfig())
    events, measured = run_with_ratio_hold(detector, [np.array([0.9, 1.0, 1.1])] * 100)
    # every 4 steps, then 8 after the first match, 16, then 32 (`HOLD_MAX` x `every`)
    assert events == [] and measured == [0, 4, 12, 28, 60, 92]
    restored = InstabilityPrecursor(DetectorConfig())
    restored.load_state_dict(json.loads(json.dumps(detector.state_dict())))
    assert [restored.ratio_due(s) for s in range(100, 120)] == [
        detector.ratio_due(s) for s in range(100, 120)]


def test_log_z_near_its_bound_leaves_the_ratio_on_its_hold() -> None:
    """log Z near its bound brings log Z in at every step; a ratio far from its own bound stays
    on its hold, its estimate from the gradient norms standing for it."""
    detector = InstabilityPrecursor(DetectorConfig())
    detector.growth.near = lambda: True  # type: ignore[method-assign]
    events, measured = run_with_ratio_hold(detector, [np.array([0.9, 1.0, 1.1])] * 100)
    assert events == [] and all(detector.due(s) for s in range(100, 110))
    assert measured == [0, 4, 12, 28, 60, 92]  # as far from every bound


def test_every_step_means_the_ratio_too() -> None:
    detector = InstabilityPrecursor(DetectorConfig(instability_precursor={"every": 1}))
    _, measured = run_with_ratio_hold(detector, [np.array([0.9, 1.0, 1.1])] * 30)
    assert measured == list(range(30))


def test_a_ratio_its_estimates_miss_keeps_the_cadence() -> None:
    """Adam's second moment moving (here falling 3% a step, which the gradient norms do not
    show) makes each measurement miss its estimate: the ratio is measured at every due step."""
    detector = InstabilityPrecursor(DetectorConfig())
    moment = [0.97 ** (step / 2) for step in range(48)]
    _, measured = run_with_ratio_hold(detector, [np.array([0.3, 0.4, 0.5])] * 48, moment)
    assert measured == list(range(0, 48, 4))


@pytest.mark.parametrize("feed", [run_on_cadence, run_with_ratio_hold])
def test_the_cadence_warns_when_measuring_every_step_warns(feed: Any) -> None:
    """A parameter's ratio that climbs with its gradient is estimated from the gradient norm on
    the steps skipped and measured step by step once near its bound (with the ratio held, too):
    the warning comes at the step a probe measuring every step warns."""
    cfg = DetectorConfig(instability_precursor={"every": 1})
    for seed in range(5):
        for climb in (1.05, 1.1, 1.25):
            rows = ratios(160, seed, climb_from=100, climb=climb)
            every_step = run(InstabilityPrecursor(cfg), rows)
            sampled, _ = feed(InstabilityPrecursor(DetectorConfig()), rows)
            assert every_step and sampled, (seed, climb)
            assert sampled[0].step == every_step[0].step, (seed, climb)


def test_silent_on_steady_noisy_ratios_measured_every_few_steps() -> None:
    for seed in range(5):
        events, measured = run_on_cadence(InstabilityPrecursor(DetectorConfig()),
                                          ratios(400, seed))
        assert events == [] and len(measured) < 400


def test_a_rise_in_a_decaying_schedules_last_steps_is_judged_at_its_update() -> None:
    """A linear decay's last steps: the LR at a fifth of its recent median turns the same rise
    of the ratio into a fifth of the update, which is no precursor; at a constant LR it is."""
    steps, start = 160, 130
    rows = ratios(steps, 0)
    for step in range(start, steps):  # climbs 1.25x a step for 6 steps, then stays up
        rows[step][1] *= 1.25 ** min(step - start + 1, 6)
    constant, decaying = (InstabilityPrecursor(DetectorConfig(instability_precursor={"every": 1}))
                          for _ in range(2))
    warned = []
    for detector, lr_at in ((constant, lambda s: 1e-3),
                            (decaying, lambda s: 1e-3 * max(0.01, 1 - s / 150))):
        warned.append([e.step for step, row in enumerate(rows) for e in detector.check(
            signals(step, names=NAMES, lr=lr_at(step), precursors={"adam_ratio_rms": row}))])
    assert warned[0] and start <= warned[0][0] <= start + 8
    assert warned[1] == []


def test_whether_a_streak_runs_is_kept_with_the_streaks() -> None:
    """`streaking`, which every quiet step reads instead of scanning the streaks, says what the
    streaks say after every step: measured or estimated, through an episode, and after a state
    round trip in the middle of a streak."""
    for seed in range(3):
        rows = ratios(80, seed) + ratios(40, seed + 10, climb_from=0, climb=1.1) + ratios(
            60, seed + 20)
        detector, ran = InstabilityPrecursor(DetectorConfig()), 0
        for step, row in enumerate(rows):
            measure = detector.due(step)
            detector.check(signals(step, names=NAMES, param_grad_norm=row,
                                   precursors={"adam_ratio_rms": row} if measure else {}))
            assert detector.streaking == bool(detector.streak.any()), (seed, step)
            ran += detector.streaking
            if step == 85:
                restored = InstabilityPrecursor(DetectorConfig())
                restored.load_state_dict(json.loads(json.dumps(detector.state_dict())))
                assert restored.streaking == detector.streaking
                detector = restored
        assert ran, seed  # a streak ran


def test_the_calm_lanes_plan_for_skipped_steps_leaves_what_take_calm_leaves() -> None:
    """`skipped_steps`, `SkippedSteps.quiet` and `stand`: the steps the probes skip, taken in
    one go, leave the state (and so every later decision) as `calm_at` and `take_calm` at each."""
    stepped = InstabilityPrecursor(DetectorConfig())
    planned = InstabilityPrecursor(DetectorConfig())
    rng = np.random.default_rng(0)
    plan = None
    for step in range(120):
        norms = np.array([0.9, 1.0, 1.1]) * np.exp(rng.normal(0.0, 0.1, 3))
        measured = step % 8 == 0
        row = signals(step, names=NAMES, param_grad_norm=norms, loss=2.0 - step / 100,
                      precursors={"adam_ratio_rms": norms / 2} if measured else {})
        if measured:
            if plan is not None:
                planned.stand(plan)
            assert stepped.check(row) == [] and planned.check(row) == []
            plan = planned.skipped_steps()
            continue
        assert stepped.calm_at(row) and stepped.take_calm(row) == []
        assert plan is not None
        quiet, peak = plan.quiet(row.param_grad_norm)
        assert quiet
        plan.keep(2.0 - step / 100, peak)
    assert plan is not None
    planned.stand(plan)
    assert json.dumps(planned.state_dict()) == json.dumps(stepped.state_dict())


def test_the_plan_takes_quiet_log_z_measurements_as_check_does() -> None:
    """Steps where the probes measure log Z alone join the plan while log Z stays under the
    lowest value kept (the plan's own included) plus the margin at which `near` turns; the state
    is then what `check` at each leaves. A dip lowers that floor: the usual level after it is
    no longer the plan's, and the precursor hears it itself."""
    stepped = InstabilityPrecursor(DetectorConfig())
    planned = InstabilityPrecursor(DetectorConfig())
    rng = np.random.default_rng(1)
    plan, taken, refused = None, 0, 0
    for step in range(480):
        norms = np.array([0.9, 1.0, 1.1]) * np.exp(rng.normal(0.0, 0.1, 3))
        logz = 3.0 if step == 324 else 5.0 + rng.normal(0.0, 0.1)
        precursors: dict[str, Any] = {}
        if step % 4 == 0:
            precursors = {"logz_max": np.array([logz]), "logz_mean": np.array([logz - 1.0]),
                          "ce_ceiling": np.array([logz + 1.0])}
        if step % 16 == 0:
            precursors["adam_ratio_rms"] = norms / 2
        loss = 2.0 - step / 1000
        row = signals(step, names=NAMES, param_grad_norm=norms, loss=loss,
                      precursors=precursors)
        if precursors:
            assert stepped.check(row) == []
        else:
            assert stepped.calm_at(row) and stepped.take_calm(row) == []
        found = plan.logz_row(precursors) if plan is not None and precursors else None
        if plan is None or (precursors and found is None):
            if plan is not None:
                planned.stand(plan)
                refused += step % 16 != 0
            assert planned.check(row) == []
            plan = planned.skipped_steps()
            continue
        quiet, peak = plan.quiet(row.param_grad_norm)
        assert quiet
        if found is not None:  # what the plan takes leaves `near` as it was, as check does
            assert not stepped.near and not stepped.growth_near, step
            plan.keep(loss, peak, (planned.measured_at(step), *found))
            taken += 1
        else:
            plan.keep(loss, peak)
        if step % 50 == 0:  # handed over now and then, as a full step does
            planned.stand(plan)
            assert json.dumps(planned.state_dict()) == json.dumps(stepped.state_dict()), step
    assert plan is not None
    planned.stand(plan)
    assert json.dumps(planned.state_dict()) == json.dumps(stepped.state_dict())
    assert taken > 40 and refused >= 1, (taken, refused)


@pytest.mark.parametrize("value", [float("-inf"), float("nan"), float("inf"), 6.6])
def test_the_plan_refuses_a_log_z_that_is_not_finite_or_not_under_its_bound(value: float) -> None:
    """`check` keeps a non-finite log Z as NaN and judges it on its own path: the plan takes
    only a finite value under its floor plus the margin (5.0 + 1.5 here)."""
    plan = SkippedSteps(per_norm=None, bound=1.25, logz_floor=5.0, logz_margin=1.5)
    logz = {"logz_max": np.array([value]), "logz_mean": np.array([4.0]),
            "ce_ceiling": np.array([7.0])}
    assert plan.logz_row(logz) is None
    assert plan.logz_row({**logz, "logz_max": np.array([6.4])}) is not None
