"""The recovery benchmark: baselines of every fault, its scoring, and a real run under recover."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from benchmarks.scenarios import all_scenarios, scenario
from benchmarks.scenarios.__main__ import main
from benchmarks.scenarios.base import Scenario
from benchmarks.scenarios.recovery import (
    baseline_of,
    baselines,
    recovery_rows,
    recovery_scenarios,
    recovery_summary_lines,
    recovery_totals,
)
from benchmarks.scenarios.runner import RunResult, run_scenario
from benchmarks.scenarios.strategies import RECOVERY_STRATEGIES, make_stepper

from trainguard import GuardConfig


def test_every_faulty_scenario_has_a_healthy_baseline_of_its_own_family() -> None:
    catalogue = {s.name: s for s in all_scenarios()}
    faulty = [s for s in catalogue.values() if not s.healthy]
    for s in faulty:
        base = catalogue[baseline_of(s)]
        assert base.healthy and base.family == s.family, s.name
        assert not base.distributed or s.distributed, s.name
    assert set(baselines()) == {s.name for s in faulty}, "no stale or missing entries"
    healthy = catalogue["image_cls_healthy"]
    assert baseline_of(healthy) == "image_cls_healthy"
    assert baseline_of(catalogue["image_cls_nan_input"]) == "image_cls_healthy"
    assert baseline_of(catalogue["image_cls_fp16_overflow"]) == "image_cls_healthy_fp16"


def test_a_fault_without_a_baseline_is_a_clear_error() -> None:
    unknown = Scenario("lstm_gremlins", "lstm", scenario("lstm_healthy_sgd").build, 10,
                       cause="outlier_batch", onset_step=3)
    with pytest.raises(KeyError, match=r"no healthy baseline.*BASELINES"):
        baseline_of(unknown)


def test_the_selection_keeps_recoverable_faults_and_adds_their_baselines() -> None:
    catalogue = all_scenarios()
    picked = [scenario("lstm_numerical_op"), scenario("lstm_lr_too_high_x50")]
    names = [s.name for s in recovery_scenarios(picked, catalogue)]
    assert names == ["lstm_numerical_op", "lstm_healthy_sgd"]
    everything = {s.name for s in recovery_scenarios(catalogue, catalogue)}
    assert everything == {s.name for s in catalogue if s.healthy or s.recoverable}
    assert len([s for s in catalogue if not s.healthy and s.recoverable]) >= 10


def _run(name: str, strategy: str, loss: float, outcome: str = "finished",
         rolled_back: int = 0) -> RunResult:
    s = scenario(name)
    return RunResult(scenario=name, family=s.family, cause=s.cause, onset_step=s.onset_step,
                     strategy=strategy, steps_run=s.steps, outcome=outcome,
                     final_eval_loss=loss, train_losses=[], actions={}, events=[], seconds=0.0,
                     rolled_back_steps=rolled_back)


def test_rows_score_each_run_against_its_baselines_unprotected_loss() -> None:
    results = [
        _run("image_cls_healthy", "none", 0.2),
        _run("image_cls_healthy", "clip", 0.2019),  # 0.95% worse: within the tolerance
        _run("image_cls_healthy", "recover", 0.2021, rolled_back=7),  # 1.05% worse
        _run("image_cls_nan_input", "none", math.nan, outcome="nan"),
        _run("image_cls_nan_input", "clip", 0.211),  # 5.5% worse
        _run("image_cls_nan_input", "protect", 0.209),  # 4.5% worse
        _run("image_cls_nan_input", "recover", 0.15, rolled_back=30),  # better than the baseline
        _run("image_cls_outlier_100x", "recover", 0.2, outcome="crashed"),
    ]
    catalogue = {s.name: s for s in all_scenarios()}
    rows = {(r.scenario, r.strategy): r for r in recovery_rows(results, catalogue)}
    healthy_clip = rows["image_cls_healthy", "clip"]
    assert healthy_clip.ratio == pytest.approx(1.0095) and not healthy_clip.worse
    assert rows["image_cls_healthy", "recover"].worse
    assert not rows["image_cls_healthy", "none"].worse
    nan_run = rows["image_cls_nan_input", "none"]
    assert nan_run.baseline == "image_cls_healthy" and nan_run.reference == 0.2
    assert math.isnan(nan_run.ratio) and not nan_run.within
    assert rows["image_cls_nan_input", "clip"].ratio == pytest.approx(1.055)
    assert not rows["image_cls_nan_input", "clip"].within
    assert rows["image_cls_nan_input", "protect"].within
    assert rows["image_cls_nan_input", "recover"].within
    crashed = rows["image_cls_outlier_100x", "recover"]
    assert crashed.ratio == pytest.approx(1.0) and not crashed.within, "a crash never recovers"

    totals = recovery_totals(list(rows.values()))
    per = totals["strategies"]
    assert per["recover"]["share"] == pytest.approx(0.5)
    assert per["recover"]["missed"] == ["image_cls_outlier_100x"]
    assert per["protect"]["share"] == 1.0 and per["none"]["share"] == 0.0
    assert per["recover"]["healthy_worse"] == {"image_cls_healthy": pytest.approx(1.0105)}
    assert per["clip"]["healthy_worse"] == {}
    assert (per["recover"]["rolled_back_steps_faults"],
            per["recover"]["rolled_back_steps_healthy"]) == (30, 7)
    target = totals["target"]
    assert not target["met"] and not target["share_met"]
    assert not target["ahead_of_every_other"] and not target["no_healthy_worse"]
    text = recovery_summary_lines(totals)
    assert "recover          1/2    50%  missed: image_cls_outlier_100x" in text
    assert "image_cls_healthy x1.01" in text and "MISSED" in text


def test_a_baseline_that_did_not_run_unprotected_leaves_no_reference() -> None:
    rows = recovery_rows([_run("lstm_numerical_op", "recover", 1.0)],
                         {s.name: s for s in all_scenarios()})
    assert math.isnan(rows[0].reference) and math.isnan(rows[0].ratio)
    assert not rows[0].within


def test_protect_and_recover_fix_the_guard_policy() -> None:
    workload = scenario("lstm_healthy_sgd").build(0)
    halting = GuardConfig(policy="halt", sinks={"console": False})
    for name, policy in (("protect", "protect"), ("recover", "recover"), ("trainguard", "halt")):
        stepper = make_stepper(name, workload, halting)
        try:
            assert stepper.guard.config.policy == policy  # type: ignore[attr-defined]
            assert stepper.name == name
        finally:
            stepper.close()
    assert RECOVERY_STRATEGIES == ("none", "clip", "skip_nonfinite", "zclip", "protect",
                                   "recover")


def test_recover_rolls_a_real_run_back_and_counts_the_steps_it_threw_away() -> None:
    spike = scenario("lstm_lr_spike")
    steps = spike.onset_step + 15
    result = run_scenario(spike, "recover", steps=steps)
    rollbacks = [e for e in result.events if e["kind"] == "rollback"]
    assert result.outcome == "finished" and result.steps_run == steps
    assert rollbacks and result.actions.get("rolled_back") == len(rollbacks)
    assert result.rolled_back_steps == sum(e["details"]["steps_undone"] for e in rollbacks) > 0
    assert all(e["details"]["to_step"] <= spike.onset_step for e in rollbacks)
    protected = run_scenario(spike, "protect", steps=steps)
    assert protected.rolled_back_steps == 0 and "rolled_back" not in protected.actions


@pytest.mark.slow
def test_the_recovery_mode_prints_and_writes_the_whole_table(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "recovery.json"
    assert main(["--recovery", "--only", "lstm_numerical_op", "--strategies", "skip_nonfinite,clip",
                 "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "lstm_numerical_op" in out and "lstm_healthy_sgd" in out
    data = json.loads(path.read_text())
    runs = {(r["scenario"], r["strategy"]) for r in data["results"]}
    assert runs == {(name, strategy) for name in ("lstm_numerical_op", "lstm_healthy_sgd")
                    for strategy in ("none", "skip_nonfinite", "clip")}
    rows = {(r["scenario"], r["strategy"]): r for r in data["recovery"]["rows"]}
    assert rows["lstm_numerical_op", "skip_nonfinite"]["within"] is True
    assert rows["lstm_numerical_op", "clip"]["outcome"] == "nan"
    assert rows["lstm_numerical_op", "clip"]["within"] is False
    shares = {k: v["share"] for k, v in data["recovery"]["totals"]["strategies"].items()}
    assert shares == {"none": 0.0, "skip_nonfinite": 1.0, "clip": 0.0}
    assert "target" not in data["recovery"]["totals"], "no recover run, no target verdict"

