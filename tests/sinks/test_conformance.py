"""Contract tests over every sink: each hears the whole run in order, NaN values included,
without a host transfer of its own; a sink that fails is disabled and training goes on.

The sinks are found by importing every module of trainguard: a new sink is under these checks
without being listed, and the test fails until `FACTORIES` knows how to build it."""

from __future__ import annotations

import importlib
import inspect
import io
import math
import pkgutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import trainguard
from trainguard import Guard, GuardConfig, TrainingDiverged
from trainguard.demo.run import ProgressSink
from trainguard.events import ActionRecord, Event, RunError, RunInfo, StepReport
from trainguard.sinks import (
    ConsoleSink,
    MlflowSink,
    PrometheusSink,
    Sink,
    TensorBoardSink,
    WandbSink,
)
from trainguard.sinks.base import SINK_METHODS
from trainguard.store import RunReader, RunStoreSink
from trainguard.transfer import transfer_count

from ..conftest import make_setup

QUIET = {"sinks": {"console": False}}


class Recorder(Sink):
    """Remembers every call, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def on_run_start(self, run: RunInfo) -> None:
        self.calls.append(("on_run_start", run))

    def on_findings(self, findings: list) -> None:
        self.calls.append(("on_findings", list(findings)))

    def on_event(self, event: Event) -> None:
        self.calls.append(("on_event", event))

    def on_action(self, action: ActionRecord) -> None:
        self.calls.append(("on_action", action))

    def on_diagnosis(self, causes: list) -> None:
        self.calls.append(("on_diagnosis", causes))

    def on_step(self, report: StepReport) -> None:
        self.calls.append(("on_step", report))

    def on_sampled(self, stats: list) -> None:
        self.calls.append(("on_sampled", stats))

    def on_run_end(self, status: str) -> None:
        self.calls.append(("on_run_end", status))

    def close(self) -> None:
        self.calls.append(("close", None))

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


def _halting_run(sinks: list[Sink], run_dir: Path | None = None) -> None:
    """A few healthy steps, a NaN step, then an inf loss that halts the run."""
    setup = make_setup(lr=0.5, warmup=0)  # far too high without warmup: a preflight finding
    guard = Guard(setup.model, setup.optimizer, config=GuardConfig(policy="halt", **QUIET),
                  sinks=sinks, run_dir=run_dir)
    with pytest.raises(TrainingDiverged):
        for step in range(10):
            loss = setup.model.loss(setup.batch())
            if step == 6:
                loss = loss * math.inf
            loss.backward()
            guard.step(loss, batch=setup.batch())
            setup.optimizer.zero_grad(set_to_none=True)


def test_a_sink_hears_the_whole_run_in_order(tmp_path: Path) -> None:
    recorder = Recorder()
    _halting_run([recorder], tmp_path / "run")
    names = recorder.names()
    assert names[0] == "on_run_start" and names[-2:] == ["on_run_end", "close"]
    assert recorder.calls[-2] == ("on_run_end", "halted")
    assert names.index("on_findings") < names.index("on_step")
    assert names.count("on_step") == 7  # steps 0-6, the halted one included
    halt = [a for n, a in recorder.calls if n == "on_action" and a.kind == "halt"]
    assert len(halt) == 1 and halt[0].step == 6
    assert any(n == "on_action" and a.kind == "snapshot" for n, a in recorder.calls)
    assert "on_diagnosis" in names
    start = recorder.calls[0][1]
    assert start.config["policy"] == "halt" and start.param_names
    steps = [r for n, r in recorder.calls if n == "on_step"]
    assert steps[-1].action == "halted" and math.isinf(steps[-1].loss)
    assert steps[-1].signals is not None  # per-parameter norms travel with the report


def test_a_failing_sink_is_disabled_and_training_goes_on(caplog) -> None:
    class Broken(Sink):
        def on_step(self, report: StepReport) -> None:
            raise OSError("disk full")

    recorder = Recorder()
    setup = make_setup()
    guard = Guard(setup.model, setup.optimizer, config=GuardConfig(**QUIET),
                  sinks=[Broken(), recorder])
    for _ in range(3):
        loss = setup.model.loss(setup.batch())
        loss.backward()
        assert guard.step(loss).action in ("applied", "clipped")
        setup.optimizer.zero_grad(set_to_none=True)
    guard.close()
    assert "Broken" in guard.run.sinks.failures
    assert recorder.names().count("on_step") == 3
    assert "disabled" in caplog.text


def _tensorboard(tmp: Path) -> TensorBoardSink:
    pytest.importorskip("tensorboard", reason="needs the tensorboard extra")
    return TensorBoardSink(tmp / "tb")


def _prometheus(tmp: Path) -> PrometheusSink:
    pytest.importorskip("prometheus_client", reason="needs the prometheus extra")
    return PrometheusSink(port=0, linger_s=0)


_FIXTURES: list[pytest.FixtureRequest] = []
"""The running test's request, for factories that need a fixture (a tracker's store)."""


@pytest.fixture(autouse=True)
def _fixtures_for_factories(request: pytest.FixtureRequest) -> Iterator[None]:
    _FIXTURES.append(request)
    yield
    _FIXTURES.pop()


def _wandb(tmp: Path) -> Sink:
    """A real offline W&B run (finished by the `wandb_offline` fixture after the test)."""
    pytest.importorskip("wandb", reason="needs the wandb extra")
    import wandb

    folder = _FIXTURES[-1].getfixturevalue("wandb_offline")
    return WandbSink(wandb.init(mode="offline", dir=str(folder)))


def _mlflow(tmp: Path) -> Sink:
    """A run of the session's local MLflow store."""
    pytest.importorskip("mlflow", reason="needs the mlflow extra")
    import mlflow

    client = mlflow.MlflowClient(_FIXTURES[-1].getfixturevalue("mlflow_uri"))
    experiment = client.get_experiment_by_name("conformance") or client.get_experiment(
        client.create_experiment("conformance", artifact_location=(tmp / "mlflow").as_uri()))
    run = client.create_run(experiment.experiment_id)
    return MlflowSink(run.info.run_id, client=client)


