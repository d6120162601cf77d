"""RL logs are judged on their RL columns: a policy-gradient surrogate's level is no loss to
minimise; a dead reward or an unlearned preference lasting to the end is `stalled`; a KL that
blows up or a reward that goes NaN is trouble."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from trainguard.analyze import analyze
from trainguard.analyze.rl_log import SURROGATE, is_reward_name, scored_samples

ROWS = 50


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps({"global_step": rows[-1]["step"], "log_history": rows}))
    return path


def grpo_rows(*, kl: Callable[[int], float] = lambda i: 5e-4 * (1 + i / 10),
              loss: Callable[[int, float], float] | None = None,
              reward: Callable[[int], float] = lambda i: 0.2 + 0.5 * i / ROWS,
              zero_std: float = 0.1, reward_std: float = 0.2) -> list[dict[str, Any]]:
    """A TRL GRPO log's rows (its own key names), every 10 steps: the loss is beta * KL plus
    noise unless `loss` says otherwise."""
    noise = random.Random(0)
    rows = []
    for i in range(ROWS):
        k = kl(i)
        rows.append({
            "loss": loss(i, k) if loss else 0.04 * k + noise.gauss(0, 1e-3),
            "grad_norm": 0.5 + 0.1 * noise.random(), "learning_rate": 1e-6,
            "reward": reward(i) + noise.gauss(0, 0.02), "reward_std": reward_std,
            "rewards/accuracy/mean": reward(i), "rewards/accuracy/std": reward_std,
            "frac_reward_zero_std": zero_std, "kl": k, "entropy": 1.2 - i * 0.002,
            "completions/mean_length": 120.0, "completions/clipped_ratio": 0.05,
            "clip_ratio/region_mean": 0.0, "epoch": i / ROWS, "step": (i + 1) * 10})
    return rows


def dpo_rows(*, margin: Callable[[int], float] = lambda i: 0.1 * i, lr: float = 5e-7,
             loss: float | None = None) -> list[dict[str, Any]]:
    rows = []
    for i in range(40):
        m = margin(i)
        rows.append({
            "loss": loss if loss is not None else math.log1p(math.exp(-m)), "grad_norm": 10.0,
            "learning_rate": lr, "rewards/chosen": m / 2, "rewards/rejected": -m / 2,
            "rewards/accuracies": 1.0 if m > 0 else 0.0, "rewards/margins": m,
            "logps/chosen": -100 + m, "logps/rejected": -110 - m, "epoch": i / 40,
            "step": (i + 1) * 10})
    return rows


def ppo_rows(*, kl: Callable[[int], float] = lambda i: 0.05 * i) -> list[dict[str, Any]]:
    """TRL's PPO trainer's keys: a KL per sequence (0 to a few), scores of a reward model."""
    noise = random.Random(1)
    return [{"objective/kl": kl(i), "objective/entropy": 50.0,
             "objective/rlhf_reward": 0.1 * i - 0.05 * kl(i),
             "objective/scores": 0.1 * i + noise.gauss(0, 0.1), "policy/approxkl_avg": 0.01,
             "policy/clipfrac_avg": 0.05, "loss/policy_avg": noise.gauss(-0.01, 0.01),
             "loss/value_avg": 0.5 - 0.005 * i, "val/ratio": 1.0, "lr": 3e-6, "episode": i * 64,
             "epoch": i / ROWS, "step": i + 1} for i in range(ROWS)]


IS_RATIO = "sampling/importance_sampling_ratio/mean"


def _with(rows: list[dict[str, Any]], name: str,
          value: Callable[[int], float]) -> list[dict[str, Any]]:
    return [dict(row, **{name: value(i)}) for i, row in enumerate(rows)]


def _then_nan(rows: list[dict[str, Any]], name: str, at: int) -> list[dict[str, Any]]:
    return [dict(row, **{name: math.nan}) if i >= at else row for i, row in enumerate(rows)]


CASES: dict[str, tuple[list[dict[str, Any]], str, str | None]] = {
    # a GRPO loss rises with its KL term while the policy learns
    "GRPO loss rising from ~0 to 0.02 with the KL": (
        grpo_rows(kl=lambda i: 5e-4 + 0.5 * (i / (ROWS - 1)) ** 2, loss=lambda i, k: 0.04 * k),
        "healthy", None),
    "GRPO loss near 0, noisy": (grpo_rows(), "healthy", None),
    "GRPO loss negative": (grpo_rows(loss=lambda i, k: -0.05 + 0.01 * math.sin(i)), "healthy",
                           None),
    "GRPO KL 1000x its own early level": (
        grpo_rows(kl=lambda i: 5e-4 if i < 30 else 0.8 + 0.1 * i), "degraded", "kl_blowup"),
    "GRPO KL NaN to the end": (_then_nan(grpo_rows(), "kl", 30), "degraded", "kl_blowup"),
    "GRPO reward NaN to the end": (_then_nan(grpo_rows(), "reward", 30), "degraded",
                                   "nonfinite_metric"),
    "GRPO reward dead on every row": (
        grpo_rows(zero_std=1.0, reward_std=0.0, reward=lambda i: 1.0), "stalled", "reward_dead"),
    "DPO learning": (dpo_rows(), "healthy", None),
    "DPO log-probabilities NaN to the end, the loss finite": (
        _then_nan(dpo_rows(), "logps/chosen", 20), "degraded", "nonfinite_value"),
    "DPO at ln 2, rewards 0, LR 0": (dpo_rows(margin=lambda i: 0.0, lr=0.0, loss=0.6931),
                                     "stalled", "preference_unlearned"),
    "PPO, KL per sequence growing to 2.45": (ppo_rows(), "healthy", None),
    "PPO KL 500x its own level": (ppo_rows(kl=lambda i: 0.05 * i if i < 30 else 50 + 10 * i),
                                  "degraded", "kl_blowup"),
    "GRPO importance-sampling ratio near 1, noisy": (
        _with(grpo_rows(), IS_RATIO, lambda i: 1.0 + 0.3 * math.sin(i)), "healthy", None),
    "GRPO importance-sampling ratio 6 from row 30": (
        _with(grpo_rows(), IS_RATIO, lambda i: 1.0 if i < 30 else 6.0), "degraded",
        "ratio_far_from_one"),
    "GRPO completions 120 tokens long, shorter by a third as it learns": (
        _with(grpo_rows(), "completions/mean_length", lambda i: 120.0 - 0.8 * i), "healthy",
        None),
    "GRPO completions collapsing to 2 tokens from row 30": (
        _with(grpo_rows(), "completions/mean_length", lambda i: 120.0 if i < 30 else 2.0),
        "degraded", "completion_length_collapse"),
    "GRPO completions all cut from row 30, the reward flat": (
        _with(grpo_rows(reward=lambda i: 0.3), "completions/clipped_ratio",
              lambda i: 0.05 if i < 30 else 1.0), "degraded", "completions_truncated"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_rl_logs_are_judged_on_their_rl_columns(tmp_path: Path, name: str) -> None:
    rows, verdict, kind = CASES[name]
    analysis = analyze(_write(tmp_path / "trainer_state.json", rows))
    assert analysis.verdict == verdict, analysis.evidence
    if kind is not None:
        assert any(e.kind == kind for e in analysis.events)
        assert any(kind in line for line in analysis.evidence)
    else:  # no loss event on a policy-gradient log's surrogate
        assert not any(e.kind.startswith("loss_") or e.kind == "bad_start"
                       for e in analysis.events if e.severity != "info")


def test_a_healthy_policy_gradient_run_is_summed_up_by_its_reward_and_kl(tmp_path: Path) -> None:
    analysis = analyze(_write(tmp_path / "trainer_state.json", grpo_rows()))
    assert analysis.evidence[0].startswith("reward went from")
    assert "kl went from" in analysis.evidence[0]
    assert any("policy-gradient surrogate" in note for note in analysis.notes)


def test_a_stall_is_dated_from_the_first_row_of_its_streak(tmp_path: Path) -> None:
    rows = grpo_rows()
    for row in rows[20:]:
        row.update(frac_reward_zero_std=1.0, reward_std=0.0)
    analysis = analyze(_write(tmp_path / "trainer_state.json", rows))
    assert analysis.verdict == "stalled"
    assert analysis.onset_step == rows[20]["step"]


def test_a_surrogate_that_goes_nan_is_not_hidden(tmp_path: Path) -> None:
    analysis = analyze(_write(tmp_path / "trainer_state.json",
                              _then_nan(grpo_rows(), "loss", 30)))
    assert analysis.verdict == "degraded" and analysis.kind == "nan"
    assert any(e.kind == "nonfinite_loss" and e.param == SURROGATE for e in analysis.events)


@pytest.mark.parametrize(("reward_after", "verdict"), [(0.9, "recovered"), (0.05, "degraded")])
def test_a_surrogate_nan_the_run_steps_over_is_judged_by_its_reward(
        tmp_path: Path, reward_after: float, verdict: str) -> None:
    """One NaN of the set-aside loss, finite on every row after it: with no loss level to come
    back to, the reward says whether the run came back (no lower than before the NaN) or not."""
    rows = grpo_rows()
    rows[25]["loss"] = math.nan
    for row in rows[26:]:
        row["reward"] = reward_after
    analysis = analyze(_write(tmp_path / "trainer_state.json", rows))
    assert analysis.verdict == verdict and analysis.kind == "nan"
    if verdict == "recovered":
        said = " ".join(analysis.evidence)
        assert "finite again" in said and "reward ended at 0.9" in said


def test_preference_and_supervised_logs_keep_their_loss() -> None:
    from trainguard.analyze.log import Log

    def log(*names: str) -> Log:
        return Log(path="x", format="hf", steps=[1, 2],
                   series={"loss": [1.0, 0.5], **{n: [0.0, 0.1] for n in names}})

    assert scored_samples(log("rewards/chosen", "rewards/margins", "logps/chosen")) is None
    assert scored_samples(log("kl", "nll_loss", "log_odds_ratio")) is None
    assert scored_samples(log("mean_token_accuracy", "entropy")) is None
    assert scored_samples(log("rewards/accuracy/mean")) == "rewards/accuracy/mean"
    assert scored_samples(log("approxkl")) == "approxkl"
    assert scored_samples(log("approx_kl", "ep_rew_mean")) == "approx_kl"  # SB3's train/...
    assert scored_samples(log("EpRewMean")) == "EpRewMean"


def test_real_tiny_trl_runs(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from ..integrations.trl_runs import dpo, grpo

    def judged(ran: Any, name: str) -> Any:
        path = tmp_path / f"{name}.json"
        ran.trainer.state.save_to_json(str(path))
        return analyze(path)

    healthy = judged(grpo(tmp_path / "healthy", beta=0.04), "healthy")
    assert healthy.verdict == "healthy"
    assert healthy.evidence[0].startswith("reward went from"), healthy.evidence
    dead = judged(grpo(tmp_path / "dead", reward=lambda completions, **_: [0.0] * len(
        completions)), "dead")
    assert dead.verdict == "stalled", dead.evidence
    unlearned = judged(dpo(tmp_path / "lr0", lr=0.0), "lr0")
    assert unlearned.verdict == "stalled", unlearned.evidence


def test_an_episodic_return_marks_a_value_loss(tmp_path: Path) -> None:
    """CleanRL-style prints (`global_step=N, episodic_return=R`, then the learner's
    `losses/q1_loss` lines): the Q loss's targets move with the samples, its jumps are not
    the run's; it is set aside and the run is summed up by its return."""
    lines = []
    for i in range(12):
        lines.append(f"global_step={1000 * i + 799}, episodic_return={-500 + 30 * i:.3f}")
        lines.append(f"losses/q1_loss {20.0 * (6 if i == 4 else 1) + i:.6f} {1000 * (i + 1)}")
    path = tmp_path / "log.txt"
    path.write_text("\n".join(lines) + "\n")
    result = analyze(path)
    assert result.verdict == "healthy", result.evidence
    assert any("episodic_return went from" in line for line in result.evidence)
    assert scored_samples_named("episodic_return") and scored_samples_named(
        "charts/episodic_return")


