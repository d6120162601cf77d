"""TensorBoardSink on a real guarded run, read back with TensorBoard's own EventAccumulator."""

from __future__ import annotations

import logging
import math
import sys
from pathlib import Path
from typing import Any

import pytest

from trainguard.sinks import TensorBoardSink

from .conftest import run_steps, tiny_run
from .test_conformance import Recorder

EventAccumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator",
    reason="needs the tensorboard extra").EventAccumulator

PARAMS = ["body.0.weight", "body.0.bias", "body.2.weight", "body.2.bias"]
NAN_AT = 5
STEPS = 10


def _read(log_dir: Path) -> Any:
    accumulator = EventAccumulator(str(log_dir), size_guidance={
        "scalars": 0, "histograms": 0, "tensors": 0})
    accumulator.Reload()
    return accumulator


def _scalars(acc: Any, tag: str) -> dict[int, float]:
    return {event.step: event.value for event in acc.Scalars(tag)}


def _texts(acc: Any, tag: str) -> dict[int, str]:
    return {event.step: event.tensor_proto.string_val[0].decode()
            for event in acc.Tensors(f"{tag}/text_summary")}


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One guarded run of 10 steps with a NaN loss at step 5, written and read back."""
    log_dir = tmp_path_factory.mktemp("tb") / "run"
    run = tiny_run([TensorBoardSink(log_dir)])
    run_steps(run, STEPS, nan_at=NAN_AT)
    run.guard.observe_eval({"accuracy": 0.5, "eval_loss": math.nan})
    run.guard.close()
    return {"acc": _read(log_dir), "reports": run.reports}


def test_a_nan_step_shows_as_counts_not_a_gap(written: dict[str, Any]) -> None:
    acc = written["acc"]
    assert written["reports"][NAN_AT].action == "skipped"
    for tag in ("nonfinite/loss", "nonfinite/grad_norm"):
        counts = _scalars(acc, tag)
        assert sorted(counts) == list(range(STEPS)), tag  # a point at every step
        assert counts[NAN_AT] == 1 and sum(counts.values()) == 1, tag
    grads = _scalars(acc, "nonfinite/grads")
    assert grads[NAN_AT] == len(PARAMS) and sum(grads.values()) == len(PARAMS)
    # the non-finite values themselves are not points (TensorBoard would drop them silently)
    assert NAN_AT not in _scalars(acc, "loss") and len(_scalars(acc, "loss")) == STEPS - 1
    assert NAN_AT not in _scalars(acc, "grad_norm")
    assert _scalars(acc, "skipped")[NAN_AT] == 1


def test_step_scalars_and_per_layer_tags(written: dict[str, Any]) -> None:
    acc = written["acc"]
    reports = written["reports"]
    tags = set(acc.Tags()["scalars"])
    assert {"loss", "loss_curvature", "lr", "grad_norm", "clip_coef"} <= tags
    assert _scalars(acc, "loss")[0] == pytest.approx(reports[0].loss)
    assert _scalars(acc, "lr")[0] == pytest.approx(reports[0].lr)
    curvature = _scalars(acc, "loss_curvature")
    assert curvature and all(reports[s].loss_curvature == pytest.approx(v)
                             for s, v in curvature.items())
    for name in PARAMS:
        norms = _scalars(acc, f"grad_norm/{name}")
        assert sorted(norms) == [s for s in range(STEPS) if s != NAN_AT], name
        assert norms[0] == pytest.approx(float(reports[0].signals.param_grad_norm[
            PARAMS.index(name)]), rel=1e-6)
    sampled = {r.step for r in reports if r.sampled}  # the last arrives at close
    assert len(sampled) >= 3
    for name in PARAMS:
        assert set(_scalars(acc, f"update_ratio/{name}")) == sampled, name
    zero_frac = _scalars(acc, "act_zero_frac/body.1")  # the ReLU
    assert zero_frac and all(0 <= v <= 1 for v in zero_frac.values())
    assert "eval/accuracy" in tags and "eval/eval_loss" not in tags
    assert list(_scalars(acc, "nonfinite/eval").values()) == [1]


def test_histograms_only_on_sampled_steps(written: dict[str, Any]) -> None:
    acc = written["acc"]
    reports = written["reports"]
    sampled_steps = {r.step for r in reports if r.sampled}
    histogram_steps = {event.step for event in acc.Histograms("histograms/grad_norm")}
    assert histogram_steps and histogram_steps == sampled_steps - {NAN_AT}
    assert len(histogram_steps) < STEPS
    assert acc.Histograms("histograms/weight_std")


def test_events_and_the_end_are_text(written: dict[str, Any]) -> None:
    acc = written["acc"]
    events = _texts(acc, "events")
    assert "`nonfinite_loss`" in events[NAN_AT] and "**error**" in events[NAN_AT]
    assert "finished" in next(iter(_texts(acc, "status").values()))
    assert '"policy": "protect"' in _texts(acc, "config")[0]
    actions = _texts(acc, "actions")
    assert any("skip" in text for text in actions.values())


def test_layer_every_thins_the_per_layer_tags_only(tmp_path: Path) -> None:
    run = tiny_run([TensorBoardSink(tmp_path / "tb", layer_every=4)])
    run_steps(run, STEPS, nan_at=NAN_AT)
    run.guard.close()
    acc = _read(tmp_path / "tb")
    sampled = {r.step for r in run.reports if r.sampled}
    expected = ({s for s in range(STEPS) if s % 4 == 0} | sampled) - {NAN_AT}
    assert set(_scalars(acc, "grad_norm/body.0.weight")) == expected
    assert set(_scalars(acc, "nonfinite/grads")) == set(range(STEPS))
    assert _scalars(acc, "nonfinite/grads")[NAN_AT] == len(PARAMS)


def test_an_unwritable_directory_is_one_warning_and_training_goes_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    sink = TensorBoardSink(blocker / "tb")
    recorder = Recorder()
    with caplog.at_level(logging.WARNING, logger="trainguard"):
        run = tiny_run([sink, recorder])
        run_steps(run, 4, nan_at=2)
        run.guard.close()
    warnings = [r for r in caplog.records if "TensorBoard" in r.getMessage()]
    assert len(warnings) == 1 and str(blocker / "tb") in warnings[0].getMessage()
    assert sink.failed is not None and sink.writer is None
    assert recorder.names().count("on_step") == 4
    assert [r.action for r in run.reports][2] == "skipped"


def test_a_writer_that_fails_mid_run_is_disabled_by_the_sink_set(tmp_path: Path) -> None:
    sink = TensorBoardSink(tmp_path / "tb")
    recorder = Recorder()
    run = tiny_run([sink, recorder])
    run.step()

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    sink.writer._get_file_writer().add_summary = broken
    run_steps(run, 3)
    run.guard.close()
    assert "TensorBoardSink" in run.guard.run.sinks.failures
    assert recorder.names().count("on_step") == 4


def test_without_tensorboard_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    with pytest.raises(ImportError, match=r"trainguard\[tensorboard\]"):
        TensorBoardSink(tmp_path / "tb")
