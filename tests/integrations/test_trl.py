"""TRL trainers (DPO, GRPO) guarded by the HF callback: judged on their own objective and
metrics, each fault made as a user makes it next to its healthy twin (tiny GPT-2, CPU)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from .trl_runs import dpo, grpo, kto, letters_reward, rloo, sft

pytestmark = pytest.mark.usefixtures("fresh_accelerate")

SEEDS = (0, 1, 2)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_healthy_dpo_is_judged_on_its_dpo_loss(tmp_path: Path, seed: int) -> None:
    """The DPO loss (ln 2 at the start, lower as the policy learns), not the completions'
    cross-entropy the model computes on the side: healthy, no warning."""
    ran = dpo(tmp_path, seed=seed)
    assert ran.kinds() == set()
    assert ran.verdict.verdict == "healthy"
    # the median of the first losses: the DPO loss from ln 2 down (the completions' CE is ~3.5)
    assert ran.verdict.start <= math.log(2) + 1e-3


def test_dpo_at_lr_0_learns_nothing_and_says_why(tmp_path: Path) -> None:
    ran = dpo(tmp_path, lr=0.0, steps=20)
    assert "preference_unlearned" in ran.kinds()
    assert ran.top_cause() == "lr_too_low"
    event = next(e for e in ran.events if e.kind == "preference_unlearned")
    assert "0.6931" in event.message
    # the loss ends where it was (ln 2), which is not a recovery: nothing was learned
    assert ran.verdict.verdict == "stalled", ran.verdict
    assert "policy never left its reference" in ran.verdict.message


def test_dpo_lr_far_too_high_overfits_its_preferences(tmp_path: Path) -> None:
    """At LR 5e-2 the margin runs past 10 (the loss of a pair under 5e-5) and the chosen
    answers lose probability as the rejected ones are pushed down; the healthy twins at 1e-3
    (above) settle at a margin under 4 and raise neither. The margin alone is a note (`info`);
    the chosen answers losing probability is the warning."""
    ran = dpo(tmp_path, lr=5e-2)
    assert "margins_exploding" in ran.kinds("info")
    assert "chosen_likelihood_falling" in ran.kinds()
    margins = next(e for e in ran.events if e.kind == "margins_exploding")
    assert margins.value > 10 and margins.severity == "info"
    fallen = next(e for e in ran.events if e.kind == "chosen_likelihood_falling")
    assert fallen.value < 1.5 * fallen.details["start"] < 0


@pytest.mark.parametrize("dropout", [0.1, 0.0])
def test_dpo_with_dropout_left_on_differs_from_its_reference_at_once(tmp_path: Path,
                                                                     dropout: float) -> None:
    """GPT-2's dropout at 0.1 with `disable_dropout=False`: the first implicit rewards are not
    0 (0.046 here) though the reference is a copy of the policy, and `policy_dropout` is
    ranked first. The same run with dropout at 0 (still not disabled) starts at exactly 0."""
    ran = dpo(tmp_path, steps=12, dropout=dropout)
    if not dropout:
        assert "policy_off_reference" not in ran.kinds()
        return
    assert "policy_off_reference" in ran.kinds()
    assert ran.top_cause() == "policy_dropout"


def test_the_trainer_is_left_as_it_was(tmp_path: Path) -> None:
    """The objective tap wraps the trainer's compute_loss for the run only, and observe trains
    exactly as the trainer alone."""
    from .trl_runs import Ran

    guarded = dpo(tmp_path / "a", steps=10, policy="observe")
    assert "compute_loss" not in vars(guarded.trainer)
    alone: Ran = _dpo_alone(tmp_path / "b", steps=10)
    losses = [[h["loss"] for h in r.trainer.state.log_history if "loss" in h]
              for r in (guarded, alone)]
    assert losses[0] == losses[1]


def _dpo_alone(tmp: Path, steps: int) -> Any:
    import copy

    import trl
    from datasets import Dataset

    from .trl_runs import Ran, tiny_gpt2, tokenizer

    tok = tokenizer()
    model = tiny_gpt2(tok, 0)
    rows = [{"prompt": f"q{i % 7} ", "chosen": "yes good", "rejected": "no bad x"}
            for i in range(64)]
    args = trl.DPOConfig(output_dir=str(tmp), max_steps=steps, per_device_train_batch_size=4,
                         learning_rate=1e-3, logging_steps=5, report_to=[], save_strategy="no",
                         seed=0, use_cpu=True, disable_tqdm=True, max_length=32)
    trainer = trl.DPOTrainer(model=model, ref_model=copy.deepcopy(model), args=args,
                             train_dataset=Dataset.from_list(rows), processing_class=tok)
    trainer.train()
    return Ran(trainer, None)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", SEEDS)
def test_healthy_grpo_raises_nothing(tmp_path: Path, seed: int) -> None:
    """GRPO's loss is a surrogate near 0 by design: its level is not judged, its rewards are."""
    ran = grpo(tmp_path, seed=seed)
    assert ran.kinds() == set()
    assert ran.verdict is None  # no loss judged, nothing stalled: no verdict is known


