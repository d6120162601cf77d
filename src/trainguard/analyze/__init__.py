"""`trainguard analyze`: judge a training run after the fact, from its log.

    from trainguard.analyze import analyze
    result = analyze("output/trainer_state.json")
    result.verdict, result.kind, result.onset_step   # 'degraded', 'nan', 3010
    result.evidence, result.causes

Any of the formats in `FORMATS` (detected, or named with `fmt=`): a Hugging Face
trainer_state.json, a Lightning metrics.csv, TensorBoard event files or run directories, a
trainguard run directory, a W&B run directory, an MLflow run, JSON Lines, and text logs
(Megatron, word_language_model, nanoGPT, mlx-lm, a generic `key value` pattern). The live
detectors run over the logged rows with their windows counted in rows (`sparse.py`); `judge.py`
reads their events into a verdict, a kind and an onset; the cause ranking of live runs names the
likely causes from what the log holds.

    log.py         the Log a reader makes: rows, series, evaluations, notes
    hf.py, lightning.py, tensorboard.py, store.py, jsonl.py, text.py    one reader per format
    wandb_run.py, mlflow_run.py    the stores of W&B and MLflow, one run of them
    formats.py     which reader reads a path
    quirks.py      what logged values mean (HF's NaN-filtered windows, skipped steps)
    sparse.py      the detectors' thresholds for a log's rows
    offline.py     the detectors, row by row
    chance.py      the loss against chance level, ln(num_classes)
    judge.py       verdict, kind, onset
    findings.py    the LR schedule, gradient norms and skipped steps as clues for the causes
    analysis.py    analyze(): all of the above
    summary.py     what the command line prints

Importing this package is cheap (no torch, no NumPy); the names below load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainguard.analyze.format_names import FORMATS
from trainguard.lazy import lazy_exports

if TYPE_CHECKING:
    from trainguard.analyze.analysis import Analysis, analyze, analyze_log
    from trainguard.analyze.formats import read_log
    from trainguard.analyze.log import Log, LogError


_LAZY = {"Analysis": "trainguard.analyze.analysis", "analyze": "trainguard.analyze.analysis",
         "analyze_log": "trainguard.analyze.analysis", "read_log": "trainguard.analyze.formats",
         "Log": "trainguard.analyze.log", "LogError": "trainguard.analyze.log"}

__all__ = ["FORMATS", "Analysis", "Log", "LogError", "analyze", "analyze_log", "read_log"]


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, globals())
