"""Collapse scenarios: an LR glitch kills a layer and collapses the predictions; shifted labels
drop held-out accuracy below chance while the train loss recovers. Ground truth on the unguarded
run; a denoiser whose targets became zeros; trainguard's reading of each."""

from __future__ import annotations

import math

import torch
from benchmarks.scenarios import scenario
from benchmarks.scenarios.families import mlp_cls
from benchmarks.scenarios.runner import one_step, run_scenario
from benchmarks.scenarios.strategies import make_stepper

from trainguard import GuardConfig


def test_the_glitch_kills_the_second_hidden_layer_of_an_unguarded_run() -> None:
    s = scenario("mlp_cls_dead_relu")
    workload = s.build(0)
    stepper = make_stepper("none", workload)
    for step in range(120):
        one_step(workload, stepper, step)
    data = workload.batch(500, 0)
    model = workload.model
    with torch.no_grad():
        hidden = model[3](model[2](model[1](model[0](data["x"]))))
        predictions = model(data["x"]).argmax(1)
    assert (hidden == 0).all(dim=0).float().mean() == 1.0, "every unit dead for every sample"
    assert predictions.unique().numel() == 1


def test_trainguard_names_the_dead_layer_and_the_one_class() -> None:
    # detection with nothing done about it (observe): the glitch kills the layer for good; under
    # protect the adaptive clip's alarm limits the glitch's damage and the run comes back
    result = run_scenario(scenario("mlp_cls_dead_relu"), "trainguard", steps=120,
                          config=GuardConfig(policy="observe", sinks={"console": False}))
    assert result.detected and result.latency <= 1 and result.false_alarms == 0
    kinds = {e["kind"] for e in result.events}
    assert {"output_collapse", "lr_change"} <= kinds
    assert "dead_units" in result.diagnosis[:3] and result.diagnosis[0] == "lr_too_high"


def test_shifted_labels_drop_held_out_accuracy_below_chance_unguarded() -> None:
    s = scenario("mlp_cls_label_shift")
    workload = s.build(0)
    stepper = make_stepper("none", workload)
    losses = [one_step(workload, stepper, step)[1] for step in range(220)]
    assert workload.eval_metrics is not None
    metrics = workload.eval_metrics(workload.model)
    assert metrics["eval_accuracy"] < 1 / mlp_cls.CLASSES
    assert losses[-1] < 0.5 * math.log(mlp_cls.CLASSES), "the train loss looks fine again"


def test_trainguard_reads_the_collapse_from_the_evaluation() -> None:
    result = run_scenario(scenario("mlp_cls_label_shift"), "trainguard", steps=220)
    chance = [e for e in result.events if e["kind"] == "metric_collapse"
              and e["details"]["rule"] == "chance"]
    assert chance and chance[0]["step"] >= mlp_cls.LABEL_SHIFT_AT
    assert result.diagnosis[0] == "label_problem"


def test_the_healthy_run_is_quiet_at_half_its_activations_zero() -> None:
    result = run_scenario(scenario("mlp_cls_healthy"), "trainguard")
    assert result.false_alarms == 0 and result.events == []
    assert result.final_eval_loss < 0.05


def test_a_denoiser_taught_to_predict_nothing_collapses_and_is_read_as_its_targets() -> None:
    from benchmarks.scenarios.families import diffusion

    s = scenario("diffusion_zero_target")
    steps = diffusion.ONSET + 60
    unguarded = run_scenario(s, "none", steps=steps)
    healthy = run_scenario(scenario("diffusion_healthy"), "none", steps=steps)
    assert unguarded.final_eval_loss > 5 * healthy.final_eval_loss  # it no longer denoises
    result = run_scenario(s, "trainguard", steps=steps)
    collapsed = [e for e in result.events if e["kind"] == "output_collapse"]
    assert collapsed and collapsed[0]["details"]["how"] == "collapsed"
    assert result.diagnosis[0] == "label_problem"
