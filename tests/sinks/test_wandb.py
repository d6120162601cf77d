"""WandbSink on a real offline W&B run, read back from the run's own `.wandb` log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainguard.sinks import WandbSink

from ..conftest import Actions
from ..tracker_runs import is_nan, number, wandb_records
from .conftest import guarded_run, run_steps, tiny_run

pytestmark = pytest.mark.slow
NAN_AT = 5


def test_an_active_run_gets_the_nan_step_its_event_the_verdict_and_the_causes(
        wandb_offline: Path, tmp_path: Path) -> None:
    import wandb

    tracker = wandb.init(mode="offline")
    run = guarded_run(run_dir=tmp_path / "store")
    run_steps(run, 12, nan_at=NAN_AT)
    run.guard.close()
    tracker.finish()
    records = wandb_records(Path(tracker.dir).parent)

    axis = "trainguard/step"
    assert [row[axis] for row in records.rows_with("trainguard/grad_norm")] == list(range(12))
    assert is_nan(records.at(axis, NAN_AT, "trainguard/loss"))
    assert number(records.at(axis, NAN_AT, "trainguard/nonfinite/loss")) == 1
    assert number(records.at(axis, NAN_AT, "trainguard/events/error")) >= 1
    assert number(records.at(axis, NAN_AT, "trainguard/skipped")) == 1
    assert number(records.at(axis, 4, "trainguard/loss")) == pytest.approx(run.reports[4].loss)
    # the sampled steps' per-layer health, grouped by statistic
    assert records.at(axis, 3, "trainguard/layers/grad_norm/body.0.weight") is not None
    # the NaN step's event as an alert, at its step
    assert any(a["title"] == "trainguard: nonfinite_loss" and f"step {NAN_AT}" in a["text"]
               for a in records.alerts)
    # the verdict, the ranked causes and the status in the run's summary
    summary = records.summary
    assert summary["trainguard/verdict"] == (run.guard.run.verdict.verdict or "not judged")
    causes = run.guard.run.diagnose()
    assert summary["trainguard/cause/1"].startswith(causes[0].code)
    assert summary["trainguard/causes"].split(", ")[0] == causes[0].code
    assert summary["trainguard/status"] == "finished"
    assert summary["trainguard/events_count"] == len(run.guard.events)
    # the events table and the HTML report
    table = records.rows_with("trainguard/events._type")
    assert len(table) == 1 and table[0]["trainguard/events._type"] == "table-file"
    tables = list(Path(tracker.dir).glob("media/table/trainguard/events_*.table.json"))
    rows = json.loads(tables[0].read_text())
    assert [NAN_AT, "error", "nonfinite_loss"] in [row[:3] for row in rows["data"]]
    ours = [a for a in records.artifacts if a.get("name") == f"trainguard-{tracker.id}"]
    assert len(ours) == 1
    assert [f["path"] for f in ours[0]["manifest"]["contents"]] == ["trainguard-report.html"]


def test_the_run_is_found_and_said_once_and_the_config_turns_it_off(
        wandb_offline: Path) -> None:
    import wandb

    tracker = wandb.init(mode="offline")
    actions = Actions()
    run = tiny_run([actions])
    run_steps(run, 3)
    run.guard.close()
    said = [a for a in actions.actions if a.kind == "report_to"]
    assert len(said) == 1 and tracker.id in said[0].message
    assert said[0].details == {"tracker": "wandb"}
    assert any(isinstance(s, WandbSink) for s in run.guard.run.sinks.sinks)
    off = guarded_run(sinks={"console": False, "trackers": False})
    assert not any(isinstance(s, WandbSink) for s in off.guard.run.sinks.sinks)
    off.guard.close()
    # a sink the user gave is not doubled
    given = WandbSink()
    mine = tiny_run([given])
    assert [s for s in mine.guard.run.sinks.sinks if isinstance(s, WandbSink)] == [given]
    mine.guard.close()
    tracker.finish()
