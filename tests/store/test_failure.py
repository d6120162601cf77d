"""A store that fails mid-run: reported once, records dropped and counted, training untouched,
and `show` says so."""

from __future__ import annotations

import logging
from pathlib import Path

from trainguard import RunReader
from trainguard.cli import main
from trainguard.store import RunStore, RunStoreSink

from .helpers import run_info, step_report


def test_a_writer_that_fails_mid_run(tmp_path: Path, monkeypatch, caplog, capsys) -> None:
    sink = RunStoreSink(tmp_path)
    sink.on_run_start(run_info(tmp_path))
    for step in range(5):
        sink.on_step(step_report(step))
    sink.store.flush()

    def no_space(self: RunStore, batch: list[tuple]) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(RunStore, "_write", no_space)
    with caplog.at_level(logging.ERROR, logger="trainguard"):
        for step in range(5, 25):
            sink.on_step(step_report(step))  # never raises
            if step == 5:
                sink.store.flush()
        dropped_before_close = sink.store.dropped
        sink.on_run_end("finished")
        sink.close()
    assert sink.store.failed == "OSError: [Errno 28] No space left on device"
    assert dropped_before_close >= 20 - 1, "every record after the failure is counted"
    assert sink.store.dropped == dropped_before_close + 1, "the status update is counted too"
    reports = [r for r in caplog.records if "stopped writing" in r.getMessage()]
    assert len(reports) == 1, "reported once"
    assert str(tmp_path) in reports[0].getMessage()

    with RunReader(tmp_path) as reader:
        summary = reader.summary()
    assert summary["steps"] == 5
    assert summary["store_failed"] == sink.store.failed and summary["failed_step"] == 5
    assert summary["dropped"] == sink.store.dropped
    assert main(["show", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert (f"store      stopped writing at step 5: OSError: [Errno 28] No space left on "
            f"device; {sink.store.dropped} records dropped") in out
    assert main(["runs", str(tmp_path)]) == 0
    assert f"store stopped writing, {sink.store.dropped} dropped" in capsys.readouterr().out