def scored_samples_named(name: str) -> bool:
    from trainguard.analyze.rl_log import SAMPLED_SCORES

    return SAMPLED_SCORES.match(name) is not None


def test_a_clip_fraction_marks_a_ppo_surrogate(tmp_path: Path) -> None:
    """Spinning Up's PPO `progress.txt` (tab-separated, a row per epoch): its `LossPi` is the
    surrogate measured before each update, a few 1e-9 either side of 0, whose ratios to its
    median mean nothing; the `ClipFrac` column says the trainer is PPO, and the loss is set
    aside (still watched for NaN)."""
    rng = random.Random(3)
    header = "Epoch\tAverageEpRet\tLossPi\tLossV\tKL\tClipFrac"
    rows = [f"{i}\t{-280 + 10 * i + rng.uniform(-40, 40):.5f}\t{rng.uniform(-5e-8, 5e-8):.7g}\t"
            f"{60000 / (i + 1):.3f}\t{0.01 + rng.uniform(0, 0.005):.6f}\t{0.15:.4f}"
            for i in range(40)]
    path = tmp_path / "progress.txt"
    path.write_text("\n".join([header, *rows]) + "\n")
    result = analyze(path)
    assert result.verdict == "healthy", result.evidence
    assert SURROGATE in result.log.series
    for name in ("ClipFrac", "train/clip_fraction"):
        assert scored_samples_named(name.lower()), name
    for name in ("clip_frac", "grad/clip_frac", "grad_clip"):  # a clipper's, DP-SGD's
        assert not scored_samples_named(name), name


