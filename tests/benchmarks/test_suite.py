"""The scenario suite as a whole: its catalogue, its scoring, and every strategy it compares."""

from __future__ import annotations

import pytest
from benchmarks.scenarios import all_scenarios, scenario
from benchmarks.scenarios.base import Scenario
from benchmarks.scenarios.runner import RunResult, run_scenario, score
from benchmarks.scenarios.strategies import STRATEGIES

from trainguard.diagnose.causes import CAUSES


def test_catalogue_covers_every_cause_and_enough_healthy_runs() -> None:
    scenarios = all_scenarios()
    healthy = [s for s in scenarios if s.healthy]
    faulty = [s for s in scenarios if not s.healthy]
    assert len(healthy) >= 12 and len(faulty) >= 14
    assert {s.cause for s in faulty} == set(CAUSES), (
        "one scenario per cause code at least")
    assert {"gpt2", "gpt2_lora", "bert_cls", "image_cls", "diffusion", "lstm"} <= {
        s.family for s in scenarios}
    for s in faulty:
        assert s.onset_step is not None and 0 <= s.onset_step < s.steps, s.name


def test_a_scenario_needs_consistent_ground_truth() -> None:
    build = scenario("lstm_healthy_sgd").build
    with pytest.raises(ValueError, match="onset_step"):
        Scenario("x", "lstm", build, 10, cause="lr_too_high")
    with pytest.raises(ValueError, match="unknown cause"):
        Scenario("x", "lstm", build, 10, cause="gremlins", onset_step=0)


def _result(events: list[tuple[int, str]], onset: int | None) -> RunResult:
    return RunResult(scenario="s", family="f", cause=None if onset is None else "outlier_batch",
                     onset_step=onset, strategy="trainguard", steps_run=10, outcome="finished",
                     final_eval_loss=1.0, train_losses=[], actions={},
                     events=[{"step": step, "severity": sev, "kind": "k"} for step, sev in events],
                     seconds=0.0)


def test_scoring_counts_detection_latency_and_false_alarms() -> None:
    build = scenario("lstm_healthy_sgd").build
    faulty = Scenario("s", "f", build, 10, cause="outlier_batch", onset_step=5)
    healthy = Scenario("h", "f", build, 10)
    result = _result([(2, "warning"), (5, "info"), (7, "error")], onset=5)
    score(result, faulty)
    assert (result.detected, result.latency, result.false_alarms) == (True, 2, 1)
    result = _result([(6, "info")], onset=5)
    score(result, faulty)
    assert (result.detected, result.latency) == (False, None), "info events do not count"
    result = _result([(1, "info")], onset=None)
    score(result, healthy)
    assert result.false_alarms == 0 and result.detected is None, "an info event is a note"
    result = _result([(1, "warning")], onset=None)
    result.findings = [{"check": "warmup", "severity": "warning", "cause": "missing_warmup"}]
    score(result, healthy)
    assert result.false_alarms == 2, "a preflight warning on a healthy run is a false alarm"
    config_fault = Scenario("c", "f", build, 10, cause="missing_warmup", onset_step=0)
    result = _result([], onset=0)
    result.findings = [{"check": "warmup", "severity": "warning", "cause": "missing_warmup"}]
    score(result, config_fault)
    assert (result.detected, result.latency) == (True, 0), "the preflight found it"
    result.findings = [{"check": "warmup", "severity": "info", "cause": "missing_warmup"}]
    score(result, config_fault)
    assert result.detected is False


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_runs_a_scenario(strategy: str) -> None:
    result = run_scenario(scenario("lstm_numerical_op"), strategy, steps=5)
    assert result.outcome == "finished" and result.steps_run == 5
    assert len(result.train_losses) == 5


def test_proofs_are_counted_against_the_ground_truth() -> None:
    """A real faulty run with `prove="on"` confirms its cause; a healthy one, replayed at its
    middle step, has nothing to heal; the totals say so."""
    from benchmarks.scenarios.metrics import proof_totals, summary_lines, totals

    from trainguard import GuardConfig

    config = GuardConfig(sinks={"console": False}, prove={"mode": "on"})
    nan = run_scenario(scenario("image_cls_nan_input"), config=config, steps=90)
    healthy = run_scenario(scenario("mlp_cls_healthy"), config=config, steps=40)
    figures = proof_totals([nan], [healthy])
    assert figures["proof_applicable"] == 1 and figures["proof_confirmed"] == 1
    assert figures["proof_healthy_checked"] == 1 and figures["proof_healthy_confirmed"] == []
    assert nan.diagnosis[0] == "nonfinite_input" and nan.voted_diagnosis[0] == "nonfinite_input"
    scenarios = {s.name: s for s in all_scenarios()}
    lines = summary_lines(totals([nan, healthy], scenarios))
    assert "true cause confirmed by replay in 1/1" in lines


def test_a_healed_batch_confirms_the_data_and_is_wrong_only_without_the_true_cause() -> None:
    from benchmarks.scenarios.metrics import proof_totals

    def proved(confirmed_by: dict[str, str]) -> RunResult:
        result = _result([], onset=5)
        result.events = [{"step": 5, "severity": "info", "kind": "proof",
                          "details": {"reproduced": True, "seconds": 0.1,
                                      "confirmed_by": confirmed_by,
                                      "confirmed": {c: "why" for c in confirmed_by}}}]
        return result

    data = {"outlier_batch": "previous_batch", "input_scale": "previous_batch"}
    figures = proof_totals([proved(data), proved({"lr_too_high": "lr_x0.1"}),
                            proved({**data, "lr_too_high": "lr_x0.1"})], [])
    assert figures["proof_confirmed"] == 2
    assert figures["proof_wrong"] == ["s (lr_too_high)", "s (lr_too_high)"]


def test_a_false_alarm_proved_is_told_apart_from_the_healthy_step_check() -> None:
    """A healthy run's healthy step (proved on demand: not an incident) must have nothing to
    heal; a false alarm it raised, proved as an incident, is listed with what it confirmed."""
    from benchmarks.scenarios.metrics import proof_totals

    healthy = _result([], onset=None)
    healthy.events = [
        {"step": 150, "severity": "info", "kind": "proof",
         "details": {"incident": False, "confirmed": {}, "seconds": 0.1}},
        {"step": 257, "severity": "info", "kind": "proof",
         "details": {"incident": True, "confirmed": {"outlier_batch": "..."}, "seconds": 0.1}}]
    figures = proof_totals([], [healthy])
    assert figures["proof_healthy_checked"] == 1 and figures["proof_healthy_confirmed"] == []
    assert figures["proof_healthy_incidents"] == ["s (outlier_batch)"]
    healthy.events[0]["details"]["confirmed"] = {"lr_too_high": "..."}
    assert proof_totals([], [healthy])["proof_healthy_confirmed"] == ["s"]
