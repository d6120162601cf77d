"""Every built-in detector honours the contract of trainguard.detect.base.Detector, and the
evaluation watch (`MetricCollapse`, fed metrics rather than step signals) honours its own.

The detectors are found by importing every module of `trainguard.detect`: a new detector class is
under these checks without being listed here, and one left out of `DETECTOR_TYPES` (so out of
every run) fails `test_every_detector_class_is_in_the_runs`."""

from __future__ import annotations

import importlib
import json
import math
import pkgutil

import numpy as np
import pytest

import trainguard.detect
from tests.detect.synth import (
    NAMES,
    default_config,
    event_key,
    healthy_grad_norms,
    healthy_losses,
    healthy_weight_stats,
    restored,
    signals,
)
from trainguard import registry
from trainguard.config import SEVERITIES, DetectorConfig
from trainguard.detect import DETECTOR_TYPES, KINDS, Detector, default_detectors
from trainguard.detect.aftermath import Aftermath
from trainguard.detect.attention_logits import AttentionLogitTracker, AttentionTrack
from trainguard.detect.base import (
    Episode,
    FromStartLevel,
    Outlier,
    OutlierDetector,
    StreakDetector,
    UnlearnedStreak,
)
from trainguard.detect.batch_noise import BatchNoise
from trainguard.detect.calm import RowJudge, SignalColumns
from trainguard.detect.fp16_overflow import ScaleCalibration
from trainguard.detect.instability_precursor import SkippedSteps
from trainguard.detect.loss_divergence import LanePlan
from trainguard.detect.metric_collapse import MetricCollapse
from trainguard.detect.on_duty import OnDuty
from trainguard.detect.output_growth import OutputGrowth, Streaks
from trainguard.detect.reward_hacking import RewardTrack
from trainguard.detect.sample_judge import SampleJudge
from trainguard.detect.stall_reason import StallEvidence, StallReason
from trainguard.detect.trainer_metrics import EntropyFall
from trainguard.events import Event
from trainguard.signals import SampledStats, StepSignals

MODULES = ["embed", "head"]
PER_PARAM_KEYS = ["weight_mean", "weight_std", "weight_maxabs", "weight_nonfinite",
                  "weight_norm", "update_ratio", "optstate_exp_avg_norm",
                  "optstate_exp_avg_maxabs", "optstate_exp_avg_sq_norm",
                  "optstate_exp_avg_sq_maxabs"]
PER_MODULE_KEYS = ["act_maxabs", "act_zero_frac", "act_nonfinite", "act_fp16"]
IDS = [t.__name__ for t in DETECTOR_TYPES]


def detect_classes() -> set[type]:
    """Every class defined in a module of `trainguard.detect`."""
    found: set[type] = set()
    for info in pkgutil.walk_packages(trainguard.detect.__path__, "trainguard.detect."):
        module = importlib.import_module(info.name)
        found |= {value for value in vars(module).values()
                  if isinstance(value, type) and value.__module__ == info.name}
    return found


EVAL_WATCHES: tuple[type, ...] = (MetricCollapse,)
"""Watches fed evaluation metrics (`observe`), not step signals: checked below the detectors."""
HELPERS: tuple[type, ...] = (Detector, OutlierDetector, StreakDetector, UnlearnedStreak,
                             FromStartLevel, Episode,
                             Outlier, AttentionLogitTracker,
                             AttentionTrack, OutputGrowth, Streaks, BatchNoise, ScaleCalibration,
                             StallEvidence, StallReason, SignalColumns, SampleJudge, RewardTrack,
                             EntropyFall, OnDuty, RowJudge, SkippedSteps, LanePlan, Aftermath)
"""The base classes, helpers detectors share, the trackers `InstabilityPrecursor` composes
(the attention-logit side, log Z and the update RMS, the batch's size, the trouble its
warnings would come after), the GradScaler's
calibration `Fp16Overflow` follows, the evidence `NoProgress` gathers of why a run
stalled, the reward tracks `RewardHacking` keeps, the entropy's fall the completion detectors read,
and the columns of a log's rows the offline
fast paths read (and what their driver asks of a detector): their conformance is their
detector's; and the judge of the samples a model
makes, fed by the Guard, not by step signals (`tests/detect/test_sample_judge.py`); and the
roster of the detectors a live step concerns (`tests/detect/test_on_duty.py`); and the plans
the calm lane follows for the precursor's skipped steps and the divergence's levels
(`tests/detect/test_instability_precursor.py`, `tests/detect/test_loss_divergence.py`)."""
SETTINGS = "trainguard.detect.settings"
"""The module of the detectors' configuration sections: plain data, checked by tests/test_config.py
and tests/test_layers.py."""