@pytest.mark.parametrize("seed", SEEDS)
def test_healthy_grpo_with_a_kl_term_raises_nothing(tmp_path: Path, seed: int) -> None:
    assert grpo(tmp_path, seed=seed, beta=0.1, steps=16).kinds() == set()


def test_a_reward_function_that_returns_0_is_named(tmp_path: Path) -> None:
    def zero_reward(completions: list[str], **kwargs: Any) -> list[float]:
        return [0.0] * len(completions)

    ran = grpo(tmp_path, reward=zero_reward)
    assert "reward_dead" in ran.kinds()
    assert ran.top_cause() == "reward_constant"
    assert "zero_reward" in next(e for e in ran.events if e.kind == "reward_dead").message
    # no loss is judged in GRPO (a surrogate), yet a reward dead to the end is a verdict
    assert ran.verdict is not None and ran.verdict.verdict == "stalled", ran.verdict
    assert "to the end of the run" in ran.verdict.message


def test_completions_cut_before_the_reward_can_see_them(tmp_path: Path) -> None:
    """A reward for answers of 6+ characters, completions cut at 3 tokens."""
    def long_answer(completions: list[str], **kwargs: Any) -> list[float]:
        return [float(len(c) >= 6) for c in completions]

    ran = grpo(tmp_path, reward=long_answer, max_completion_length=3)
    assert "reward_dead" in ran.kinds()
    assert ran.top_cause() == "max_completion_length_too_small"
    healthy = grpo(tmp_path / "twin", reward=long_answer, max_completion_length=8)
    assert "reward_dead" not in healthy.kinds()


def brevity(completions: list[str], **kwargs: Any) -> list[float]:
    """A reward for short answers: a policy pushed hard enough answers with nothing at all."""
    return [1.0 / (1 + len(c)) for c in completions]


def test_completions_collapsing_to_nothing_are_named(tmp_path: Path) -> None:
    ran = grpo(tmp_path, reward=brevity, lr=5e-2, steps=20, max_completion_length=16)
    collapse = next(e for e in ran.events if e.kind == "completion_length_collapse")
    assert collapse.value is not None and collapse.value < 0.25 * collapse.details["start"]
    assert "lr_too_high" in [c.code for c in ran.callback.run.diagnose()[:2]]
    healthy = grpo(tmp_path / "twin", reward=brevity, lr=1e-3, steps=20,
                   max_completion_length=16)
    assert healthy.kinds() == set()


def test_grpo_lr_far_too_high_with_a_kl_term(tmp_path: Path) -> None:
    """The LR held at 1e-1 (a constant schedule: under the default linear decay, a release of
    transformers or TRL can leave the last steps' LR too low for the policy to finish
    collapsing within 16 steps; at 5e-2 seed 0's entropy stopped at 0.87 of 3.25 on one fresh
    install and collapsed on another, while at 1e-1 it collapses on seeds 0-2 alike)."""
    ran = grpo(tmp_path, lr=1e-1, beta=0.1, steps=16, schedule="constant")
    assert {"kl_blowup", "entropy_collapse"} <= ran.kinds()
    assert ran.top_cause() == "lr_too_high"


@pytest.mark.slow
def exact_answer(completions: list[str], **kwargs: Any) -> list[float]:
    """A task reward the tiny policy never earns: 1 for one exact answer."""
    return [float(c.strip() == "a1 a2 a3") for c in completions]


