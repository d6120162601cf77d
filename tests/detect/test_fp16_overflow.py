from __future__ import annotations

from collections.abc import Collection

import numpy as np
import pytest
import torch

from tests.detect.synth import (
    HEALTHY_STEPS,
    INF,
    NAN,
    SEEDS,
    assert_same_decisions,
    default_config,
    healthy_grad_norms,
    healthy_losses,
    restored,
    run,
    sampled_step,
    signals,
    steps_of,
)
from trainguard import Guard, GuardConfig
from trainguard.detect import Fp16Overflow
from trainguard.events import at_least
from trainguard.signals import StepSignals

from ..conftest import make_setup

MODULES = ["embed", "block.0.attn", "block.0.mlp", "head"]
WINDOW = default_config().fp16_overflow.window
SKIPS = default_config().fp16_overflow.skips


def activations(step: int, maxabs: list[float], *, fp16: list[float] | None = None,
                nonfinite: list[float] | None = None) -> StepSignals:
    n = len(maxabs)
    return sampled_step(step, module_names=MODULES[:n], per_module={
        "act_maxabs": maxabs, "act_zero_frac": [0.1] * n,
        "act_nonfinite": nonfinite if nonfinite is not None else [0.0] * n,
        "act_fp16": fp16 if fp16 is not None else [1.0] * n})


def amp_step(step: int, *, overflow: bool = False, scale: float = 65536.0,
             grad_max: float | None = 300.0, loss: float = 1.0) -> StepSignals:
    return signals(step, loss=loss, grad_norm=INF if overflow else 1.0, amp_overflow=overflow,
                   loss_scale=scale, fp16_grad_maxabs=None if overflow else grad_max)


def amp_run(start: int, n: int, overflows: Collection[int] = (),
            scale: float = 65536.0) -> list[StepSignals]:
    return [amp_step(s, overflow=s in overflows, scale=scale) for s in range(start, start + n)]


def test_activation_near_the_limit_names_the_first_module_in_execution_order() -> None:
    detector = Fp16Overflow(default_config())
    event, = detector.check(activations(101, [12.0, 40000.0, 65504.0, 3.0]))
    assert (event.kind, event.step, event.severity) == ("fp16_overflow", 100, "warning")
    assert event.param == "block.0.attn"  # first to run, though block.0.mlp is larger
    assert event.value == pytest.approx(40000.0)
    assert event.details["symptom"] == "activation"
    assert event.details["modules"] == ["block.0.attn", "block.0.mlp"]


def test_nonfinite_fp16_activation_counts() -> None:
    event, = Fp16Overflow(default_config()).check(
        activations(11, [5.0, 6.0, NAN, INF], nonfinite=[0.0, 0.0, 1.0, 0.5]))
    assert event.param == "block.0.mlp"
    assert event.details["modules"] == ["block.0.mlp", "head"]


def test_large_activations_outside_float16_do_not_count() -> None:
    detector = Fp16Overflow(default_config())
    step = activations(1, [1e6, INF, 40000.0, 3.0], fp16=[0.0, 0.0, 0.0, 1.0],
                       nonfinite=[0.0, 1.0, 0.0, 0.0])
    assert detector.check(step) == []


def test_activation_symptom_is_one_event_per_episode() -> None:
    detector = Fp16Overflow(default_config())
    steps = [activations(1, [1.0, 50000.0]), amp_step(2), activations(3, [1.0, 60000.0]),
             amp_step(4), activations(5, [1.0, 100.0]), activations(7, [50000.0, 1.0])]
    events = run(detector, steps)
    assert [(e.step, e.param) for e in events] == [(0, "block.0.attn"), (6, "embed")]


def test_float16_gradients_near_the_limit() -> None:
    detector = Fp16Overflow(default_config())
    steps = [amp_step(0, grad_max=100.0), amp_step(1, grad_max=40000.0),
             amp_step(2, grad_max=50000.0), amp_step(3, grad_max=10.0),
             amp_step(4, grad_max=INF)]
    events = run(detector, steps)
    assert [(e.step, e.details["symptom"], e.severity) for e in events] == [
        (1, "gradient", "warning"), (4, "gradient", "warning")]
    assert events[0].value == 40000.0


def test_frequent_overflow_skips_after_the_initial_window_fire() -> None:
    detector = Fp16Overflow(default_config())
    overflows = {100, 108, 117, 125, 133, 141, 150}
    events = run(detector, amp_run(0, 300, overflows))
    event, = events
    assert (event.step, event.severity, event.details["symptom"]) == (133, "warning", "skips")
    assert event.value == SKIPS
    assert event.details["loss_scale"] == 65536.0


def test_occasional_overflow_skips_do_not_fire() -> None:
    # the scaler growing its scale and overflowing once now and then is normal
    overflows = set(range(60, 1000, 40))
    assert run(Fp16Overflow(default_config()), amp_run(0, 1000, overflows)) == []


