"""One JSON object of a run's values by metric or by step (`analyze/json_series.py`): the
reference runs training frameworks commit (Megatron-LM's golden values, FlagScale's gold
results, Megatron-Bridge's golden values)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from trainguard.analyze import analyze, read_log
from trainguard.analyze.log import LogError


def _golden(losses: list[float | str], start: int = 1, interval: int = 1) -> dict:
    steps = [start + i * interval for i in range(len(losses))]

    def series(values: list) -> dict:
        return {"start_step": start, "end_step": steps[-1], "step_interval": interval,
                "values": {str(s): v for s, v in zip(steps, values, strict=True)}}

    return {"lm loss": series(losses), "num-zeros": series([0] * len(losses)),
            "mem-allocated-bytes": series([2.1e10] * len(losses)),
            "iteration-time": series([1.2] * len(losses))}


def test_golden_values_by_metric_with_their_steps(tmp_path: Path) -> None:
    path = tmp_path / "golden_values_dev_dgx_h100.json"
    losses: list[float | str] = [11.0 - 0.05 * i for i in range(31)] + ["nan"] * 19
    path.write_text(json.dumps(_golden(losses, start=1, interval=5), indent=4))
    log = read_log(path)
    assert log.format == "json-series" and log.steps[:3] == [1, 6, 11] and len(log.steps) == 50
    assert set(log.series) == {"loss"}  # the clocks and memory counters are bookkeeping
    assert log.values("loss")[0] == 11.0 and math.isnan(log.series["loss"][31])  # kept a NaN
    result = analyze(path)
    assert result.verdict == "degraded" and result.kind == "nan" and result.onset_step == 156


def test_a_list_of_values_is_numbered_from_one_and_a_trailing_colon_dropped(
        tmp_path: Path) -> None:
    path = tmp_path / "tp2_pp2_ep2.json"
    values = [12.3, 12.3, 11.5, 11.0, 10.8, 10.6, 10.5, 10.3, 10.2, 10.0]
    path.write_text(json.dumps({"lm loss:": {"values": values}}))
    log = read_log(path)
    assert log.steps == list(range(1, 11)) and log.values("loss") == values
    assert "numbered from 1" in log.notes[0]
    assert analyze(path).verdict == "healthy"


def test_records_by_step_with_the_run_totals_left_out(tmp_path: Path) -> None:
    path = tmp_path / "test_recipes_pretrain.json"
    data: dict[str, object] = {str(i): {"lm loss": 11.9 - 0.07 * i, "GPU utilization": 270.0,
                                        "elapsed time per iteration (ms)": 230.0}
                               for i in range(40)}
    data["max_alloc"] = 7.9e10
    path.write_text(json.dumps(data, indent=4))
    log = read_log(path)
    assert log.format == "json-series" and log.steps == list(range(40))
    assert set(log.series) == {"loss"} and math.isclose(log.values("loss")[39], 11.9 - 0.07 * 39)


def test_a_json_object_of_neither_shape_is_left_to_the_trainer_state_reader(
        tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model": {"n_layer": 2}, "lr": 0.001}))
    with pytest.raises(LogError, match="log_history"):
        read_log(path)


def test_keys_that_are_no_step_number_are_left_out(tmp_path: Path) -> None:
    path = tmp_path / "golden.json"
    data: dict[str, object] = {str(i): {"lm loss": 2.0 - 0.1 * i} for i in range(8)}
    data["\u00b2"] = {"lm loss": 0.7}  # a superscript digit: no step
    data["9" * 5000] = {"lm loss": 0.7}  # longer than any step
    path.write_text(json.dumps(data))
    log = read_log(path)
    assert log.steps == list(range(8))


def test_a_step_written_twice_with_a_value_as_text_is_read(tmp_path: Path) -> None:
    path = tmp_path / "golden.json"  # "1" and " 1": one step; "nan" a value as text
    path.write_text('{"lm loss": {"values": {"1": 2.0, " 1": "nan", "2": 1.9, "3": 1.8}}}')
    assert read_log(path).steps == [1, 2, 3]
