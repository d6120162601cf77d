"""Progressive unfreezing on a real tiny GPT-2 trained with AdamW."""

from __future__ import annotations

import io
import math

import peft
import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel

from trainguard import Guard, GuardConfig
from trainguard.errors import ConfigError, UsageError
from trainguard.recipes import (
    ProgressiveUnfreezer,
    layer_groups,
    unfreeze_schedule,
    warmup_cosine,
)

GPT2_GROUPS = [["transformer.wte", "transformer.wpe"], ["transformer.h.0"], ["transformer.h.1"],
               ["transformer.h.2"], ["transformer.h.3"], ["transformer.ln_f", "lm_head"]]


def gpt2(n_layer: int = 4) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(n_layer=n_layer, n_embd=32, n_head=2, vocab_size=64, n_positions=32,
                        bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def train_step(model: GPT2LMHeadModel, optimizer: torch.optim.Optimizer, step: int) -> None:
    generator = torch.Generator().manual_seed(step)
    ids = torch.randint(0, 64, (4, 16), generator=generator)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def snapshot(params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    return [p.detach().clone() for p in params]


def test_layer_groups_of_gpt2_and_bert() -> None:
    assert layer_groups(gpt2()) == GPT2_GROUPS
    torch.manual_seed(0)
    bert = BertForSequenceClassification(BertConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64,
        vocab_size=64, num_labels=3))
    groups = layer_groups(bert)
    assert groups[1:3] == [["bert.encoder.layer.0"], ["bert.encoder.layer.1"]]
    assert groups[0][0] == "bert.embeddings.word_embeddings"
    assert groups[-1] == ["bert.pooler.dense", "classifier"]
    assert layer_groups(bert, stack="bert.encoder.layer") == groups


def test_schedule_top_first_then_evenly_spaced_down_to_the_bottom() -> None:
    assert unfreeze_schedule(6, total_steps=100) == [50, 40, 30, 20, 10, 0]
    assert unfreeze_schedule(2, total_steps=100) == [10, 0]
    assert unfreeze_schedule(3, total_steps=1000, top_fraction=0.2,
                             all_trainable_fraction=0.8) == [800, 200, 0]
    assert unfreeze_schedule(1, total_steps=10) == [0]


def test_unfreezing_order_and_timing_on_gpt2() -> None:
    model = gpt2()
    unfreezer = ProgressiveUnfreezer(model, layer_groups(model), total_steps=100)
    named = dict(model.named_parameters())
    # Only the top group (final norm + the tied output head) trains during the first 10%.
    assert unfreezer.trainable == [False, False, False, False, False, True]
    assert named["transformer.wte.weight"].requires_grad  # tied to lm_head: trains with the top
    assert not named["transformer.wpe.weight"].requires_grad
    assert not named["transformer.h.3.attn.c_attn.weight"].requires_grad
    changes = {}
    for step in range(1, 120):
        changed = unfreezer.step()
        if changed:
            changes[step] = changed
    assert changes == {10: [4], 20: [3], 30: [2], 40: [1], 50: [0]}
    assert all(p.requires_grad for p in model.parameters())


def test_frozen_groups_keep_weights_and_adam_state_untouched_until_unfrozen() -> None:
    model = gpt2()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    unfreezer = ProgressiveUnfreezer(model, layer_groups(model), total_steps=50,
                                     optimizer=optimizer)
    assert unfreezer.starts == [25, 20, 15, 10, 5, 0]
    initial = [snapshot(params) for params in unfreezer.params]
    steps = 30
    for step in range(steps):
        unfreezer.step(step)
        for index, params in enumerate(unfreezer.params):
            if step < unfreezer.starts[index]:
                # Frozen: no Adam moments, no weight decay, not a single bit changed.
                assert all(p not in optimizer.state for p in params)
                assert all(torch.equal(p, q) for p, q in zip(params, initial[index], strict=True))
        train_step(model, optimizer, step)
    for index, params in enumerate(unfreezer.params):
        trained = steps - unfreezer.starts[index]
        assert all(int(optimizer.state[p]["step"]) == trained for p in params)
        assert not torch.equal(params[0], initial[index][0])


def test_stale_gradients_of_frozen_parameters_are_dropped() -> None:
    model = gpt2()
    ids = torch.randint(0, 64, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()  # every parameter now has a gradient
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    unfreezer = ProgressiveUnfreezer(model, layer_groups(model), total_steps=100)
    frozen = [p for params in unfreezer.params[:-1] for p in params]
    assert all(p.grad is None for p in frozen)
    before = snapshot(frozen)
    optimizer.step()
    assert all(torch.equal(p, q) for p, q in zip(frozen, before, strict=True))
    assert all(p.grad is not None for p in unfreezer.params[-1])


def test_stepping_back_refreezes_and_state_dict_round_trip() -> None:
    model = gpt2()
    unfreezer = ProgressiveUnfreezer(model, GPT2_GROUPS, total_steps=100)
    assert unfreezer.step(33) == [2, 3, 4]
    assert unfreezer.step(12) == [2, 3]
    assert unfreezer.step(33) == [2, 3]
    buffer = io.BytesIO()
    torch.save(unfreezer.state_dict(), buffer)
    buffer.seek(0)

    resumed_model = gpt2()
    resumed = ProgressiveUnfreezer(resumed_model, GPT2_GROUPS, total_steps=100)
    resumed.load_state_dict(torch.load(buffer, weights_only=True))
    assert resumed.current_step == 33 and resumed.trainable == unfreezer.trainable
    assert [p.requires_grad for p in resumed_model.parameters()] == [
        p.requires_grad for p in model.parameters()]
    assert resumed.step() == []  # carries on from step 33 to 34...
    assert resumed.current_step == 34
    assert resumed.step(40) == [1]  # ...and h.0 unfreezes at 40 as scheduled


def test_groups_given_as_modules() -> None:
    model = gpt2()
    t = model.transformer
    groups = [[t.wte, t.wpe], *t.h, [t.ln_f, model.lm_head]]
    by_module = ProgressiveUnfreezer(model, groups, total_steps=100)
    assert by_module.starts == [50, 40, 30, 20, 10, 0]
    by_name = ProgressiveUnfreezer(gpt2(), GPT2_GROUPS, total_steps=100)
    assert [len(p) for p in by_module.params] == [len(p) for p in by_name.params] == [
        1, 12, 12, 12, 12, 3]


def test_prefix_does_not_match_a_longer_number() -> None:
    model = gpt2(n_layer=11)
    unfreezer = ProgressiveUnfreezer(model, [["transformer.h.1"], ["lm_head"]], total_steps=100,
                                     strict=False)
    assert len(unfreezer.params[0]) == 12  # not h.10's parameters as well
    assert not model.transformer.h[1].mlp.c_fc.weight.requires_grad
    assert model.transformer.h[10].mlp.c_fc.weight.requires_grad


@pytest.mark.filterwarnings("ignore::FutureWarning")  # raised inside peft/transformers
def test_already_frozen_lora_base_weights_are_never_unfrozen() -> None:
    model = peft.get_peft_model(gpt2(), peft.LoraConfig(
        r=4, lora_alpha=4, target_modules=["c_attn"], fan_in_fan_out=True))
    base = [p for n, p in model.named_parameters() if "lora_" not in n]
    blocks = layer_groups(model)[1:-1]  # LoRA trains only inside the blocks
    unfreezer = ProgressiveUnfreezer(model, blocks, total_steps=40)
    assert unfreezer.starts == [20, 12, 4, 0]
    unfreezer.step(40)
    assert not any(p.requires_grad for p in base)
    assert all(p.requires_grad for n, p in model.named_parameters() if "lora_" in n)


@pytest.mark.parametrize(("groups", "message"), [
    ([["transformer.wte", "transformer.wpe"], ["transformer.h.9"]], "matches no parameter"),
    ([[""]], "empty prefix"),
    ("transformer.h.0", "must be a list of groups"),
    ([["transformer.wte"], [42]], "must be a module-name prefix or a module"),
    ([["transformer.h.0"], ["transformer.h.1"]], "belong to no group"),
    ([["lm_head"], ["transformer.wte"]], "no trainable parameter of its own"),
])
def test_bad_groups_are_config_errors(groups, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ProgressiveUnfreezer(gpt2(), groups, total_steps=100)


def test_a_module_of_another_model_is_rejected() -> None:
    with pytest.raises(ConfigError, match="not a module of this model"):
        ProgressiveUnfreezer(gpt2(), [gpt2().lm_head], total_steps=10, strict=False)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"total_steps": 0}, "total_steps"),
    ({"total_steps": 100, "top_fraction": 1.5}, "top_fraction"),
    ({"total_steps": 100, "top_fraction": math.nan}, "top_fraction"),
    ({"total_steps": 100, "top_fraction": 0.6}, "all_trainable_fraction"),
])
def test_bad_schedule_arguments_are_config_errors(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        ProgressiveUnfreezer(gpt2(), GPT2_GROUPS, **kwargs)


def test_strict_false_leaves_ungrouped_parameters_training() -> None:
    model = gpt2()
    ProgressiveUnfreezer(model, GPT2_GROUPS[1:-1], total_steps=100, strict=False)
    assert model.transformer.wpe.weight.requires_grad
    assert not model.transformer.h[0].attn.c_attn.weight.requires_grad


def test_optimizer_missing_frozen_parameters_is_a_usage_error() -> None:
    model = gpt2()
    optimizer = torch.optim.AdamW(model.lm_head.parameters(), lr=1e-3)
    with pytest.raises(UsageError, match="would never train"):
        ProgressiveUnfreezer(model, GPT2_GROUPS, total_steps=100, optimizer=optimizer)


def test_bad_steps_and_states_are_usage_errors() -> None:
    unfreezer = ProgressiveUnfreezer(gpt2(), GPT2_GROUPS, total_steps=100)
    with pytest.raises(UsageError, match="step"):
        unfreezer.step(-1)
    with pytest.raises(UsageError, match="other groups"):
        unfreezer.load_state_dict({"step": 3, "starts": [0, 0]})
    with pytest.raises(UsageError, match="not an unfreezer state"):
        unfreezer.load_state_dict({"steps": 3})


def test_guard_trains_through_unfreezing_with_the_warmup_cosine_schedule() -> None:
    model = gpt2()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = warmup_cosine(optimizer, warmup_steps=5, total_steps=40)
    unfreezer = ProgressiveUnfreezer(model, layer_groups(model), total_steps=40,
                                     optimizer=optimizer)
    guard = Guard(model, optimizer, scheduler, config=GuardConfig(sinks={"console": False}))
    bottom = snapshot(unfreezer.params[0])
    for step in range(40):
        unfreezer.step(step)
        ids = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(step))
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        report = guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
        assert report.action in ("applied", "clipped")
        unchanged = torch.equal(unfreezer.params[0][0], bottom[0])
        assert unchanged == (step < unfreezer.starts[0])
    guard.close()
    # nothing went wrong; each group unfrozen after 10 or more frozen steps is named as it starts
    assert {e.kind for e in guard.events} == {"params_unfrozen"}
    assert [e.step for e in guard.events] == sorted(s for s in unfreezer.starts if s >= 10)
    assert optimizer.param_groups[0]["lr"] == 0.0  # the schedule ran to its end