def test_overflow_skips_rearm_after_the_window_clears() -> None:
    first = {100, 101, 102, 103, 104, 105}
    second = {300, 310, 320, 330, 340}
    events = run(Fp16Overflow(default_config()), amp_run(0, 400, first | second))
    assert steps_of(events) == [104, 340]


def calibrating(halvings: int, steps: int, *, init: float = 65536.0, first: int = 0,
                skipped: Collection[int] = ()) -> list[StepSignals]:
    """A GradScaler from `init`: every step from `first` overflows and halves the scale until
    `halvings` skips were made (or the steps in `skipped`), then the scale holds."""
    out, scale = [], init
    chosen = set(skipped) or set(range(first, first + halvings))
    for s in range(steps):
        overflow = s in chosen
        out.append(amp_step(s, overflow=overflow, scale=scale))
        if overflow:
            scale /= 2
    return out


@pytest.mark.parametrize(("halvings", "power"), [(1, 16), (4, 16), (8, 16), (12, 16), (24, 40)])
def test_the_initial_calibration_is_counted_and_named_never_a_warning(halvings: int,
                                                                      power: int) -> None:
    init = 2.0 ** power
    event, = run(Fp16Overflow(default_config()), calibrating(halvings, HEALTHY_STEPS, init=init))
    assert (event.severity, event.details["symptom"]) == ("info", "calibration")
    assert event.step == halvings - 1 + 10, "named when the scale held for 10 steps"
    assert event.details["skips"] == halvings == event.value
    assert (event.details["first_step"], event.details["last_step"]) == (0, halvings - 1)
    assert event.details["init_scale"] == init
    assert event.details["loss_scale"] == init / 2 ** halvings
    assert event.message.startswith(f"GradScaler calibration: {halvings} of the steps 0-"
                                    f"{halvings - 1} skipped for inf/NaN gradients while the "
                                    f"loss scale fell from {init:.4g} (2^{power}) to ")


def test_a_calibration_from_a_huge_init_scale_that_outlasts_the_window_is_no_warning() -> None:
    """init_scale 2**100: 84 halvings, past `overflow_window`, before the scale fits."""
    events = run(Fp16Overflow(default_config()),
                 calibrating(84, HEALTHY_STEPS, init=2.0 ** 100))
    assert [(e.severity, e.details["symptom"], e.step) for e in events] == [
        ("info", "calibration", 93)]
    assert "from 1.268e+30 (2^100) to 6.554e+04 (2^16)" in events[0].message


def test_a_step_that_just_fits_between_two_skips_belongs_to_the_calibration() -> None:
    skipped = [*range(0, 22), 23]  # the 2**40 run of a real GradScaler: step 22 passed
    event, = run(Fp16Overflow(default_config()),
                 calibrating(0, HEALTHY_STEPS, init=2.0 ** 40, skipped=skipped))
    assert event.details["skips"] == 23 and event.step == 33


def test_skips_that_keep_coming_after_the_calibration_are_a_warning() -> None:
    skipped = [*range(6), *range(60, 100, 8)]  # calibrated, then overflow every 8 steps
    events = run(Fp16Overflow(default_config()),
                 calibrating(0, HEALTHY_STEPS, skipped=skipped))
    assert [(e.step, e.severity, e.details["symptom"]) for e in events] == [
        (15, "info", "calibration"), (92, "warning", "skips")]
    assert "after its calibration (steps 0-5): the overflow persists" in events[1].message


def test_the_calibration_ends_when_the_scale_stops_falling() -> None:
    """A scaler growing its scale every few steps: a skip at a scale no lower than the last one
    is no calibration, and counts from there on."""
    steps = [amp_step(s, overflow=s in (0, 1, 4, 7), scale=[8.0, 4.0, 2.0, 4.0, 4.0][min(s, 4)])
             for s in range(60)]
    events = run(Fp16Overflow(default_config()), steps)
    assert [(e.step, e.details["symptom"]) for e in events] == [(4, "calibration")]
    assert events[0].details["skips"] == 2


