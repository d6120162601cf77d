"""RunStoreSink: the run store behind the sink contract."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trainguard import RunReader, lifecycle
from trainguard.errors import RunDirInUse, StoreUnavailable
from trainguard.events import ActionRecord, Event
from trainguard.signals import SampledStats
from trainguard.sinks import SinkSet
from trainguard.store import DB_NAME, RunStoreSink

from .helpers import PARAMS, run_info, step_report


@dataclass
class Finding:
    check: str
    severity: str = "warning"
    message: str = "no warmup"

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, "severity": self.severity, "message": self.message,
                "fix": "add warmup", "cause": None, "evidence": []}


@dataclass
class Cause:
    code: str
    confidence: float
    evidence: list[str] = field(default_factory=lambda: ["loss spiked at step 3"])

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "confidence": self.confidence, "score": 1.0,
                "evidence": self.evidence, "fix": "lower the LR"}


def test_the_sink_records_the_whole_run(tmp_path: Path) -> None:
    sink = RunStoreSink(tmp_path / "run")
    sinks = SinkSet([sink])
    sinks.on_run_start(run_info(tmp_path / "run", integration="transformers.Trainer",
                                distributed={"world_size": 2}))
    sinks.on_findings([Finding("warmup")])
    sampled = SampledStats(step=0, per_param={"update_ratio": np.array([1e-3, math.nan, 2e-3])},
                           module_names=["block", "head"],
                           per_module={"act_maxabs": np.array([3.0, math.inf])})
    sinks.on_step(step_report(0, loss=2.5))
    spike = Event("loss_spike", 1, "warning", "loss 9 vs 2.5", value=9.0)
    sinks.on_event(spike)
    sinks.on_action(ActionRecord("skip", 1, "skipped the update"))
    sinks.on_action(ActionRecord("snapshot", 1, "wrote a snapshot",
                                 {"path": str(tmp_path / "snap.pt")}))
    sinks.on_diagnosis([Cause("lr_too_high", 0.7)])
    sinks.on_step(step_report(1, loss=9.0, grads=[math.nan, 1.0, math.inf], sampled=[sampled],
                              action="skipped", events=[spike]))
    sinks.on_step(step_report(2, loss=None, signals=False))
    sinks.on_run_end("halted")
    sinks.close()
    assert sinks.failures == {}

    with RunReader(tmp_path / "run") as reader:
        meta = reader.meta()
        assert meta["status"] == "halted" and meta["param_names"] == PARAMS
        assert meta["integration"] == "transformers.Trainer"
        assert meta["distributed"] == {"world_size": 2}
        assert meta["config"]["policy"] == "protect"
        assert meta["snapshot"] == str(tmp_path / "snap.pt")
        assert meta["preflight"][0]["check"] == "warmup"
        assert meta["diagnosis"][0]["code"] == "lr_too_high"
        steps = reader.steps()
        assert [s["step"] for s in steps] == [0, 1, 2]
        assert steps[1]["nonfinite_grads"] == 2 and steps[1]["action"] == "skipped"
        assert steps[1]["sampled"] is True and steps[1]["amp_overflow"] is False
        assert steps[2]["loss"] is None and "nonfinite_grads" not in steps[2]
        grad_steps, grads = reader.param_grad_norms()
        assert list(grad_steps) == [0, 1] and math.isnan(grads[1, 0]) and grads[1, 2] == math.inf
        ratio_steps, ratio = reader.param_metric("update_ratio")
        assert list(ratio_steps) == [0], "sampled stats are stored at their own step"
        assert math.isnan(ratio[0, 1])
        [(step, names, values)] = reader.module_metric("act_maxabs")
        assert step == 0 and names == ["block", "head"] and values[1] == math.inf
        assert [e.kind for e in reader.events()] == ["loss_spike"]
        assert [a.kind for a in reader.actions()] == ["skip", "snapshot"]
        summary = reader.summary()
        assert summary["ended"] is not None and summary["interventions"] == {"skip": 1,
                                                                            "snapshot": 1}


def test_close_is_idempotent_and_stops_tracking(tmp_path: Path) -> None:
    before = lifecycle.tracked()
    sink = RunStoreSink(tmp_path)
    assert lifecycle.tracked() == before + 1
    sink.on_run_start(run_info(tmp_path))
    sink.on_run_end("finished")
    sink.close()
    sink.close()
    assert lifecycle.tracked() == before
    sink.on_step(step_report(0))  # after close: ignored, never raises
    with RunReader(tmp_path) as reader:
        assert reader.meta()["status"] == "finished" and reader.steps() == []


def test_the_constructor_lets_the_caller_decide(tmp_path: Path) -> None:
    first = RunStoreSink(tmp_path / "run")
    with pytest.raises(RunDirInUse):
        RunStoreSink(tmp_path / "run")
    first.close()
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / DB_NAME).write_bytes(b"not sqlite" * 50)
    before = lifecycle.tracked()
    with pytest.raises(StoreUnavailable):
        RunStoreSink(tmp_path / "garbage")
    assert lifecycle.tracked() == before, "a refused sink is not tracked"


def test_resume_continues_the_run(tmp_path: Path) -> None:
    first = RunStoreSink(tmp_path)
    first.on_run_start(run_info(tmp_path))
    first.on_step(step_report(0))
    first.on_run_end("interrupted")
    first.close()
    again = RunStoreSink(tmp_path, resume=True)
    assert again.run_id == first.run_id == 1
    again.on_run_start(run_info(tmp_path, resume=True))
    again.on_step(step_report(1))
    again.on_run_end("finished")
    again.close()
    with RunReader(tmp_path) as reader:
        assert [s["step"] for s in reader.steps()] == [0, 1]
        assert reader.summary()["status"] == "finished" and reader.runs()[0]["resumed"] == 1
