"""Collapse: a layer that died, a model that predicts one class or a collapsed output, evaluation
metrics at chance; found on real small runs, and quiet on the healthy traps (a ReLU net at its
usual ~50% zeros, a fresh model that starts at chance or predicts its most frequent class)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import trainguard
from trainguard import Guard, GuardConfig
from trainguard.config import DetectorConfig
from trainguard.detect.metric_collapse import MetricCollapse
from trainguard.detect.output_collapse import OutputCollapse
from trainguard.signals import LossCurvature, SampledStats, StepSignals

from ..conftest import torch_threads


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    with torch_threads(1):
        yield


def classifier_run(glitch_lr: float | None, steps: int = 200) -> tuple[Guard, nn.Module]:
    """A ReLU MLP on 4 Gaussian blobs, SGD 0.05; `glitch_lr` for steps 80 and 81 (a schedule
    glitch), without clipping."""
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(1)
    centers = torch.randn(4, 16, generator=generator) * 2
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                          nn.Linear(64, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    guard = Guard(model, optimizer, config=GuardConfig(policy="observe", sinks={"console": False},
                                                       probes={"preflight": False},
                                                       clip={"max_grad_norm": None}))
    for step in range(steps):
        y = torch.randint(0, 4, (64,), generator=generator)
        x = centers[y] + torch.randn(64, 16, generator=generator)
        lr = glitch_lr if glitch_lr is not None and step in (80, 81) else 0.05
        optimizer.param_groups[0]["lr"] = lr
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    return guard, model


def test_an_lr_glitch_that_kills_a_layer_is_named_and_so_is_the_one_class_left() -> None:
    guard, _ = classifier_run(glitch_lr=100.0)
    dead = [e for e in guard.events if e.kind == "dead_units"]
    # measured on the first sampled step after the glitch: all or nearly all of the layer dead
    # (the step after any event is sampled, so how soon depends on which events came first)
    assert dead and dead[0].param == "3" and dead[0].value >= 0.9, dead
    assert "of its units are zero for every sample" in dead[0].message
    collapsed = [e for e in guard.events if e.kind == "output_collapse"]
    assert collapsed and collapsed[0].step <= 82
    assert "every prediction in the batch is class" in collapsed[0].message
    assert {c.code for c in guard.diagnose()[:3]} >= {"lr_too_high", "dead_units"}


def test_a_healthy_relu_net_at_half_zeros_raises_nothing() -> None:
    guard, _ = classifier_run(glitch_lr=None)
    assert guard.events == []
    reader_free = [s for s in guard.run.state.detectors if s.kind == "dead_units"]
    assert reader_free and reader_free[0].alive  # it did look at the layers


def test_a_fresh_language_model_predicting_its_frequent_token_is_no_alarm() -> None:
    detector = OutputCollapse(DetectorConfig())
    events = []
    # at init varied, then the one-token phase while the loss has barely moved
    for step, (share, loss) in enumerate([(0.3, 4.2), (0.99, 4.0), (1.0, 3.9), (0.99, 3.8)]):
        events += detector.check(_out(step, share, loss))
    assert events == []
    # once it learned and predicted varied tokens, a collapse counts
    events += detector.check(_out(4, 0.4, 1.5))
    events += detector.check(_out(5, 1.0, 2.0))
    assert [e.step for e in events] == [5] and "class 7" in events[0].message


def _out(step: int, share: float, loss: float, std: float = 1.0, kind: float = 1.0):
    return StepSignals(step=step, loss=loss, grad_norm=1.0, param_grad_norm=np.ones(1),
                       param_names=["w"], sampled=[SampledStats(step=step, output={
                           "out_kind": kind, "out_classes": 10.0, "out_mode_share": share,
                           "out_mode_class": 7.0, "out_std": std, "out_count": 256.0})])


def test_a_denoisers_predicted_noise_collapsing_or_exploding_is_found() -> None:
    for late, how in ((0.01, "collapsed"), (50.0, "exploded")):
        detector = OutputCollapse(DetectorConfig())
        stds = [1.0, 0.95, 1.02, 0.98, 1.0, late]
        events = [e for step, std in enumerate(stds)
                  for e in detector.check(_out(step, 0.0, 1.0, std=std, kind=0.0))]
        assert [e.details["how"] for e in events] == [how]


def test_a_continuous_output_learning_its_scale_is_no_alarm() -> None:
    detector = OutputCollapse(DetectorConfig())
    stds = [0.05, 0.1, 0.2, 0.4, 0.7, 1.0, 1.2, 1.3, 1.3]
    assert not [e for step, std in enumerate(stds)
                for e in detector.check(_out(step, 0.0, 1.0, std=std, kind=0.0))]


# -- evaluation metrics ----------------------------------------------------------------------------
def test_accuracy_back_at_chance_after_it_learned_is_reported_once() -> None:
    watch = MetricCollapse(DetectorConfig())
    history = [0.25, 0.27, 0.6, 0.8, 0.82, 0.26, 0.24, 0.81]  # 4 classes: chance 0.25
    fired = [i for i, acc in enumerate(history)
             for _ in watch.observe({"eval_accuracy": acc}, i, classes=4, train_loss=1.0)]
    assert fired == [5]


@pytest.mark.parametrize("name, values, fired", [
    ("eval_fid", [174.0, 90.0, 40.0, 20.0, 9.9], []),  # FID falls as a generator learns
    ("eval_fid", [60.0, 30.0, 20.0, 70.0], [3]),       # and more than triples when it breaks
    ("eval_mIoU", [60.0, 64.0, 65.0, 12.0], [3]),      # mean IoU, the segmentation metric
    ("eval_confidence_score", [0.2, 0.4, 0.7], []),   # no FID, though its letters are there
    ("eval_answer_accuracy", [0.1, 0.3, 0.5], []),    # no word error rate either
    ("top1_err", [40.0, 30.0, 25.0, 90.0], [3]),      # an error rate, by its short name
])
def test_fid_is_lower_is_better_and_mean_iou_a_quality_metric(
        name: str, values: list[float], fired: list[int]) -> None:
    watch = MetricCollapse(DetectorConfig())
    assert [i for i, v in enumerate(values)
            for _ in watch.observe({name: v}, i, classes=None, train_loss=None)] == fired


def test_an_eval_loss_rising_while_the_train_loss_falls_needs_patience() -> None:
    watch = MetricCollapse(DetectorConfig())
    evals = [(2.0, 2.1), (1.5, 1.6), (1.2, 1.3), (1.0, 1.35), (0.8, 1.45), (0.7, 1.6),
             (0.6, 1.75), (0.5, 1.9)]
    fired = [i for i, (train, ev) in enumerate(evals)
             for _ in watch.observe({"eval_loss": ev}, i, classes=None, train_loss=train)]
    assert fired == [7]  # the median of the last three evaluations is clearly above its best


def test_a_noisy_flat_eval_loss_is_no_alarm() -> None:
    rng = np.random.default_rng(0)
    watch = MetricCollapse(DetectorConfig())
    events = [e for i in range(40) for e in watch.observe(
        {"eval_loss": 1.0 + 0.03 * rng.standard_normal(), "eval_accuracy": 0.7},
        i, classes=4, train_loss=1.0 - 0.001 * i)]
    assert events == []


@pytest.mark.parametrize("name", ["eval_perplexity", "Test perplextity", "valid_ppl",
                                  "eval_nll", "test_wer"])
def test_metrics_that_fall_as_the_model_learns_are_no_alarm_when_they_fall(name: str) -> None:
    """A perplexity (under any spelling of its stem), a negative log-likelihood or an error
    rate falling by half is learning; rising threefold from its best is a cliff."""
    watch = MetricCollapse(DetectorConfig())
    falling = [e for i, v in enumerate([24.0, 15.7, 13.6, 12.4, 11.1, 10.3])
               for e in watch.observe({name: v}, i, classes=None, train_loss=None)]
    assert falling == []
    cliff = watch.observe({name: 40.0}, 6, classes=None, train_loss=None)
    assert [e.details["rule"] for e in cliff] == ["cliff"]


def test_a_cliff_and_a_nan_metric() -> None:
    watch = MetricCollapse(DetectorConfig())
    assert watch.observe({"bleu": 30.0}, 0, classes=None, train_loss=None) == []
    cliff = watch.observe({"bleu": 9.0}, 1, classes=None, train_loss=None)
    assert [e.details["rule"] for e in cliff] == ["cliff"]
    nan = watch.observe({"bleu": math.nan}, 2, classes=None, train_loss=None)
    assert [(e.details["rule"], e.severity) for e in nan] == [("nonfinite", "error")]
    assert watch.best["bleu"] == 30.0, "a NaN never becomes the best"


def test_observe_eval_in_a_plain_loop_is_stored_shown_and_ranked(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = nn.Linear(8, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = Guard(model, optimizer, config=GuardConfig(sinks={"console": False},
                                                       probes={"preflight": False}),
                  run_dir=tmp_path / "run")
    for step in range(30):
        x = torch.randn(16, 8)
        loss = nn.functional.cross_entropy(model(x), x[:, :4].argmax(1))
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
        if step % 10 == 9:
            accuracy = 0.9 if step < 20 else 0.26  # the classes inferred from the 4 outputs
            guard.observe_eval({"eval_accuracy": accuracy, "eval_loss": 0.3})
    guard.close()
    events = [e for e in guard.events if e.kind == "metric_collapse"]
    assert [(e.step, e.details["rule"]) for e in events] == [(29, "chance")]
    assert guard.diagnose()[0].code == "label_problem"
    summary = trainguard.RunReader(tmp_path / "run").summary()
    assert summary["eval"] == [{"step": 29, "metrics": {"eval_accuracy": 0.26,
                                                         "eval_loss": 0.3}}]


def test_the_loss_curvature_is_positive_while_the_loss_accelerates_up() -> None:
    curvature = LossCurvature(span=5)
    values = [curvature.observe(1.0 * 1.1 ** (i * i / 20)) for i in range(40)]
    assert values[:2] == [None, None]
    assert all(v is not None and v > 0 for v in values[10:])
    flat = LossCurvature(span=5)
    assert abs(flat.observe(2.0) or 0) + abs(flat.observe(math.nan) or 0) == 0
