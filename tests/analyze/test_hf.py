"""The trainer_state.json reader reads a piece at a time: whatever the pieces, it reads what
`json.loads` of the whole file reads, and fails where it fails, at the same line and column."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from trainguard.analyze import hf
from trainguard.analyze.log import LogError

HISTORY = [
    {"epoch": 0.1, "grad_norm": 1.25, "learning_rate": 8e-05, "loss": 2.5, "step": 10},
    {"epoch": 0.2, "eval_loss": 2.25, "step": 10},
    {"epoch": 0.3, "grad_norm": math.nan, "learning_rate": 6.0000000001e-05, "loss": 2.0,
     "step": 20, "nested": {"a": [1, 2, {"b": "x\"y"}]}},
    {"epoch": 0.4, "grad_norm": math.inf, "learning_rate": 4e-05, "loss": 123456789.125,
     "step": 30},
]
STATE = {"best_metric": None, "epoch": 0.4, "global_step": 30, "log_history": HISTORY,
         "max_steps": 1234567, "trial_params": {"lr": [1e-5, 2e-5]}}


def _read(path: Path, piece: int, monkeypatch: pytest.MonkeyPatch) -> tuple:
    monkeypatch.setattr(hf, "_PIECE", piece)
    try:
        log = hf.read(path)
    except LogError as exc:
        return ("error", str(exc))
    return (log.steps, {name: log.values(name) for name in log.series}, log.evals)


@pytest.mark.parametrize("indent", [None, 2])
def test_any_piece_size_reads_what_one_piece_reads(tmp_path: Path, indent: int | None,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "trainer_state.json"
    path.write_text("\ufeff" + json.dumps(STATE, indent=indent))
    whole = _read(path, 1 << 20, monkeypatch)
    assert whole[0] == [10, 20, 30] and math.isnan(whole[1]["grad_norm"][1])
    for piece in (1, 2, 3, 7, 64):
        assert repr(_read(path, piece, monkeypatch)) == repr(whole), piece


def _loads_error(text: str) -> tuple[int, int]:
    with pytest.raises(json.JSONDecodeError) as info:
        json.loads(text)
    return info.value.lineno, info.value.colno


@pytest.mark.parametrize("damage", [("2.0,", "2..0,"), ('"step": 30', '"step" 30'),
                                    ("null", "nul l"), ('"epoch": 0.4,', '"epoch": 0.4,,')])
def test_damage_is_placed_where_json_places_it(tmp_path: Path, damage: tuple[str, str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    text = json.dumps(STATE, indent=2)
    text = text[::-1].replace(damage[0][::-1], damage[1][::-1], 1)[::-1]  # the last one
    path = tmp_path / "trainer_state.json"
    path.write_text(text)
    line, column = _loads_error(text)
    for piece in (5, 1 << 20):
        kind, message = _read(path, piece, monkeypatch)
        assert kind == "error" and f"at line {line}, column {column}): the file is damaged" \
            in message, (piece, message)


def test_a_cut_at_any_point_is_truncated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = json.dumps({"log_history": HISTORY[:2], "global_step": 30})
    path = tmp_path / "trainer_state.json"
    for cut in range(1, len(text) - 1, 3):
        path.write_text(text[:cut])
        kind, message = _read(path, 4, monkeypatch)
        assert kind == "error" and "truncated" in message, (text[:cut], message)


def test_a_second_log_history_is_the_one_read(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "trainer_state.json"
    path.write_text('{"log_history": [{"step": 1, "loss": 1.0}], '
                    '"log_history": [{"step": 5, "loss": 3.0}]}')
    assert json.loads(path.read_text())["log_history"][0]["step"] == 5
    assert _read(path, 3, monkeypatch)[0] == [5]


def _long_history(entries: int) -> list[dict]:
    """Entries enough for the reader to parse many at once, with what could mislead a cut at
    `},`: strings holding it, a nested object closing before an entry's last key."""
    history = []
    for i in range(entries):
        entry: dict = {"epoch": i / 100, "grad_norm": 1.0 + i % 7, "learning_rate": 1e-5,
                       "loss": 2.0 - i / entries, "step": 10 * (i + 1)}
        if i % 97 == 0:
            entry["note"] = 'ends with "},", and },{ too'
        if i % 89 == 0:
            entry = {"inner": {"a": 1}, **entry}  # `},` inside the entry
        if i % 101 == 0:
            entry["grad_norm"] = math.nan if i % 2 else math.inf
        if i % 500 == 0:
            history.append({"eval_loss": 1.5, "epoch": i / 100, "step": 10 * (i + 1)})
        history.append(entry)
    return history


@pytest.mark.parametrize("indent", [None, 2])
@pytest.mark.parametrize("piece", [5000, 1 << 20])
def test_entries_parsed_at_once_are_those_parsed_one_by_one(
        tmp_path: Path, indent: int | None, piece: int, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"global_step": 1, "log_history": _long_history(3000)},
                               indent=indent))
    at_once = _read(path, piece, monkeypatch)
    monkeypatch.setattr(hf, "_BATCH", 1 << 40)  # never at once
    one_by_one = _read(path, piece, monkeypatch)
    assert len(at_once[0]) == 3000
    assert repr(at_once) == repr(one_by_one)


@pytest.mark.parametrize("at", [0.3, 0.97])
def test_damage_among_many_entries_is_placed_where_json_places_it(
        tmp_path: Path, at: float, monkeypatch: pytest.MonkeyPatch) -> None:
    text = json.dumps({"log_history": _long_history(3000)}, indent=2)
    cut = text.index('"loss"', int(len(text) * at))
    text = text[:cut] + '"loss" 1.0, ' + text[cut:]
    path = tmp_path / "trainer_state.json"
    path.write_text(text)
    line, column = _loads_error(text)
    kind, message = _read(path, 1 << 20, monkeypatch)
    assert kind == "error" and f"at line {line}, column {column}): the file is damaged" \
        in message, message