def test_skips_in_a_log_that_begins_later_are_no_calibration() -> None:
    detector = Fp16Overflow(default_config())
    steps = [amp_step(s, overflow=s % 8 == 0, scale=65536.0 / 2 ** ((s - 1000) // 8))
             for s in range(1000, 1060)]
    events = run(detector, steps)
    assert [(e.step, e.details["symptom"]) for e in events] == [(1032, "skips")]


def test_collapsed_loss_scale_is_an_error_once_per_episode() -> None:
    scales = [4.0, 2.0, 1.0, 0.5, 0.25, 0.125, 0.5, 1.0, 2.0, 0.5]
    steps = [amp_step(s, scale=x) for s, x in enumerate(scales)]
    events = run(Fp16Overflow(default_config()), steps)
    assert [(e.step, e.severity, e.details["symptom"]) for e in events] == [
        (3, "error", "scale"), (9, "error", "scale")]
    assert events[0].value == 0.5


def test_no_scaler_means_no_scale_symptom() -> None:
    detector = Fp16Overflow(default_config())
    assert run(detector, [signals(s, loss_scale=None) for s in range(100)]) == []


@pytest.mark.parametrize("seed", SEEDS)
def test_silent_on_a_healthy_fp16_run(seed: int) -> None:
    rng = np.random.default_rng(seed)
    losses = healthy_losses(HEALTHY_STEPS, seed)
    norms = healthy_grad_norms(HEALTHY_STEPS, seed)
    detector = Fp16Overflow(default_config())
    overflows = {int(s) for s in rng.choice(np.arange(60, HEALTHY_STEPS), 6, replace=False)}
    scale = 65536.0
    events = []
    for s in range(HEALTHY_STEPS):
        overflow = s in overflows
        if overflow:
            step = amp_step(s, overflow=True, scale=scale, loss=float(losses[s]))
            scale /= 2
        elif s % 50 == 1:
            acts = list(rng.uniform(1.0, 3000.0, len(MODULES)))
            step = activations(s, acts)
            step.loss, step.grad_norm, step.loss_scale = float(losses[s]), float(norms[s]), scale
        else:
            step = amp_step(s, scale=scale, grad_max=float(norms[s] * 50), loss=float(losses[s]))
        events.extend(detector.check(step))
    assert events == []


def test_nan_inputs_do_not_crash_or_poison_the_state() -> None:
    detector = Fp16Overflow(default_config())
    nan_step = signals(60, loss=NAN, grad_norm=NAN, loss_scale=NAN, fp16_grad_maxabs=NAN)
    nan_acts = activations(61, [NAN, NAN], fp16=[NAN, NAN], nonfinite=[NAN, NAN])
    events = run(detector, [*amp_run(0, 60), nan_step, nan_acts])
    # a NaN float16 gradient maximum is an overflow; NaN scale and unknown dtype are not symptoms
    assert [e.details["symptom"] for e in events] == ["gradient"]
    assert list(detector.overflow_steps) == []
    assert run(detector, amp_run(62, 20)) == []
    later = run(detector, [amp_step(82, grad_max=60000.0), amp_step(83, scale=0.5),
                           activations(85, [1.0, 33000.0])])
    assert [(e.step, e.details["symptom"]) for e in later] == [
        (82, "gradient"), (83, "scale"), (84, "activation")]


def test_state_round_trip_preserves_behaviour() -> None:
    config = default_config()
    original = Fp16Overflow(config)
    prefix = [*amp_run(0, 100, {80, 90, 95}), amp_step(100, scale=0.5)]
    assert [e.details["symptom"] for e in run(original, prefix)] == ["scale"]
    clone = restored(original)
    assert clone.state_dict() == original.state_dict()
    continuation = [amp_step(101, scale=0.5), amp_step(102, overflow=True, scale=0.5),
                    amp_step(103, overflow=True, scale=0.25), *amp_run(104, 10, scale=2.0)]
    events = assert_same_decisions(original, clone, continuation)
    assert [(e.step, e.details["symptom"]) for e in events] == [(103, "skips")]
    # the state matters: a fresh detector reports the low scale again and misses the skips
    fresh = run(Fp16Overflow(config), continuation)
    assert [(e.step, e.details["symptom"]) for e in fresh] == [(101, "scale")]


# -- as a user meets it: a real float16 run -------------------------------------------------------
@pytest.mark.parametrize("init_scale", [None, 2.0 ** 40], ids=["default", "2**40"])
def test_a_real_fp16_run_names_its_scalers_calibration_and_warns_nothing(
        init_scale: float | None) -> None:
    """A healthy fine-tune under float16 autocast: from init_scale 2**40 its GradScaler skips
    its first 20-odd steps while the scale falls to what the gradients fit. Named as that
    calibration (info), counted, and no warning; from the default scale as well."""
    setup = make_setup(lr=3e-3, warmup=20, total=80)
    scaler = (torch.amp.GradScaler("cpu") if init_scale is None
              else torch.amp.GradScaler("cpu", init_scale=init_scale))
    guard = Guard(setup.model, setup.optimizer, setup.scheduler, scaler,
                  config=GuardConfig(sinks={"console": False}))
    skipped = []
    for step in range(80):
        batch = setup.batch()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = setup.model.loss(batch)
        scaler.scale(loss).backward()
        if guard.step(loss, batch=batch).action == "skipped":
            skipped.append(step)
        setup.optimizer.zero_grad(set_to_none=True)
    guard.close()
    assert [e.message for e in guard.events if at_least(e.severity, "warning")] == []
    calibration = [e for e in guard.events if e.kind == "fp16_overflow"]
    assert guard.verdict is not None and guard.verdict.verdict == "healthy"
    if init_scale is None:
        assert len(calibration) == (1 if skipped else 0)
        return
    event, = calibration
    assert len(skipped) >= 20 and max(skipped) < 30
    assert (event.severity, event.details["symptom"]) == ("info", "calibration")
    assert event.details["skips"] == len(skipped)
    assert event.details["init_scale"] == 2.0 ** 40
    assert event.details["loss_scale"] == scaler.get_scale()
