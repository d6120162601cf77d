"""The offline replay runs the live detectors: over a trainguard store of a real guarded run it
raises the events the live run raised (those a log can hold), at the same steps."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import trainguard
from tests.detect.synth import event_key
from trainguard import Guard, GuardConfig
from trainguard.analyze import analyze, offline
from trainguard.analyze.log import Log
from trainguard.analyze.quirks import prepare
from trainguard.analyze.sparse import scaled_config
from trainguard.detect import DETECTOR_TYPES, Detector
from trainguard.events import Event
from trainguard.signals import StepSignals

SAMPLED_ONLY = {"nonfinite_weight", "dead_units", "extreme_weight", "nonfinite_optimizer_state",
                "output_collapse", "no_progress"}
"""Event kinds raised from heavy-probe statistics only: a log holds none of them (and the stall,
judged on a live run from its start only)."""
FROM_LOGS_ONLY = {"loss_at_chance", "loss_above_chance", "nonfinite_value"}
"""Judged from a log's loss level (`analyze/chance.py`) or, in a log without a loss, from its
other values (`analyze/lossless.py`), not by a live detector."""


def _faulty_run(run_dir: Path) -> list[Event]:
    """A protected regression whose user raises the LR at step 60 (explosion, then NaN) and feeds
    one NaN batch at step 30: the events the live run raised."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    guard = Guard(model, optimizer, config=GuardConfig(policy="protect", sinks={"console": False},
                                                       probes={"preflight": False}),
                                                       run_dir=run_dir)
    generator = torch.Generator().manual_seed(1)
    for step in range(110):
        if step == 60:
            for group in optimizer.param_groups:
                group["lr"] = 3.0
        x = torch.randn(32, 8, generator=generator)
        if step == 30:
            x[0, 0] = float("nan")
        loss = nn.functional.mse_loss(model(x), x[:, :1] * 2)
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    return list(guard.events)


@pytest.fixture(scope="module")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Event]]:
    run_dir = tmp_path_factory.mktemp("analyze") / "run"
    return run_dir, _faulty_run(run_dir)


def test_the_replayed_events_are_the_live_runs(faulty: tuple[Path, list[Event]]) -> None:
    """Live, a jump is an outlier batch until the next step, where it is told again if it did
    not come back; the replay, which judges with the whole log in view, folds the two into the
    jump itself, at the severity of its size."""
    run_dir, events = faulty
    offline = analyze(run_dir)
    assert offline.format == "store"
    assert any("jump_step" in e.details for e in events)  # the live run told a jump again
    live = [(e.kind, e.step) for e in events if "jump_step" not in e.details]
    expected = sorted((kind, step) for kind, step in live if kind not in SAMPLED_ONLY)
    replayed = sorted((e.kind, e.step) for e in offline.events
                      if e.kind not in FROM_LOGS_ONLY)
    assert {"nonfinite_loss", "nonfinite_grad", "lr_change", "grad_explosion",
            "loss_spike"} <= {kind for kind, _ in expected}, live
    assert replayed == expected


def test_the_stored_events_are_the_live_ones(faulty: tuple[Path, list[Event]]) -> None:
    run_dir, events = faulty
    stored = [(e.kind, e.step) for e in trainguard.RunReader(run_dir).events()]
    assert sorted(stored) == sorted((e.kind, e.step) for e in events)


def test_the_run_is_judged_from_the_incident_it_never_came_back_from(
        faulty: tuple[Path, list[Event]]) -> None:
    """protect skipped the NaN batch of step 30 and the run came back; the LR raised to 3 at step
    60 broke it for good (its loss ends thousands of times higher): that incident decides the
    verdict, its kind and its onset, and the NaN step is told as an earlier, recovered one."""
    run_dir, _ = faulty
    result = analyze(run_dir)
    assert result.verdict == "degraded"
    assert (result.kind, result.onset_step) == ("explosion", 61)
    assert result.judgement is not None
    assert {e.step for e in result.judgement.earlier} == {30}
    assert any("earlier" in line and "step 30" in line for line in result.evidence)
    assert result.causes, "a run in trouble gets ranked causes"


