"""`python -m benchmarks.promises`: which scenarios each form runs, how the overhead figures are
formed, where the real logs are looked for, and the smoke form's table (its shape, not its
figures)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from benchmarks.promises import (
    REALDATA_ENV,
    Plan,
    added_times,
    detection_subset,
    main,
    realdata_figures,
    realdata_folder,
    recovery_subset,
)
from benchmarks.realdata import SHARED_DATA
from benchmarks.scenarios import all_scenarios
from benchmarks.scenarios.recovery import baseline_of


def test_the_quick_form_runs_the_first_healthy_and_faulty_scenarios_of_every_family() -> None:
    catalogue = all_scenarios()
    chosen = detection_subset(catalogue, Plan("quick", 0, 1))
    families = list(dict.fromkeys(s.family for s in catalogue))
    for family in families:
        mine = [s for s in catalogue if s.family == family]
        expected = {next((s.name for s in mine if s.healthy), None),
                    next((s.name for s in mine if not s.healthy), None)} - {None}
        assert {s.name for s in chosen if s.family == family} == expected, family
    assert {s.family for s in chosen} == set(families)
    assert [s.name for s in chosen] == [s.name for s in catalogue if s in chosen], "in order"
    two = detection_subset(catalogue, Plan("quick", 0, 2))
    assert len(two) > len(chosen) and set(s.name for s in chosen) <= {s.name for s in two}
    assert detection_subset(catalogue, Plan("full", 0, None)) == catalogue


def test_the_quick_form_recovers_the_first_recoverable_fault_of_each_family() -> None:
    catalogue = all_scenarios()
    recoverable = [s for s in catalogue if not s.healthy and s.recoverable]
    chosen = recovery_subset(catalogue, Plan("quick", 0, 1))
    assert {s.family for s in chosen} == {s.family for s in recoverable}
    assert all(s is next(r for r in recoverable if r.family == s.family) for s in chosen)
    assert recovery_subset(catalogue, Plan("full", 0, None)) == recoverable
    for s in chosen:  # each has the healthy baseline it is measured against
        assert baseline_of(s) in {c.name for c in catalogue if c.healthy}


def test_added_times_pair_each_round_with_its_baseline() -> None:
    def results(base: list[float], clip: list[float], guard: list[float]) -> dict[str, dict]:
        return {"baseline": {"ms_per_step_rounds": base},
                "clip_grad_norm_": {"ms_per_step_rounds": clip},
                "guard_default": {"ms_per_step_rounds": guard}}

    # a slow round moves every variant: paired, it changes nothing
    figures = added_times(results([10.0, 20.0, 10.0], [12.0, 22.0, 12.0], [11.0, 21.0, 11.0]))
    assert figures["guard_added_ms"] == 1.0 and figures["clip_added_ms"] == 2.0
    assert figures["guard_over_clip"] == 0.5 and figures["guard_share_of_step"] == 0.1
    nothing = added_times(results([10.0, 10.0, 10.0], [10.0, 9.0, 10.0], [11.0, 11.0, 11.0]))
    assert nothing["guard_over_clip"] is None, "no ratio to a clip that added no time"


def test_the_real_logs_are_found_by_option_then_environment_then_beside_the_repository(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REALDATA_ENV, raising=False)
    repository = Path(__file__).resolve().parents[2]
    assert realdata_folder(None) == SHARED_DATA == repository.parent / "shared" / "realdata"
    monkeypatch.setenv(REALDATA_ENV, str(tmp_path / "env"))
    assert realdata_folder(None) == tmp_path / "env"
    assert realdata_folder(tmp_path / "given") == tmp_path / "given"
    assert realdata_figures(tmp_path / "env") is None


ROWS = ["overhead gpt2: guard/clip added time", "overhead mlp: guard/clip added time",
        "overhead gpt2: guard added time", "false alarms: healthy runs warned",
        "recall: faults detected", "top-1 cause right", "recover/healthy final loss, median",
        "recover/healthy final loss, worst", "recovered within 5%",
        "real logs (shared set), held-out: all right",
        "real logs (own corpus), held-out: all right"]


def test_the_smoke_form_prints_one_table_of_every_figure(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "promises.json"
    assert main(["--smoke", "--realdata", str(tmp_path / "absent"),
                          "--json", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert "smoke" in printed[1] and "seed 0" in printed[1]
    start = next(i for i, line in enumerate(printed) if line.startswith("figure"))
    body = printed[start + 2:start + 2 + len(ROWS)]
    assert [line.split("  ")[0] for line in body] == ROWS
    values = {row: next(p for p in line[len(row):].split("  ") if p.strip()).strip()
              for row, line in zip(ROWS, body, strict=True)}
    count = re.compile(r"^\d+/\d+( \(\d+%\))?$")
    for row in ("false alarms: healthy runs warned", "recall: faults detected",
                "top-1 cause right", "recovered within 5%",
                "real logs (own corpus), held-out: all right"):
        assert count.match(values[row]), (row, values[row])
    assert values["recall: faults detected"].startswith(("0/1", "1/1"))
    assert values["real logs (shared set), held-out: all right"] == "not available"
    assert re.match(r"^-?\d+\.\d+% of a step$", values["overhead gpt2: guard added time"])
    assert "1 of " in body[3] and "1 of " in body[6], "the subset's size is in the table"
    assert printed[start + 2 + len(ROWS) + 1].startswith("wall time ")
    figures = json.loads(out.read_text())
    assert figures["form"] == "smoke" and figures["realdata"] is None
    assert figures["detection"]["healthy"] == figures["detection"]["faulty"] == 1
    assert figures["recovery"]["faults"] == 1 and set(figures["overhead"]) == {"gpt2", "mlp"}
    assert figures["realdata_own"]["cases"] > 0


def test_bad_options_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--per-family", "0"], ["--smoke", "--full"], ["--threads", "-1"],
                 ["--overhead-budget", "0"]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
    assert "error" in capsys.readouterr().err
