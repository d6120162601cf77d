"""The scenario families as one table: each family's batches are reproducible, its healthy
fine-tune converges quietly, and its faults are caught as expected. Below the tables, the ground
truth of the faults whose making is more than a changed setting (a shard, a burst, a schedule
restart, a badly initialised head), checked on the workloads without training."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from benchmarks.scenarios import scenario
from benchmarks.scenarios.base import Scenario
from benchmarks.scenarios.runner import run_scenario


@dataclass(frozen=True)
class Family:
    """A family's healthy scenario, how to compare its batches, and how far it must converge."""

    healthy: str
    steps: int
    """Steps of the healthy fine-tune."""
    converged: float
    """The final eval loss is below this fraction of the loss before training."""
    keys: tuple[str, ...] = ()
    """A dict batch: the keys compared (the first also differs with the seed); otherwise the
    batch is a tensor or a tuple of tensors (the first differs with the seed)."""
    needs: str | None = None
    """A module the family cannot be built without."""


FAMILIES = {
    "gpt2": Family("gpt2_healthy", 60, 0.5, needs="transformers"),
    "bert_cls": Family("bert_cls_healthy", 60, 0.5, keys=("input_ids", "attention_mask", "labels"),
                       needs="transformers"),
    "image_cls": Family("image_cls_healthy", 80, 0.5),
    "diffusion": Family("diffusion_healthy", 60, 0.75),
    "lstm": Family("lstm_healthy_sgd", 80, 0.5, keys=("tokens",)),
}


def _needs(module: str | None) -> None:
    if module is not None:
        pytest.importorskip(module)


def _parts(family: Family, batch: object) -> list[torch.Tensor]:
    if family.keys:
        assert isinstance(batch, dict)
        return [batch[key] for key in family.keys]
    if isinstance(batch, torch.Tensor):
        return [batch]
    assert isinstance(batch, tuple | list)
    return list(batch)


def _same(family: Family, a: object, b: object) -> bool:
    return all(torch.equal(x, y) for x, y in zip(_parts(family, a), _parts(family, b),
                                                 strict=True))


@pytest.mark.parametrize("name", list(FAMILIES))
def test_batches_depend_only_on_seed_step_and_micro(name: str) -> None:
    family = FAMILIES[name]
    _needs(family.needs)
    healthy = scenario(family.healthy)
    first, second = healthy.build(3), healthy.build(3)
    assert _same(family, first.batch(5, 0), second.batch(5, 0))
    second.batch(4, 0)  # drawing another step's batch changes nothing for the others
    assert _same(family, first.batch(7, 0), second.batch(7, 0))
    other_seed = healthy.build(4)
    assert not torch.equal(_parts(family, first.batch(7, 0))[0],
                           _parts(family, other_seed.batch(7, 0))[0])


@pytest.mark.parametrize("name", list(FAMILIES))
def test_healthy_fine_tune_converges_without_events(name: str) -> None:
    family = FAMILIES[name]
    _needs(family.needs)
    healthy = scenario(family.healthy)
    workload = healthy.build(0)
    start = workload.evaluate(workload.model)
    result = run_scenario(healthy, "trainguard", steps=family.steps)
    assert result.outcome == "finished"
    assert result.events == []
    assert result.final_eval_loss < family.converged * start


@dataclass(frozen=True)
class Caught:
    """A fault and what trainguard must make of it."""

    scenario: str
    steps: int | None = None
    """Steps run, if not counted from the onset."""
    after: int | None = None
    """Steps run past the onset; neither this nor `steps`: the scenario's own length."""
    strategy: str = "trainguard"
    latency: int = 0
    """The fault is detected at most this many steps after its onset."""
    quiet: bool = True
    """No false alarm before the onset."""
    kinds: frozenset[str] = frozenset()
    """Event kinds among those raised."""
    first_cause: str | None = None
    """The diagnosis' first cause."""
    not_causes: frozenset[str] = frozenset()
    """Causes absent from the diagnosis."""
    finite_eval: bool = False
    """The run's final eval loss is finite."""
    skipped: int | None = None
    """Steps skipped by trainguard."""
    unguarded: str | None = None
    """The outcome of the same run without trainguard."""
    needs: str | None = None

    def steps_for(self, s: Scenario) -> int | None:
        if self.steps is not None:
            return self.steps
        return None if self.after is None else s.onset_step + self.after