def test_every_detector_class_is_in_the_runs() -> None:
    found = detect_classes()
    detectors = {c for c in found if issubclass(c, Detector)
                 and c not in (Detector, OutlierDetector, StreakDetector, UnlearnedStreak,
                               FromStartLevel)}
    assert detectors == set(DETECTOR_TYPES), "a detector missing from DETECTOR_TYPES"
    settings = {c for c in found if c.__module__ == SETTINGS}
    unknown = found - detectors - set(EVAL_WATCHES) - set(HELPERS) - settings
    assert not unknown, (f"new classes in trainguard.detect: {sorted(c.__name__ for c in unknown)}"
                         "; add each to DETECTOR_TYPES, or to EVAL_WATCHES or HELPERS here")


def all_nan(step: int) -> StepSignals:
    nan = np.full(len(NAMES), np.nan, dtype=np.float32)
    sample = SampledStats(step=step - 1, per_param={k: nan.copy() for k in PER_PARAM_KEYS},
                          module_names=list(MODULES),
                          per_module={k: np.full(len(MODULES), np.nan, dtype=np.float32)
                                      for k in PER_MODULE_KEYS})
    return StepSignals(step=step, loss=math.nan, grad_norm=math.nan, param_grad_norm=nan,
                       param_names=list(NAMES), lr=math.nan, loss_scale=math.nan,
                       amp_overflow=False, fp16_grad_maxabs=math.nan, sampled=[sample])


def busy_run(n: int = 120) -> list[StepSignals]:
    """A run that gives every stateful detector something to remember, faults included."""
    losses = healthy_losses(n, 0)
    norms = healthy_grad_norms(n, 0)
    steps = []
    for s in range(n):
        kwargs: dict = {"loss": float(losses[s]), "grad_norm": float(norms[s]),
                        "loss_scale": 2.0 ** 15, "fp16_grad_maxabs": 100.0}
        if s == 60:
            kwargs.update(loss=1e8, grad_norm=5000.0)
        if s in (70, 72, 74, 76, 78):
            kwargs.update(grad_norm=math.inf, amp_overflow=True, fp16_grad_maxabs=None)
        if s == 80:
            kwargs.update(loss=math.nan, grad_norm=math.nan)
        if s % 25 == 1:
            kwargs["sampled"] = [SampledStats(step=s - 1, per_param=healthy_weight_stats(s))]
        steps.append(signals(s, **kwargs))
    return steps


def test_kinds_are_unique_and_non_empty() -> None:
    kinds = [t.kind for t in DETECTOR_TYPES]
    assert all(isinstance(k, str) and k for k in kinds)
    assert len(set(kinds)) == len(kinds)
    assert tuple(kinds) == KINDS
    assert [d.kind for d in default_detectors(default_config())] == kinds
    assert "metric_collapse" not in kinds and registry.is_registered("metric_collapse")


@pytest.mark.parametrize("detector_type", DETECTOR_TYPES, ids=IDS)
def test_is_a_detector_with_its_own_kind(detector_type: type[Detector]) -> None:
    assert issubclass(detector_type, Detector)
    assert detector_type.kind != Detector.kind
    assert "kind" in vars(detector_type)


@pytest.mark.parametrize("detector_type", DETECTOR_TYPES, ids=IDS)
def test_all_nan_signals_do_not_raise(detector_type: type[Detector]) -> None:
    detector = detector_type(default_config())
    for step in range(1, 60):
        events = detector.check(all_nan(step))
        check_events(detector, events)
    json.dumps(detector.state_dict(), allow_nan=True)


@pytest.mark.parametrize("detector_type", DETECTOR_TYPES, ids=IDS)
def test_missing_loss_does_not_raise(detector_type: type[Detector]) -> None:
    detector = detector_type(default_config())
    for step, norm in enumerate(healthy_grad_norms(60, 0)):
        events = detector.check(signals(step, loss=None, grad_norm=float(norm)))
        check_events(detector, events)
    # the shape of the signals the run builds at close, to flush the last heavy probes
    closing = StepSignals(step=60, loss=None, grad_norm=0.0, param_grad_norm=np.zeros(2),
                          param_names=list(NAMES),
                          sampled=[SampledStats(step=59, per_param=healthy_weight_stats(59))])
    check_events(detector, detector.check(closing))


@pytest.mark.parametrize("detector_type", DETECTOR_TYPES, ids=IDS)
def test_no_parameters_does_not_raise(detector_type: type[Detector]) -> None:
    detector = detector_type(default_config())
    for step in range(30):
        check_events(detector, detector.check(StepSignals(
            step=step, loss=1.0 if step != 20 else 1e9, grad_norm=1.0 if step != 20 else 5e3,
            param_grad_norm=np.zeros(0, dtype=np.float32), param_names=[])))


