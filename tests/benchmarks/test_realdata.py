"""`benchmarks/realdata.py`: a log the analysis fails on is scored as a wrong case; the help
says what the script does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmarks.realdata import Case, Label, main, score, totals

# A GRPO fine-tune's Trainer log: its loss starts at exactly 0 (the KL term at the reference
# policy) and grows a little, as such runs do. The analysis has failed on this shape.
GRPO_LOSSES = [0.0, 0.0, 0.0, 0.0, 0.0001, 0.0001, 0.0003, 0.0002, 0.0004, 0.0003, 0.0005, 0.0006,
               0.0027, 0.0004, 0.001, 0.0009, 0.0008, 0.0006, 0.0007, 0.0006, 0.0004, 0.0006,
               0.0009, 0.0005, 0.0008]


def test_a_log_the_analysis_fails_on_is_a_wrong_case_not_the_end_of_the_scoring(
        tmp_path: Path) -> None:
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"global_step": 10 * len(GRPO_LOSSES), "log_history": [
        {"loss": loss, "step": 10 * (i + 1), "learning_rate": 1e-5}
        for i, loss in enumerate(GRPO_LOSSES)]}))
    label = Label("ts_grpo_healthy", "healthy", None, "none")
    scored = score(label, path)  # must not raise, whatever the analysis does
    if scored.verdict == "crashed":
        assert not scored.verdict_ok and scored.onset and ":" in scored.onset  # names the error
    else:
        assert scored.verdict_ok == (scored.verdict == "healthy")
    counted = totals([Case(label, [scored])])
    assert counted["crashed"] == (scored.verdict == "crashed")
    assert counted["read"] == (scored.verdict not in ("unreadable", "crashed"))


def test_the_help_describes_the_script_in_whole_sentences(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    described = " ".join(capsys.readouterr().out.split("options:")[0].split("[--json]")[1].split())
    assert described == ("Score `trainguard analyze` on hand-labelled real logs: the shared "
                         "evaluation set and this repository's own corpus (benchmarks/realdata).")


def test_an_onset_named_by_its_boosting_round_or_none_with_a_note_is_read(tmp_path: Path) -> None:
    path = tmp_path / "xgboost.txt"
    path.write_text("".join(f"[{r}]\ttrain-logloss:{v}\teval-logloss:{v}\n"
                            for r, v in [(160, "0.045664"), (170, "0.044242"), (180, "nan"),
                                         (190, "nan")]))
    broken = score(Label("issue_cv_nan", "degraded", "nan", "round 180 (nan from here)"), path)
    assert broken.verdict == "degraded" and broken.onset_ok
    assert not score(Label("issue_cv_nan", "degraded", "nan", "round 170"), path).onset_ok
    healthy = tmp_path / "fine.txt"
    healthy.write_text("".join(f"step {s}: loss {2.0 - s / 100:.3f}\n" for s in range(1, 60)))
    noted = score(Label("issue_fine", "healthy", None, "none (a steady fall)"), healthy)
    assert noted.verdict == "healthy" and noted.onset_ok


def test_an_onset_named_by_the_logs_own_counter_is_read(tmp_path: Path) -> None:
    # MLPerf numbers its rows by samples counted, or by `epoch_num`, which a label may call epoch
    def event(value: str, counter: str, at: int) -> str:
        return (f':::MLLOG {{"key": "eval_accuracy", "value": {value}, '
                f'"metadata": {{"{counter}": {at}}}}}\n')

    frozen = tmp_path / "sd.txt"
    frozen.write_text("".join(event("646.0821975894278", "samples_count", 511488 * k)
                              for k in range(1, 6)))
    first = "first evaluation, samples_count 511488"
    assert score(Label("file_sd", "stalled", None, first), frozen).onset_ok
    assert not score(Label("file_sd", "stalled", None, "samples_count 1022976"), frozen).onset_ok
    fallen = tmp_path / "maskrcnn.txt"
    fallen.write_text("".join(event(v, "epoch_num", k) for k, v in
                              enumerate(["0.1", "0.2", "0.21", "0.0001", "0.0001"], start=1)))
    assert score(Label("file_mrcnn", "degraded", "explosion", "epoch 4 (mAP 0.0001)"),
                 fallen).onset_ok
