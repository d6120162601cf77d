"""An excerpt of logged means (a trainer's interval means, epochs) is judged from its first row;
one of single batches is not."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.analyze import analyze


def _megatron(iteration: int, loss: float, grad: float) -> str:
    return (f" iteration {iteration:8d}/  159576 | consumed samples:      {iteration * 96} | "
            f"elapsed time per iteration (ms): 18706.1 | learning rate: 6.000E-05 | global batch "
            f"size:    96 | lm loss: {loss:.6E} | loss scale: 2048.0 | grad norm: {grad:.3f} | "
            "number of skipped iterations:   0 | number of nan iterations:   0 |\n")


@pytest.mark.parametrize(("text", "verdict"), [
    # three Megatron lines, each the mean of the 10 iterations before it: 6.4 -> 11.4 -> 7.2
    (_megatron(5000, 6.41, 9.8e4) + _megatron(5010, 11.38, 2.2e5) + " [...]\n"
     + _megatron(5220, 7.18, 1.7e4), "degraded"),
    # nanoGPT prints one batch's loss: a mid-run excerpt may begin on its lowest value
    ("iter 5000: loss 2.41, time 101.2ms, mfu 30.1%\n"
     "iter 5010: loss 4.32, time 100.9ms, mfu 30.1%\n"
     "iter 5020: loss 2.69, time 101.0ms, mfu 30.1%\n", "healthy"),
    # an excerpt of epochs from epoch 88 on: one epoch's loss is a level, even the first
    ("".join(f"Epoch {e}/500 | Loss {v:.4f} | Epsilon 0.05 | Win count {e - 70}\n"
             for e, v in [(88, 1830.25), (89, 4.1e15), (90, 6.92), (91, 9.81), (92, 27.4),
                          (93, 26.95)]), "recovered"),
], ids=["megatron means", "nanogpt single batches", "epoch means"])
def test_a_short_excerpt_of_means_is_judged_from_its_first_row(tmp_path: Path, text: str,
                                                                verdict: str) -> None:
    path = tmp_path / "excerpt.txt"
    path.write_text(text)
    result = analyze(path)
    assert result.verdict == verdict
    if verdict == "degraded":
        assert result.onset == "iteration 5010"
    if verdict == "recovered":
        assert result.onset == "epoch 89"


def test_a_nan_of_a_value_no_rule_reads_is_counted_in_the_notes(tmp_path: Path) -> None:
    """Nothing hides a NaN: a value that comes back to a number after it (so no rule calls the
    run broken), under a name no detector reads, is still counted."""
    rows = [f'{{"step": {i}, "loss": {2.0 - 0.01 * i}, "aux_entropy": '
            f'{"NaN" if i in (7, 9) else 0.5}}}' for i in range(20)]
    path = tmp_path / "log.jsonl"
    path.write_text("\n".join(rows) + "\n")
    result = analyze(path)
    assert result.verdict == "healthy"
    assert "aux_entropy: 2 non-finite value(s) of 20, the first at step 7" in result.notes
