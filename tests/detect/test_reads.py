"""Each detector reads what it declares (`Detector.reads`) and nothing else: the offline analyzer
hands detectors a log's rows by that declaration, so a field read but not declared would be read
as a default the log never said.

The check: a busy run (spikes, explosions, fp16 overflows, a NaN step, an LR jump, sampled
weight statistics) is run through each detector twice, once as it is and once with every field
the detector does not declare replaced by a poison value; the events must be the same."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from tests.detect.synth import NAMES, default_config, event_key, healthy_weight_stats, signals
from trainguard.detect import DETECTOR_TYPES, Detector
from trainguard.signals import SampledStats, StepSignals

from .test_conformance import IDS, MODULES, busy_run

POISON = {
    "loss": lambda s: 1e9,
    "grad_norm": lambda s: math.nan,
    "param_grad_norm": lambda s: np.full_like(s.param_grad_norm, np.nan),
    "param_names": lambda s: [f"poison.{i}" for i in range(len(s.param_names))],
    "lr": lambda s: 1e3,
    "group_lrs": lambda s: (1e3 * (1 + s.step),),
    "loss_scale": lambda s: 1.0,
    "amp_overflow": lambda s: not s.amp_overflow,
    "fp16_grad_maxabs": lambda s: 65504.0,
    "sampled": lambda s: [],
    "loss_curvature": lambda s: 1e3,
    "lr_managed": lambda s: True,
    "loss_requires_grad": lambda s: False,
    "precursors": lambda s: {k: np.full_like(v, 50.0) for k, v in s.precursors.items()},
    "attention_logits": lambda s: {k: 1e4 * (1 + s.step) for k in s.attention_logits},
    "batch_elements": lambda s: 1 + s.step % 7,
    "clip_limit": lambda s: 1e-3,
    "trainer_metrics": lambda s: {k: math.nan for k in s.trainer_metrics},
    "grads_absent": lambda s: tuple(range(len(s.param_names))),
}
"""A value for each `StepSignals` field that no detector could take for what it was."""


def _run() -> list[StepSignals]:
    steps = busy_run()
    n = len(steps)
    for i in range(6):  # a forgotten backward: finite loss, no gradients
        steps.append(signals(n + i, loss=2.0, grad_norm=0.0, param_grad_norm=np.zeros(len(NAMES))))
    stats = healthy_weight_stats(n)
    alive = {"act_dead_frac": np.zeros(len(MODULES)), "act_batch_spread": np.ones(len(MODULES))}
    for i, step in enumerate((n + 6, n + 7, n + 8)):  # then the heavy probes see trouble
        bad = {**stats, "weight_nonfinite": np.array([0.0, 3.0]),
               "weight_maxabs": np.array([1e7, 0.1]),
               "optstate_exp_avg_sq_norm": np.array([math.nan, 1e-7])}
        steps.append(signals(step, loss=2.0, sampled=[SampledStats(
            step=step - 1, per_param=stats if i == 0 else bad, module_names=list(MODULES),
            per_module=alive if i == 0 else {"act_dead_frac": np.ones(len(MODULES)),
                                             "act_batch_spread": np.zeros(len(MODULES))})]))
    m = len(steps)
    for i in range(12):  # a layer frozen for 12 steps, then unfrozen
        steps.append(signals(m + i, loss=2.0, param_grad_norm=[0.0, 1.0]))
    steps.append(signals(m + 12, loss=2.0))
    rng = np.random.default_rng(0)
    for s in steps:  # an LR that jumps x100 at step 90, and the fields the busy run leaves out
        ratio = rng.uniform(0.8, 1.2, len(s.param_names)) * (1.0 if s.step < 100 else 1.5 ** (
            s.step - 99))  # Adam's g/sqrt(v) climbing on every parameter from step 100
        s.precursors = {"adam_ratio_rms": ratio}
        s.lr = 1e-4 if s.step < 90 else 1e-2
        s.group_lrs = (s.lr,)
        s.loss_curvature = 0.01
        s.loss_requires_grad = True
        s.attention_logits = {"h.0.attn": 20.0 * 1.1 ** max(0, s.step - 100)}  # growing too
        s.batch_elements = 512
        # a trainer's metrics: a KL that blows up at step 60, groups scored alike from 70, a
        # preference run's rewards pinned at 0 from 80, the entropy collapsing at 85, a NaN
        # log-probability at 95, the margin exploding at 88, one reward climbing from 75 while
        # the other never pays, the sampling ratio far above 1 from 90, the completions cut at
        # their limit from 92 and shrinking to nothing from 96
        s.trainer_metrics = {
            "completions/clipped_ratio": 0.1 if s.step < 92 else 1.0,
            "completions/mean_length": 100.0 if s.step < 96 else 2.0,
            "val/ratio": 1.0 if s.step < 90 else 4.0,
            "rewards/margins": 0.2 if s.step < 88 else 12.0,
            "rewards/format/mean": 0.1 if s.step < 75 else 0.9, "rewards/format/std": 0.2,
            "rewards/accuracy/mean": 0.0, "rewards/accuracy/std": 0.0,
            "kl": 0.002 if s.step < 60 else 2.0, "frac_reward_zero_std": float(s.step >= 70),
            "rewards/chosen": 0.1 if s.step < 80 else 0.0,
            "rewards/rejected": -0.1 if s.step < 80 else 0.0,
            "logps/chosen": math.nan if s.step == 95 else -3.0,
            "entropy": 3.0 if s.step < 85 else 0.1}
    return steps


def _events(detector: Detector, steps: list[StepSignals]) -> list[tuple]:
    return [event_key(e) for s in steps for e in detector.check(s)]


def _seen(detector: Detector, steps: list[StepSignals]) -> tuple:
    """The events and the state the run leaves the detector in."""
    return _events(detector, steps), json.dumps(detector.state_dict(), sort_keys=True,
                                                default=str)


def test_every_field_has_a_poison() -> None:
    fields = {f.name for f in dataclasses.fields(StepSignals)} - {"step", "ranks"}
    assert fields == set(POISON)
    for t in DETECTOR_TYPES:
        assert t.reads, f"{t.__name__} declares no field it reads"
        assert t.reads <= fields, f"{t.__name__} declares fields StepSignals does not have"


@pytest.mark.parametrize("detector_type", DETECTOR_TYPES, ids=IDS)
def test_a_detector_reads_only_what_it_declares(detector_type: type[Detector]) -> None:
    config = default_config()
    plain = _events(detector_type(config), _run())
    poisoned = _run()
    for s in poisoned:
        for name, poison in POISON.items():
            if name not in detector_type.reads:
                setattr(s, name, poison(s))
    assert _events(detector_type(config), poisoned) == plain


@pytest.mark.parametrize("detector_type", [t for t in DETECTOR_TYPES if t.reads],
                         ids=[t.__name__ for t in DETECTOR_TYPES if t.reads])
def test_the_busy_run_exercises_what_a_detector_declares(detector_type: type[Detector]) -> None:
    """Poisoning every declared field changes the events or the state the run leaves, or the
    check above proves little."""
    config = default_config()
    plain = _seen(detector_type(config), _run())
    poisoned = _run()
    for s in poisoned:
        for name in detector_type.reads:
            setattr(s, name, POISON[name](s))
    assert _seen(detector_type(config), poisoned) != plain


RAISING = [t for t in DETECTOR_TYPES if t.raises_from is not None]


@pytest.mark.parametrize("detector_type", RAISING, ids=[t.__name__ for t in RAISING])
def test_a_detector_raises_nothing_without_what_it_raises_from(
        detector_type: type[Detector]) -> None:
    """`raises_from` leaves a detector out of a log that holds none of those fields: over the
    busy run without them (every other field as it is), the detector raises nothing, and with
    them it does."""
    assert detector_type.raises_from is not None
    assert detector_type.raises_from <= detector_type.reads
    assert _events(detector_type(default_config()), _run())
    bare = _run()
    empty = StepSignals(step=0, loss=None, grad_norm=0.0, param_grad_norm=np.zeros(0),
                        param_names=[])
    for s in bare:
        for name in detector_type.raises_from:
            setattr(s, name, getattr(empty, name))
    assert _events(detector_type(default_config()), bare) == []