CAUGHT = [
    # the families' own faults
    Caught("gpt2_numerical_op", after=5, finite_eval=True, needs="transformers"),
    Caught("bert_cls_optimizer_eps_fp16", steps=3, quiet=False,
           kinds=frozenset({"nonfinite_loss", "nonfinite_grad"}), needs="transformers"),
    Caught("image_cls_outlier_1000x", after=5, finite_eval=True),
    Caught("diffusion_lr_too_high", steps=30, latency=5),
    # an SGD LR that rewrites the weights while the loss never blows up: named from the first
    # update's size (the loss and gradient detectors see nothing wrong on some seeds)
    Caught("lstm_lr_too_high_x50", steps=5, kinds=frozenset({"update_too_large"}),
           first_cause="lr_too_high"),
    Caught("lstm_numerical_op", after=5, finite_eval=True, skipped=1, unguarded="nan"),
    # data faults: the data (or the labels) first in the diagnosis, not the learning rate
    Caught("regression_input_scale_drift", first_cause="input_scale"),
    Caught("regression_input_scale_drift", strategy="recover",
           first_cause="input_scale"),
    Caught("lstm_labels_ignored", after=5, quiet=False, first_cause="empty_loss",
           not_causes=frozenset({"numerical_op"})),
    # faults made the way users make them: found within a step or two, the cause named
    Caught("gpt2_user_lr_jump", after=20, latency=2, first_cause="lr_too_high",
           needs="transformers"),
    Caught("gpt2_late_group_lr", after=20, latency=2, first_cause="lr_too_high",
           needs="transformers"),
    Caught("gpt2_forgotten_backward", after=20, latency=2, first_cause="no_gradients",
           needs="transformers"),
    # checked on one step in 10 after the first 10 (`stale_grads.EVERY`)
    Caught("gpt2_forgotten_zero_grad", after=20, latency=10, first_cause="grads_not_cleared",
           kinds=frozenset({"grads_not_cleared"}), needs="transformers"),
    Caught("mlp_cls_double_softmax", first_cause="double_activation"),
    Caught("mlp_cls_nll_on_logits", steps=5, first_cause="nll_input"),
    Caught("regression_target_broadcast", steps=5, first_cause="loss_broadcast"),
    Caught("mlp_cls_weight_decay", steps=5, first_cause="weight_decay_too_high"),
    Caught("gpt2_adam_coupled_decay", steps=5, latency=1, first_cause="weight_decay_coupled",
           needs="transformers"),
    Caught("mlp_cls_detached_layer", steps=60, first_cause="no_gradients"),
    Caught("mlp_cls_schedule_per_batch", steps=120, latency=106, first_cause="lr_at_zero",
           kinds=frozenset({"lr_at_zero"})),
    Caught("lstm_padding_labelled", steps=5, first_cause="padding_labels",
           kinds=frozenset({"batch_padding_labels"})),
    Caught("mlp_cls_eval_mode", after=5, latency=1, first_cause="model_in_eval_mode",
           kinds=frozenset({"model_in_eval_mode"})),
    Caught("mlp_cls_clip_too_tight", steps=110, latency=100, first_cause="clip_too_tight",
           kinds=frozenset({"no_progress"})),
    Caught("mlp_cls_unshuffled", latency=10, first_cause="unshuffled_data",
           kinds=frozenset({"batch_label_order"})),
    Caught("gpt2_schedule_too_short", after=110, latency=9, first_cause="lr_at_zero",
           kinds=frozenset({"lr_at_zero"}), needs="transformers"),
]


def _caught_id(row: Caught) -> str:
    return row.scenario if row.strategy == "trainguard" else f"{row.scenario}-{row.strategy}"


@pytest.mark.parametrize("row", CAUGHT, ids=[_caught_id(r) for r in CAUGHT])
def test_the_fault_is_caught_and_named(row: Caught) -> None:
    _needs(row.needs)
    s = scenario(row.scenario)
    steps = row.steps_for(s)
    if row.unguarded is not None:
        assert run_scenario(s, "none", steps=steps).outcome == row.unguarded
    result = run_scenario(s, row.strategy, steps=steps)
    assert result.detected and result.latency is not None and result.latency <= row.latency
    if row.quiet:
        assert result.false_alarms == 0
    assert row.kinds <= {e["kind"] for e in result.events}
    if row.first_cause is not None:
        assert result.diagnosis[0] == row.first_cause
    assert not row.not_causes & set(result.diagnosis)
    if row.finite_eval:
        assert math.isfinite(result.final_eval_loss)
    if row.skipped is not None:
        assert result.actions.get("skipped") == row.skipped