@pytest.mark.parametrize("detector_type", DETECTOR_TYPES, ids=IDS)
def test_state_round_trips_through_json(detector_type: type[Detector]) -> None:
    config = default_config()
    steps = busy_run()
    original = detector_type(config)
    for s in steps[:75]:  # cut in the middle of the overflow burst
        original.check(s)
    state = original.state_dict()
    text = json.dumps(state, allow_nan=True)
    clone = restored(original)
    assert json.dumps(clone.state_dict(), allow_nan=True) == text
    for s in steps[75:]:
        assert [event_key(e) for e in original.check(s)] == [event_key(e) for e in clone.check(s)]
    json.dumps(original.state_dict(), allow_nan=True)


@pytest.mark.parametrize("detector_type", DETECTOR_TYPES, ids=IDS)
def test_fresh_state_round_trips(detector_type: type[Detector]) -> None:
    fresh = detector_type(default_config())
    clone = restored(fresh)
    assert json.dumps(clone.state_dict(), allow_nan=True) \
        == json.dumps(fresh.state_dict(), allow_nan=True)
    # equal as values too: no NaN placeholder, which framework checkpoints compare unequal
    assert clone.state_dict() == fresh.state_dict()


def check_events(detector: Detector, events: list[Event]) -> None:
    for event in events:
        assert isinstance(event, Event)
        assert event.kind == detector.kind
        assert event.severity in SEVERITIES
        assert event.message
        assert event.param is None or isinstance(event.param, str)
        json.dumps(event.to_dict(), allow_nan=True)


# -- the evaluation watch ----------------------------------------------------------------------
def evaluations(n: int = 30) -> list[dict[str, float]]:
    """Evaluations that rise above chance, fall back to it, and climb and jump in loss."""
    evals = []
    for i in range(n):
        accuracy = 0.9 if i < 15 else 0.1
        loss = 1.0 - 0.02 * i if i < 15 else 0.7 + 0.1 * (i - 15)
        evals.append({"eval_accuracy": accuracy, "eval_loss": loss, "eval_f1": 0.8 if i < 20
                      else 0.2, "eval_samples_per_second": 100.0 + i})
    return evals


def check_eval_events(events: list[Event]) -> None:
    for event in events:
        assert isinstance(event, Event) and event.kind == "metric_collapse"
        assert event.severity in SEVERITIES and event.message
        json.dumps(event.to_dict(), allow_nan=True)


@pytest.mark.parametrize("watch_type", EVAL_WATCHES, ids=[t.__name__ for t in EVAL_WATCHES])
def test_nan_and_missing_metrics_do_not_raise(watch_type: type) -> None:
    watch = watch_type(DetectorConfig())
    for step in range(40):
        metrics = {"eval_loss": math.nan, "eval_accuracy": math.inf, "eval_f1": None,
                   "eval_note": "text", "eval_flag": True}
        check_eval_events(watch.observe(metrics, step * 10, classes=None, train_loss=None))
        check_eval_events(watch.observe({}, step * 10 + 5, classes=4, train_loss=math.nan))
    json.dumps(watch.state_dict(), allow_nan=True)


@pytest.mark.parametrize("watch_type", EVAL_WATCHES, ids=[t.__name__ for t in EVAL_WATCHES])
def test_eval_watch_state_round_trips_through_json(watch_type: type) -> None:
    evals = evaluations()
    original = watch_type(DetectorConfig())
    for i, metrics in enumerate(evals[:18]):  # cut after the accuracy fell to chance
        check_eval_events(original.observe(metrics, i * 10, classes=4, train_loss=1.0 / (i + 1)))
    text = json.dumps(original.state_dict(), allow_nan=True)
    clone = watch_type(DetectorConfig())
    clone.load_state_dict(json.loads(text))
    assert json.dumps(clone.state_dict(), allow_nan=True) == text
    seen = []
    for i, metrics in enumerate(evals[18:], start=18):
        a = original.observe(metrics, i * 10, classes=4, train_loss=1.0 / (i + 1))
        b = clone.observe(metrics, i * 10, classes=4, train_loss=1.0 / (i + 1))
        assert [event_key(e) for e in a] == [event_key(e) for e in b]
        seen += a
    assert seen, "the continuation raised something to compare"
    fresh = watch_type(DetectorConfig())
    reloaded = watch_type(DetectorConfig())
    reloaded.load_state_dict(json.loads(json.dumps(fresh.state_dict(), allow_nan=True)))
    assert reloaded.state_dict() == fresh.state_dict()