def _subclasses(cls: type) -> set[type]:
    return {sub for direct in cls.__subclasses__() for sub in {direct, *_subclasses(direct)}}


def shipped_sinks() -> list[type[Sink]]:
    """Every Sink subclass trainguard defines, each of its modules imported (one that needs an
    extra that is not installed is passed over: a sink there cannot be built either)."""
    for info in pkgutil.walk_packages(trainguard.__path__, "trainguard."):
        if info.name.rsplit(".", 1)[-1] == "__main__":
            continue
        try:
            importlib.import_module(info.name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and exc.name.split(".")[0] == "trainguard":
                raise
    return sorted((c for c in _subclasses(Sink) if c.__module__.startswith("trainguard.")
                   and not inspect.isabstract(c)),  # a base such as TrackerSink is no sink
                  key=lambda c: f"{c.__module__}.{c.__qualname__}")


FACTORIES: dict[type[Sink], Callable[[Path], Sink]] = {
    ConsoleSink: lambda tmp: ConsoleSink(io.StringIO()),
    RunStoreSink: lambda tmp: RunStoreSink(tmp / "store_run"),
    TensorBoardSink: _tensorboard,
    PrometheusSink: _prometheus,
    ProgressSink: lambda tmp: ProgressSink("demo", 10, io.StringIO()),
    WandbSink: _wandb,
    MlflowSink: _mlflow,
}
"""How to build each sink trainguard ships: a new one fails the checks below until it is here."""
SHIPPED = shipped_sinks()


def test_every_sink_trainguard_ships_is_found_and_can_be_built() -> None:
    assert {ConsoleSink, RunStoreSink, ProgressSink} <= set(SHIPPED)
    unknown = [c.__qualname__ for c in SHIPPED if c not in FACTORIES]
    assert not unknown, f"sinks without a factory in FACTORIES: {unknown}"
    assert set(FACTORIES) <= set(SHIPPED)


def _factory_of(sink_type: type[Sink]) -> Callable[[Path], Sink]:
    """Builds the sink when a test runs: an unknown one fails that test, it is not skipped."""
    def build(tmp: Path) -> Sink:
        if sink_type not in FACTORIES:
            pytest.fail(f"no factory for the sink {sink_type.__qualname__}: add one to FACTORIES")
        return FACTORIES[sink_type](tmp)
    return build


SINKS = pytest.mark.parametrize(
    "make_sink", [*(_factory_of(c) for c in SHIPPED), lambda tmp: Recorder()],
    ids=[*(c.__name__ for c in SHIPPED), "Recorder"])
"""Every sink trainguard ships, found above, and a sink of the user's own."""


@SINKS
def test_every_sink_hears_a_halting_run_without_failing(make_sink, tmp_path: Path) -> None:
    sink = make_sink(tmp_path)
    recorder = Recorder()
    setup = make_setup(lr=0.5, warmup=0)
    guard = Guard(setup.model, setup.optimizer,
                  config=GuardConfig(policy="halt", probes={"sample_every": 2}, **QUIET),
                  sinks=[sink, recorder])
    with pytest.raises(TrainingDiverged):
        for step in range(10):
            loss = setup.model.loss(setup.batch())
            if step == 6:
                loss = loss * math.inf
            loss.backward()
            guard.step(loss, batch=setup.batch())
            setup.optimizer.zero_grad(set_to_none=True)
    assert guard.run.sinks.failures == {}
    assert getattr(sink, "failed", None) is None  # nor failed within (a tracker's courier)
    assert recorder.names()[-2:] == ["on_run_end", "close"]


@SINKS
def test_every_sink_takes_nan_and_makes_no_transfer(make_sink, tmp_path: Path) -> None:
    sink = make_sink(tmp_path)
    for name in SINK_METHODS:
        assert callable(getattr(sink, name)), name
    before = transfer_count()
    info = RunInfo(run_dir=None, config=GuardConfig().to_dict(), param_names=["w"],
                   param_shapes=[[2]], trainguard_version="0")
    sink.on_run_start(info)
    nan_event = Event(kind="nonfinite_loss", step=0, severity="error", message="loss is nan",
                      value=math.nan, details={"likely_causes": [
                          {"code": "numerical_op", "confidence": math.nan}]})
    sink.on_event(nan_event)
    sink.on_action(ActionRecord(kind="skip", step=0, message="skipped"))
    sink.on_step(StepReport(step=0, loss=math.nan, grad_norm=math.inf, action="skipped"))
    sink.on_sampled([])
    sink.on_diagnosis([])
    sink.on_run_error(RunError("RuntimeError", "out of memory"))
    sink.on_run_end("crashed")
    sink.close()
    assert transfer_count() == before
    assert getattr(sink, "failed", None) is None  # NaN and inf taken, not a failure


def test_the_console_is_the_only_printer(tmp_path: Path, capsys) -> None:
    _halting_run([], None)  # console=False
    captured = capsys.readouterr()
    assert "trainguard" not in captured.err and "trainguard" not in captured.out


def test_the_console_tells_events_causes_and_the_halt() -> None:
    stream = io.StringIO()
    _halting_run([ConsoleSink(stream, colour=False)])
    text = stream.getvalue()
    assert "trainguard preflight" in text
    assert "nonfinite_loss" in text and "likely causes:" in text
    assert "training halted at step 6" in text and "trainguard diagnosis:" in text


def test_the_store_sink_records_the_halted_run(tmp_path: Path) -> None:
    _halting_run([], tmp_path / "run")
    with RunReader(tmp_path / "run") as reader:
        summary = reader.summary()
    assert summary["status"] == "halted" and summary["steps"] == 7
    assert summary["snapshot"] and summary["diagnosis"] and summary["loss"]["inf"] == 1


def test_a_raising_sink_leaves_the_other_sinks_recording(tmp_path: Path, caplog) -> None:
    class Broken(Sink):
        def on_event(self, event: Event) -> None:
            raise RuntimeError("bug in a user's sink")

    board, prometheus = _tensorboard(tmp_path), _prometheus(tmp_path)
    setup = make_setup()
    guard = Guard(setup.model, setup.optimizer, config=GuardConfig(**QUIET),
                  sinks=[Broken(), board, prometheus])
    for step in range(5):
        loss = setup.model.loss(setup.batch())
        if step == 2:
            loss = loss * math.nan  # the event that breaks the broken sink
        loss.backward()
        guard.step(loss)
        setup.optimizer.zero_grad(set_to_none=True)
    assert prometheus.registry.get_sample_value("trainguard_steps_total") == 5
    guard.close()
    assert list(guard.run.sinks.failures) == ["Broken"]
    assert [r.getMessage() for r in caplog.records].count(
        "trainguard: sink Broken failed in on_event (RuntimeError: bug in a user's sink) and was "
        "disabled; training goes on") == 1
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(tmp_path / "tb"))
    accumulator.Reload()
    assert [e.step for e in accumulator.Scalars("nonfinite/loss")] == [0, 1, 2, 3, 4]