@pytest.mark.parametrize(("kl_after", "reward_after", "verdict"), [
    (5e-3, 0.9, "healthy"),  # back at its level, the reward climbing on: a note
    (0.8, 0.9, "degraded"),  # the policy stayed far from its reference
    (5e-3, 0.05, "degraded"),  # back, but the reward lost what it had learned
])
def test_a_kl_that_jumped_and_came_back_is_judged_by_its_reward(
        tmp_path: Path, kl_after: float, reward_after: float, verdict: str) -> None:
    """The KL to the reference jumps 100x on one row (a GRPO log every step swings); the KL
    says how far the policy went, the reward what it learned: back at its level with the
    reward no lower is a note, not a verdict."""
    rows = grpo_rows(kl=lambda i: 5e-3)
    rows[25]["kl"] = 1.0
    for row in rows[26:]:
        row["kl"], row["reward"] = kl_after, reward_after
    analysis = analyze(_write(tmp_path / "trainer_state.json", rows))
    assert analysis.verdict == verdict, analysis.evidence
    assert any(e.kind == "kl_blowup" for e in analysis.events)
    if verdict == "healthy":
        assert "came back to its level" in " ".join(analysis.evidence)


@pytest.mark.parametrize("name, reward", [
    ("Average Score", True), ("score", True), ("ep_reward", True), ("episodic_return", True),
    ("avg_score", True),
    # a score that names what it measures is a model's quality, not an episode's reward
    ("inception_score", False), ("f1_score", False), ("clip_score", False),
    ("dice_score", False), ("eval_loss", False),
])
def test_a_named_quality_score_is_no_reward(name: str, reward: bool) -> None:
    assert is_reward_name(name) is reward


