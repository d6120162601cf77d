"""`trainguard analyze` from the command line: summaries, JSON, tables, reports, exit codes, and
no torch import on the way."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .logs import trainer_state

CLI = [sys.executable, "-m", "trainguard", "analyze"]


def analyze(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, timeout=120)


@pytest.fixture
def healthy(tmp_path: Path) -> Path:
    return trainer_state(tmp_path / "healthy.json")


@pytest.fixture
def diverged(tmp_path: Path) -> Path:
    return trainer_state(tmp_path / "diverged.json", blow_up_at=300)


def test_a_healthy_log_says_so(healthy: Path) -> None:
    done = analyze(healthy)
    assert done.returncode == 0, done.stderr
    assert "verdict    healthy" in done.stdout
    assert done.stderr == ""


def test_a_diverged_log_names_its_onset_and_causes(diverged: Path) -> None:
    done = analyze(diverged, "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert {"verdict", "kind", "onset_step", "evidence", "causes"} <= set(result)
    assert result["verdict"] == "degraded"
    assert result["onset_step"] == 300
    assert result["evidence"] and result["causes"]
    assert all({"code", "confidence", "fix"} <= set(c) for c in result["causes"])


def test_the_summary_draws_the_curve(diverged: Path) -> None:
    done = analyze(diverged)
    assert done.returncode == 0, done.stderr
    assert "DEGRADED" in done.stdout and "from step 300" in done.stdout
    assert any(ch in done.stdout for ch in "▁▂▃▄▅▆▇█"), "a sparkline of the loss"


def test_several_paths_give_a_table(healthy: Path, diverged: Path) -> None:
    done = analyze(healthy, diverged)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[:3] == ["path", "format", "rows"]
    assert any("healthy.json" in line and "healthy" in line.split()[3:] for line in lines)
    assert any("diverged.json" in line and "degraded" in line for line in lines)


def test_several_paths_as_json_give_a_list(healthy: Path, diverged: Path) -> None:
    done = analyze(healthy, diverged, "--json")
    assert [r["verdict"] for r in json.loads(done.stdout)] == ["healthy", "degraded"]


def test_a_truncated_file_is_one_clear_error(tmp_path: Path, healthy: Path) -> None:
    cut = tmp_path / "trainer_state.json"
    cut.write_text(healthy.read_text()[:500])
    done = analyze(cut)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert str(cut) in done.stderr and "truncated" in done.stderr


def test_a_bad_file_among_good_ones_is_listed_and_fails_the_command(tmp_path: Path,
                                                                    healthy: Path) -> None:
    empty = tmp_path / "empty.log"
    empty.write_text("nothing a trainer prints\n")
    done = analyze(healthy, empty)
    assert done.returncode == 2
    assert "healthy.json" in done.stdout
    assert str(empty) in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("args", [["missing.json"], ["--format", "nope", "x.json"],
                                  ["--num-classes", "0", "x.json"]])
def test_bad_arguments_exit_2(tmp_path: Path, args: list[str]) -> None:
    done = subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and done.stderr.strip()


def test_a_forced_format_that_does_not_fit_is_an_error(healthy: Path) -> None:
    done = analyze(healthy, "--format", "lightning")
    assert done.returncode == 2
    assert str(healthy) in done.stderr and "Traceback" not in done.stderr


def test_the_report_of_a_log(tmp_path: Path, diverged: Path) -> None:
    out = tmp_path / "report.html"
    done = analyze(diverged, "--report", out)
    assert done.returncode == 0, done.stderr
    html = out.read_text()
    assert "<script src=" not in html, "self-contained"
    assert "diverged.json" in html and "Likely causes" in html
    assert "DEGRADED" in html.upper() and "grad_explosion" in html


def test_the_report_takes_one_path_and_never_overwrites_the_log(healthy: Path,
                                                                diverged: Path) -> None:
    before = healthy.read_text()
    assert analyze(healthy, diverged, "--report", "x.html").returncode == 2
    done = analyze(healthy, "--report", healthy)
    assert done.returncode == 2 and "log being analysed" in done.stderr
    assert healthy.read_text() == before


def test_analyze_never_imports_torch(diverged: Path) -> None:
    code = ("import sys; sys.modules['torch'] = None\n"
            "from trainguard.cli import main\n"
            f"sys.exit(main(['analyze', {str(diverged)!r}, '--json']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["verdict"] == "degraded"


def test_help_documents_the_exit_codes() -> None:
    done = subprocess.run([*CLI, "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "exit codes" in done.stdout


BIG = 2 ** 70
STEP_LOGS = {
    "jsonl": ("log.jsonl", "".join(f'{{"step": {BIG + i}, "loss": {2 - i / 100}}}\n'
                                   for i in range(30)), f"step {BIG} is beyond"),
    "csv": ("metrics.csv", "step,train_loss\n" + "".join(f"{BIG + i},{2 - i / 100}\n"
                                                         for i in range(30)),
            f"step {BIG} is beyond"),
    "text": ("train.log", "".join(f"step {BIG + i} loss {2 - i / 100}\n" for i in range(30)),
             f"step {BIG} is beyond"),
    "text, one line": ("one.log", "".join(f"step {BIG if i == 20 else i} loss {2 - i / 100}\n"
                                          for i in range(30)), f"step {BIG} is beyond"),
    "trainer lines": ("hf.log", "".join(f"{{'loss': {2 - i / 100}, 'step': {BIG + i}}}\n"
                                        for i in range(30)), f"step {BIG} is beyond"),
    "iteration": ("it.log", "".join(f"iter {BIG + i}: loss {2 - i / 100}\n" for i in range(30)),
                  f"{BIG} is beyond"),  # nanoGPT's grammar
    "text inf": ("inf.log", "step 1 loss 2.0\nstep inf loss 1.9\nstep 3 loss 1.8\n",
                 "step inf is beyond"),
    "text nan": ("nan.log", "step 1 loss 2.0\nstep nan loss 1.9\nstep 3 loss 1.8\n",
                 "step nan is not a step number"),
}


@pytest.mark.parametrize("case", sorted(STEP_LOGS))
@pytest.mark.parametrize("extra", [[], ["--json"], ["--report"]])
def test_a_step_beyond_64_bits_is_one_line_and_no_report(tmp_path: Path, case: str,
                                                          extra: list[str], capsys) -> None:
    """As text, 2^70 + 1 is the float 2^70: the counter was taken for none and the rows were
    numbered from 1 without a word; it is now the JSONL and CSV readers' one clear error."""
    from trainguard.cli import main

    name, text, message = STEP_LOGS[case]
    log = tmp_path / name
    log.write_text(text)
    report = tmp_path / "report.html"
    args = [*extra, str(report)] if extra == ["--report"] else extra
    code = main(["analyze", str(log), *args])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.startswith("trainguard: error: ") and captured.err.count("\n") == 1
    assert message in captured.err, captured.err
    assert not report.exists()