def test_grpo_climbing_one_reward_while_another_never_pays(tmp_path: Path) -> None:
    """At LR 3e-2 the policy climbs the letters reward (0.12 to over 0.4) and never earns the
    task's: `reward_hacking`, naming both."""
    ran = grpo(tmp_path, lr=3e-2, steps=20, seed=1, reward=[letters_reward, exact_answer])
    assert "reward_hacking" in ran.kinds()
    event = next(e for e in ran.events if e.kind == "reward_hacking")
    assert event.details["climbing"] == "letters_reward"
    assert event.details["lagging"] == ["exact_answer"]


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_healthy_grpo_with_a_reward_it_never_earns_raises_nothing(tmp_path: Path,
                                                                  seed: int) -> None:
    """At LR 1e-3 the letters reward only wanders within its spread: no climb, no warning."""
    ran = grpo(tmp_path, steps=20, seed=seed, reward=[letters_reward, exact_answer])
    assert ran.kinds() == set()


@pytest.mark.parametrize(("lr", "rolled_back"), [(5e-2, True), (1e-3, False)])
def test_recover_cuts_the_lr_of_a_grpo_run_whose_kl_blew_up_from_it(
        tmp_path: Path, lr: float, rolled_back: bool) -> None:
    """At LR 5e-2 with beta 0.1 the KL leaves its reference at the first update: `recover`
    rolls back to the start with the LR cut, and the run goes on below the LR that did it.
    Its healthy twin at 1e-3 gets no action."""
    ran = grpo(tmp_path, lr=lr, beta=0.1, steps=16, policy="recover")
    rollbacks = [e for e in ran.events if e.kind == "rollback"]
    # the trainer's beta is the penalty recover would raise; neither run drifted unheld
    penalty = ran.callback.run.state.kl_penalty
    assert penalty is not None and penalty.holder is ran.trainer and not penalty.engaged
    assert ran.trainer.beta == 0.1
    if not rolled_back:
        assert rollbacks == [] and ran.kinds("info") == set()
        return
    assert "kl_blowup" in rollbacks[0].message
    assert ran.trainer.optimizer.param_groups[0]["lr"] < lr / 10


def test_an_sft_trainer_with_no_beta_is_guarded_as_any_trainer(tmp_path: Path) -> None:
    """No KL penalty to hold (no `beta`): nothing for recover to raise, and the run is judged
    on its loss as any trainer's."""
    ran = sft(tmp_path)
    assert ran.callback.run is not None and ran.callback.run.state.kl_penalty is None
    assert ran.kinds() == set()
    assert ran.verdict.verdict == "healthy"


def test_kto_at_lr_0_learns_nothing_its_healthy_twin_is_quiet(tmp_path: Path) -> None:
    assert kto(tmp_path / "twin").kinds() == set()
    ran = kto(tmp_path, lr=0.0)
    assert "preference_unlearned" in ran.kinds()
    assert ran.top_cause() == "lr_too_low"


@pytest.mark.slow
def test_rloo_with_a_reward_that_returns_0_its_healthy_twin_is_quiet(tmp_path: Path) -> None:
    def zero_reward(completions: list[str], **kwargs: Any) -> list[float]:
        return [0.0] * len(completions)

    assert rloo(tmp_path / "twin").kinds() == set()
    ran = rloo(tmp_path, reward=zero_reward)
    assert "reward_dead" in ran.kinds()
    assert ran.top_cause() == "reward_constant"


class _Metrics:
    """What TRL keeps on a trainer: `_metrics[mode][name]` lists, dropped at each log."""

    def __init__(self) -> None:
        from collections import defaultdict

        self._metrics: dict[str, Any] = {"train": defaultdict(list), "eval": defaultdict(list)}


def test_each_step_reads_its_own_values_nan_kept() -> None:
    from trainguard.integrations.trl import MetricsTap

    trainer = _Metrics()
    tap = MetricsTap(trainer)
    train = trainer._metrics["train"]
    train["reward"] += [0.5, 0.7]  # two micro-batches
    train["kl"].append(0.01)
    assert tap.take() == {"reward": pytest.approx(0.6), "kl": 0.01}
    train["reward"].append(math.nan)  # the log's average would drop it
    taken = tap.take()
    assert list(taken) == ["reward"] and math.isnan(taken["reward"])
    assert tap.take() == {}  # nothing new


def test_values_after_a_log_are_read_from_the_new_lists() -> None:
    """A log clears the lists; one value a step with logging every step is still read."""
    from trainguard.integrations.trl import MetricsTap

    trainer = _Metrics()
    tap = MetricsTap(trainer)
    for value in (1.0, 2.0, 3.0):
        trainer._metrics["train"]["reward"].append(value)
        assert tap.take() == {"reward": value}
        trainer._metrics["train"].clear()