def _keras_rl(path: Path, first: float = math.nan, warmup: int = 30, episodes: int = 120,
              nan_at: int | None = None) -> Path:
    """A keras-rl `FileLogger` JSON: one value per episode for each key; the update's values
    (loss, mean_q, mean_eps) are `first` until the replay warm-up ends."""
    noise = random.Random(1)
    log: dict[str, list[float]] = {k: [] for k in (
        "loss", "mean_absolute_error", "mean_q", "mean_eps", "episode_reward",
        "nb_episode_steps", "nb_steps", "episode", "duration")}
    steps = 0
    for episode in range(episodes):
        length = 150 + noise.randrange(100)
        steps += length
        learning = episode >= warmup
        loss = 0.004 + 0.002 * noise.random() if learning else first
        if episode == nan_at:
            loss = math.nan
        log["loss"].append(loss)
        log["mean_absolute_error"].append(0.03 + 0.01 * noise.random() if learning else first)
        log["mean_q"].append(0.01 * noise.random() if learning else first)
        log["mean_eps"].append(1.0 - 0.9 * steps / (steps + 50000) if learning else first)
        log["episode_reward"].append(float(noise.randrange(4)))
        log["nb_episode_steps"].append(float(length))
        log["nb_steps"].append(float(steps))
        log["episode"].append(float(episode))
        log["duration"].append(0.5 + noise.random())
    path.write_text(json.dumps(log))  # NaN as JSON's NaN token, as the logger writes it
    return path


def test_nan_until_the_first_update_is_a_warmup_not_a_blowup(tmp_path: Path) -> None:
    analysis = analyze(_keras_rl(tmp_path / "dqn_log.json"))
    assert analysis.verdict == "healthy", analysis.evidence
    assert "before its first update" in " ".join(analysis.evidence)
    assert any("mean_q: 30 non-finite" in note for note in analysis.notes)  # still counted


@pytest.mark.parametrize("kwargs", [{"first": math.inf}, {"nan_at": 60}])
def test_an_inf_start_or_a_nan_after_updates_began_is_still_trouble(
        tmp_path: Path, kwargs: dict[str, Any]) -> None:
    analysis = analyze(_keras_rl(tmp_path / "dqn_log.json", **kwargs))
    assert analysis.verdict != "healthy" and analysis.kind == "nan", analysis.evidence