# -- the ground truth of faults made of more than a setting ----------------------------------------
def test_the_new_bert_head_is_initialised_as_configured() -> None:
    pytest.importorskip("transformers")
    healthy = scenario("bert_cls_healthy").build(0).model.classifier.weight
    bad = scenario("bert_cls_bad_init_std100").build(0).model.classifier.weight
    assert 0.01 < float(healthy.detach().std()) < 0.04
    assert 50 < float(bad.detach().std()) < 200


def test_the_wrongly_encoded_gpt2_shard_covers_its_steps_only() -> None:
    pytest.importorskip("transformers")
    from benchmarks.scenarios.families import gpt2

    shard = scenario("gpt2_tokenizer_shard")
    faulty, healthy = shard.build(0), scenario("gpt2_healthy").build(0)
    onset, length = shard.onset_step, gpt2.PERMUTED_SHARD_STEPS
    for step in (onset - 1, onset + length):
        assert torch.equal(faulty.batch(step, 0), healthy.batch(step, 0))
    for step in (onset, onset + length - 1):
        wrong, right = faulty.batch(step, 0), healthy.batch(step, 0)
        assert not torch.equal(wrong, right)
        # the same text under another vocabulary: a one-to-one relabelling of the ids
        pairs = set(zip(right.flatten().tolist(), wrong.flatten().tolist(), strict=True))
        assert len({a for a, _ in pairs}) == len(pairs) == len({b for _, b in pairs})


def test_an_image_burst_poisons_consecutive_batches_from_its_onset() -> None:
    from benchmarks.scenarios.families import image_cls

    nan_burst, outlier_burst = scenario("image_cls_nan_burst"), scenario("image_cls_outlier_burst")
    onset, burst = nan_burst.onset_step, image_cls.BURST
    nans, outliers = nan_burst.build(0), outlier_burst.build(0)
    poisoned = [step for step in range(onset - 2, onset + burst + 2)
                if torch.isnan(nans.batch(step, 0)[0]).any()]
    assert poisoned == list(range(onset, onset + burst))
    clean = scenario("image_cls_healthy").build(0)
    for step in (onset, onset + burst - 1):
        assert torch.allclose(outliers.batch(step, 0)[0], 100.0 * clean.batch(step, 0)[0])
    assert torch.equal(outliers.batch(onset + burst, 0)[0], clean.batch(onset + burst, 0)[0])


def _scheduled_lrs(s: Scenario, steps: int) -> list[float]:
    """The LR of each scheduler step, without training."""
    workload = s.build(0)
    lrs = []
    for _ in range(steps):
        lrs.append(workload.optimizer.param_groups[0]["lr"])
        workload.optimizer.step()
        workload.scheduler.step()
    return lrs


def test_the_diffusion_schedule_restart_spikes_the_lr_for_its_steps_only() -> None:
    from benchmarks.scenarios.families import diffusion

    spike = scenario("diffusion_lr_spike")
    spiked = _scheduled_lrs(spike, spike.steps)
    plain = _scheduled_lrs(scenario("diffusion_healthy"), spike.steps)
    ratios = [a / b for a, b in zip(spiked, plain, strict=True)]
    onset = spike.onset_step
    window = range(onset, onset + diffusion.LR_SPIKE_STEPS)
    assert all(r == pytest.approx(diffusion.LR_SPIKE_FACTOR) for r in ratios[onset:window.stop])
    assert all(r == pytest.approx(1.0) for i, r in enumerate(ratios) if i not in window)


def test_the_lstm_schedule_restart_spikes_the_sgd_lr_for_its_steps_only() -> None:
    from benchmarks.scenarios.families import lstm

    spike = scenario("lstm_lr_spike")
    lrs = _scheduled_lrs(spike, spike.steps)
    high = lstm.SGD_SANE_LR * lstm.LR_SPIKE_FACTOR
    assert [i for i, lr in enumerate(lrs) if lr == high] == list(
        range(spike.onset_step, spike.onset_step + lstm.LR_SPIKE_STEPS))
    assert all(lr in (high, lstm.SGD_SANE_LR) for lr in lrs)