def _synthetic(shape: str, n: int = 4000, every: int = 1, seed: int = 0, *,
               skips: bool = True) -> Log:
    """A log of `n` rows written every `every` steps: a falling loss (with the `shape` given
    to it), a gradient norm, an LR warm-up and a second group, another training loss, a few
    skipped steps (`skips`) and evaluations."""
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    loss = 2.5 * np.exp(-t / (n / 3)) + 0.3
    grad = np.exp(rng.normal(0, 0.1, n))
    lr = 1e-4 * np.minimum(1.0, (t + 1) / 50)
    if shape == "spikes":
        for at in rng.choice(n, 8, replace=False):
            loss[at] *= rng.choice([3.0, 30.0, 1e6])
            grad[at] *= rng.choice([5.0, 50.0, 1e4])
    elif shape == "nan":
        loss[n // 3:n // 3 + 5] = math.nan
        grad[n // 3:n // 3 + 2] = math.nan
        loss[3 * n // 4:] = math.nan
    elif shape == "slow_divergence":
        loss = loss * np.exp(np.maximum(0, t - n // 2) / (n / 8))
    elif shape == "sawtooth":
        loss = 1.0 + 0.8 * (t % 40) / 40
    elif shape == "plateaus":
        loss = np.where(t < n // 3, 2.0, np.where(t < 2 * n // 3, 0.5, 1.5))
        grad[n // 2:n // 2 + 60] = 0.0
        lr[2 * n // 3:] *= 10
    loss = loss * np.exp(rng.normal(0, 0.02, n))
    series: dict[str, list[float | None]] = {
        "loss": [None if i % 211 == 5 else float(v) for i, v in enumerate(loss)],
        "grad_norm": [None if i % 97 == 3 else float(v) for i, v in enumerate(grad)],
        "lr": [float(v) for v in lr],
        "lr_group1": [float(v) * 10 for v in lr],
        "loss_aux": [math.nan if i % 503 == 7 else float(v) / 2 for i, v in enumerate(loss)],
    }
    evals = [(every * s, {"eval_loss": 1.0 + (s % 3)}) for s in range(n // 9, n, n // 9)]
    return Log(path=f"{shape}.jsonl", format="jsonl", steps=[every * (i + 1) for i in range(n)],
               series=series, skipped=[i % 401 == 17 for i in range(n)] if skips else None,
               evals=evals)


SHAPES = ("calm", "spikes", "nan", "slow_divergence", "sawtooth", "plateaus")


@pytest.mark.parametrize("every", [1, 10])
@pytest.mark.parametrize("shape", SHAPES)
def test_the_fast_replay_raises_what_the_row_by_row_replay_raises(shape: str, every: int) -> None:
    """The detectors' fast paths past calm rows change no event: the same events (kind, step,
    severity, message, details), in the same order, as `check` on every row; in a log of every
    step and in one written every 10 (windows of a few rows)."""
    log = prepare(_synthetic(shape, every=every))
    config = scaled_config(len(log), log.interval())
    fast = offline._replay(log, config, num_classes=None, fast=True)
    slow = offline._replay(log, config, num_classes=None, fast=False)
    assert slow.events
    assert [event_key(e) for e in fast.events] == [event_key(e) for e in slow.events]
    assert fast.rows == slow.rows


def test_a_long_calm_log_is_replayed_without_check_on_every_row(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What makes `analyze` of a 100k-row log fast: `check` runs on a small share of its rows
    (the detectors and the watch of its other loss together)."""
    checked: list[int] = []
    for kind in DETECTOR_TYPES:
        def counted(self: Detector, signals: StepSignals, _check=kind.check) -> list[Event]:
            checked.append(signals.step)
            return _check(self, signals)
        monkeypatch.setattr(kind, "check", counted)
    log = prepare(_synthetic("calm", n=20_000, every=10, skips=False))
    offline.replay(log, scaled_config(len(log), log.interval()))
    assert len(checked) < len(log) // 4


def _trl_state(path: Path, rows: list[dict[str, float]]) -> Path:
    """A `trainer_state.json` shaped like a TRL trainer's, logged every 10 steps."""
    import json

    history = [{**row, "step": 10 * (i + 1), "learning_rate": 1e-5, "grad_norm": 1.0}
               for i, row in enumerate(rows)]
    path.write_text(json.dumps({"log_history": history, "global_step": 10 * len(rows)}))
    return path


def test_a_dpo_log_whose_rewards_never_moved(tmp_path: Path) -> None:
    rows = [{"loss": 0.6931, "rewards/chosen": 0.0, "rewards/rejected": 0.0,
             "rewards/margins": 0.0, "logps/chosen": -30.0 - i} for i in range(15)]
    analysis = analyze(_trl_state(tmp_path / "trainer_state.json", rows))
    assert "preference_unlearned" in {e.kind for e in analysis.events}
    assert analysis.causes[0].code == "reference_is_policy"  # the LR was not 0


def test_a_grpo_log_of_cut_completions_and_its_healthy_twin(tmp_path: Path) -> None:
    """A reward that no completion reaches, because every one was cut, is told; the healthy
    twin (its loss near 0, written to 4 decimals as older TRL logs it) raises nothing."""
    rng = np.random.default_rng(0)
    healthy = [{"loss": round(float(rng.normal(0, 1e-4)), 4), "reward": 0.2 + 0.01 * i,
                "reward_std": 0.3, "frac_reward_zero_std": 0.1, "kl": 1e-4 * (1 + i),
                "completions/clipped_ratio": 0.2} for i in range(30)]
    analysis = analyze(_trl_state(tmp_path / "trainer_state.json", healthy))
    assert analysis.verdict == "healthy" and analysis.events == []
    cut = [{**row, "reward": 0.0, "reward_std": 0.0, "frac_reward_zero_std": 1.0,
            "completions/clipped_ratio": 1.0} for row in healthy]
    (tmp_path / "cut").mkdir()
    analysis = analyze(_trl_state(tmp_path / "cut" / "trainer_state.json", cut))
    assert "reward_dead" in {e.kind for e in analysis.events}
    assert analysis.causes[0].code == "max_completion_length_too_small"
