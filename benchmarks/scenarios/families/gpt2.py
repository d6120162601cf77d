"""GPT-2 fine-tuning scenarios: full fine-tuning (family "gpt2") and LoRA (family "gpt2_lora").

Model: a real `transformers.GPT2LMHeadModel` built from a config (2 layers, 64 wide, 4 heads,
vocabulary 64, dropout 0 for determinism). It is pre-trained for a few seconds on a sparse Markov
chain language (`trainguard.demo.MarkovLanguage`, 3 likely successors per token), then fine-tuned
on a related language: the same chain with a quarter of its rows given new successors. The
fine-tune loss therefore starts well above its floor (the pre-trained model is confidently wrong on
those rows) and really falls. LoRA scenarios wrap the same pre-trained model with `peft`
(adapters on c_attn, c_proj and c_fc; the base weights are frozen). The `gpt2_scratch_*`
scenarios train the same model from the fixed random initialisation pre-training starts from.

Tiny models want larger learning rates than the guide's 7B ranges, so each mode has a calibrated
sane LR with a 20-step linear warmup then cosine decay over 200 steps: `SANE_FULL_LR` = 3e-3 (full
fine-tuning trains equally well from 3e-3 to about 0.1 with warmup) and `SANE_LORA_LR` = 5e-3,
the top of the guide's LoRA range, which LoRA is judged on whatever the model's size (eval loss
1.036 against 1.013 at 2e-2; 5e-2 still trains, 1.015; 0.1 breaks it, 3.03). The full
fine-tuning LR fault is the guide's 100x; the LoRA one is 20x (0.1), where this model breaks.

Faults (guide sections from `trainguard.diagnose.causes`):
    lr_too_high (3.1)          100x the sane full fine-tuning LR; 20x the sane LoRA LR. Adam's
                               per-step update is about lr in every weight, so the pre-trained
                               weights are thrown far from the basin the fine-tune starts in.
    missing_warmup (3.1, 6)    5e-2 without warmup. With the 20-step warmup this LR trains as well
                               as the sane one; without it, Adam's first steps move every weight
                               by about lr at once, before its moment estimates have settled, and
                               the model never recovers within the run.
    lora_scaling (5.1)         lora_alpha / r = 256 at the sane LoRA LR: the adapter's effective
                               step is 256 times larger. (At 5e-3 an alpha/r of 64 still trains,
                               1.020; 256 breaks it, 2.32.)
    tokenizer_mismatch (3.2)   (a) the training data is encoded with a wrong vocabulary (a fixed
                               permutation of ids) from step 0: the loss starts far above the
                               pre-trained model's, then falls as the model learns a scrambled
                               language, which ruins it on correctly encoded text; (b) one batch
                               at the onset step holds ids from a larger vocabulary (>= 64): the
                               embedding lookup raises an IndexError; (c) the 10 batches from
                               the onset step come from a shard encoded with the permuted
                               vocabulary of (a), then the data is clean again: Adam learns the
                               scrambled language for those steps, and an unprotected run ends
                               measurably worse than the healthy one.
    numerical_op (3.3.2)       a confidence regulariser sum(p * log p) whose softmax temperature
                               collapses at the onset step: the softmax underflows to exact zeros,
                               0 * log(0) is NaN, and so are the loss and every gradient.
                               Transient: the schedule the loop hands its scheduler is 100x for
                               6 steps from the onset, then back (gpt2_transient_lr; and from
                               the random initialisation, gpt2_scratch_transient_lr, where the
                               updates after the fault still teach the model most of what it
                               learns).
    lr_too_low (3.1)           1e-5x the sane full fine-tuning LR: the loss never comes down,
                               with nothing else wrong (a stall: `no_progress`, `stalled`).
    lr_at_zero (3.1)           the scheduler is told half the run's length: its cosine reaches
                               0 halfway and holds it there, so the second half trains nothing.
    weight_decay_coupled (3.1) the loop builds torch.optim.Adam with weight_decay=0.1, AdamW's
                               setting: Adam adds it to the gradient as an L2 term, which
                               outweighs the gradient on most weights and steers every step
                               toward 0 (unguarded, the held-out loss ends at 1.59 on seed 0
                               against the AdamW run's 0.93).
    loss_reduction (3.4)       from the onset step the loop sums the token losses where it
                               averaged them (the division by their count forgotten): the loss
                               and every gradient are 16 x 31 = 496 times larger. Adam's steps
                               hardly depend on the loss's scale, so training goes on; the loss
                               the run reports no longer says how the model does.
    batch_truncated (3.4.2)    from the onset step the loader silently yields 2 sequences
                               instead of 16, so the gradient noise grows past what the LR was
                               tuned for. On this tiny model that degrades the fine-tune (about
                               as much as training with batches of 2 throughout) but does not
                               break it.

Healthy variations that move the gradient's size or the LR by design (the false-alarm traps):
a length curriculum that restarts (sequences of 8 growing to 32 tokens over 60 steps, again and
again: the batch's noise jumps up at each restart), batches of each their own length (grouped by
length), and a cosine schedule with warm restarts (the LR back at its top every 50 steps).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from trainguard.demo.data import MarkovLanguage

from ..base import Batch, Scenario, Workload, lm_eval
from ..pretrain import pretrained

if TYPE_CHECKING:
    from transformers import GPT2Config

VOCAB_SIZE = 64
SEQ_LEN = 32
BATCH_SIZE = 16
STEPS = 200
LANGUAGE_SEED = 7
CHANGED_ROW_SHARE = 0.25
"""Share of the pre-training chain's rows that the fine-tuning language gives new successors."""
EVAL_BATCHES = 4

SANE_FULL_LR = 3e-3
SANE_LORA_LR = 5e-3
WARMUP_STEPS = 20
MISSING_WARMUP_LR = 5e-2
ONSET_STEP = 60
TRANSIENT_LR_STEPS = 6
"""Steps of the transient LR fault at 100x before the schedule is back."""
MIN_LENGTH = 8
"""The shortest sequences of the healthy length variations (7 positions predicted)."""
LENGTH_CYCLE = 60
"""Steps over which the length curriculum grows the sequences before it starts short again."""
RESTART_EVERY = 50
"""The period of the cosine with warm restarts."""

PRETRAIN_KEY = "gpt2_l2_e64_h4_v64_markov7_b3_adamw5e-3_s150_b32_t1_v2"
PRETRAIN_STEPS = 150
PRETRAIN_LR = 5e-3

# Separate random streams so that training, held-out and pre-training data never overlap.
_TRAIN_STREAM, _EVAL_STREAM, _PRETRAIN_STREAM, _VOCABULARY_STREAM = 0, 1, 2, 3


def _stream_seed(seed: int, stream: int, step: int, micro: int = 0) -> int:
    return ((seed * 7919 + stream) * 1_000_003 + step) * 101 + micro


def _generator(seed: int, stream: int, step: int, micro: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(_stream_seed(seed, stream, step, micro))


# -- the languages -------------------------------------------------------------------------------
def pretraining_transition() -> torch.Tensor:
    return MarkovLanguage(VOCAB_SIZE, branching=3, seed=LANGUAGE_SEED).transition


def finetuning_transition() -> torch.Tensor:
    """The pre-training chain with a quarter of its rows given new successors."""
    transition = pretraining_transition().clone()
    generator = torch.Generator().manual_seed(LANGUAGE_SEED + 1000)
    changed = torch.randperm(VOCAB_SIZE, generator=generator)[:int(VOCAB_SIZE * CHANGED_ROW_SHARE)]
    for token in changed.tolist():
        logits = torch.full((VOCAB_SIZE,), -1e9)
        successors = torch.randperm(VOCAB_SIZE, generator=generator)[:3]
        logits[successors] = torch.randn(3, generator=generator)
        transition[token] = torch.softmax(logits, dim=-1)
    return transition


def sample_sequences(transition: torch.Tensor, batch_size: int,
                     generator: torch.Generator, length: int = SEQ_LEN) -> torch.Tensor:
    tokens = torch.empty(batch_size, length, dtype=torch.long)
    tokens[:, 0] = torch.randint(VOCAB_SIZE, (batch_size,), generator=generator)
    for i in range(1, length):
        tokens[:, i] = torch.multinomial(transition[tokens[:, i - 1]], 1,
                                         generator=generator).squeeze(1)
    return tokens


# -- the model -----------------------------------------------------------------------------------
def gpt2_config() -> GPT2Config:
    from transformers import GPT2Config

    return GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB_SIZE, n_positions=64,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                      bos_token_id=None, eos_token_id=None)


def _pretrain(model: nn.Module) -> None:
    """A few seconds of AdamW on the pre-training chain, from a fixed initialisation."""
    from transformers import GPT2LMHeadModel

    # A fixed initialisation: the cached weights must not depend on the caller's RNG state.
    with torch.random.fork_rng():
        torch.manual_seed(LANGUAGE_SEED)
        model.load_state_dict(GPT2LMHeadModel(gpt2_config()).state_dict())
    transition = pretraining_transition()
    optimizer = torch.optim.AdamW(model.parameters(), lr=PRETRAIN_LR, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, partial(warmup_cosine, warmup=10, total=PRETRAIN_STEPS))
    model.train()
    # pretrain.pretrained runs this on one thread, so the cached weights do not depend on the
    # thread count of whichever process trains them first
    for step in range(PRETRAIN_STEPS):
        tokens = sample_sequences(transition, 32, _generator(0, _PRETRAIN_STREAM, step))
        next_token_loss(model, tokens).backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)


def pretrained_gpt2() -> nn.Module:
    from transformers import GPT2LMHeadModel

    return pretrained(PRETRAIN_KEY, GPT2LMHeadModel(gpt2_config()), _pretrain)


def scratch_gpt2() -> nn.Module:
    """The model at the fixed initialisation pre-training starts from."""
    from transformers import GPT2LMHeadModel

    with torch.random.fork_rng():
        torch.manual_seed(LANGUAGE_SEED)
        return GPT2LMHeadModel(gpt2_config())


def next_token_logits(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    return model(input_ids=tokens[:, :-1]).logits.float()


def next_token_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = next_token_logits(model, tokens)
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))


def warmup_cosine(step: int, warmup: int, total: int) -> float:
    """LR multiplier: linear warmup over `warmup` steps, then cosine decay to 0 at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return 0.5 * (1.0 + math.cos(math.pi * progress))


# -- a recipe: everything a scenario varies ------------------------------------------------------
@dataclass(frozen=True)
class Recipe:
    lora: bool = False
    lr: float = SANE_FULL_LR
    warmup_steps: int = WARMUP_STEPS
    steps: int = STEPS
    batch_size: int = BATCH_SIZE
    accumulation: int = 1
    autocast: torch.dtype | None = None
    lora_r: int = 8
    lora_alpha: int = 8
    lora_dropout: float = 0.1
    from_scratch: bool = False
    """Train the model from its fixed random initialisation instead of the pre-trained weights:
    the loss falls from chance for most of the run, so the updates of every stretch count."""
    # Faults (all off by default).
    permuted_vocabulary: bool = False
    """tokenizer_mismatch (a): every training batch is encoded with a permuted vocabulary."""
    foreign_ids_at: int | None = None
    """tokenizer_mismatch (b): the batch of this step holds ids from a larger vocabulary."""
    permuted_shard_at: int | None = None
    """tokenizer_mismatch (c): the PERMUTED_SHARD_STEPS batches from this step come from a shard
    encoded with a permuted vocabulary."""
    temperature_collapse_at: int | None = None
    """numerical_op: from this step the regulariser's softmax temperature collapses."""
    truncated_from: int | None = None
    truncated_size: int = 2
    """batch_truncated: from `truncated_from` on, batches hold `truncated_size` sequences."""
    lr_jump_at: int | None = None
    lr_jump: float = 1.0
    lr_jump_steps: int | None = None
    """lr_too_high (a user's change): from this step the loop multiplies the LR by `lr_jump`
    and leaves it there, or for `lr_jump_steps` steps only (then the schedule is back)."""
    lr_ramp_from: int | None = None
    lr_ramp_rate: float = 1.05
    """lr_too_high (gradual): from this step the LR grows by `lr_ramp_rate` per step (a
    scheduler stepped far too often, a warmup that never stops)."""
    late_group_at: int | None = None
    late_group_lr: float = 0.0
    coupled_decay: float | None = None
    """weight_decay_coupled: the optimizer is torch.optim.Adam with this weight_decay (AdamW's
    setting given to Adam, which adds it to the gradient)."""
    """lr_too_high (a late group): the first transformer block starts frozen and outside the
    optimizer; at this step the loop unfreezes it and adds it with `late_group_lr`."""
    no_backward_from: int | None = None
    """no_gradients: from this step the loop forgets `loss.backward()`."""
    no_zero_grad_from: int | None = None
    """grads_not_cleared: from this step the loop forgets `optimizer.zero_grad()`."""
    schedule_steps: int | None = None
    """lr_at_zero: the scheduler is told the run is this many steps long (one epoch of two
    counted), so its decay reaches 0 there and holds it for the rest of the run."""
    summed_loss_from: int | None = None
    """loss_reduction: from this step the loop sums the token losses instead of averaging
    them."""
    # Healthy variations of what the loop feeds and how its LR moves.
    length_cycle: int | None = None
    """A length curriculum: sequences grow from MIN_LENGTH to SEQ_LEN tokens over this many
    steps, then start short again (a curriculum sampler that restarts each epoch)."""
    random_lengths: bool = False
    """Each batch has its own length between MIN_LENGTH and SEQ_LEN (batches grouped by length,
    as `group_by_length` makes them)."""
    restart_every: int | None = None
    """After the warmup, cosine decay to 0 over this many steps, then back at the top LR
    (`CosineAnnealingWarmRestarts`)."""


FOREIGN_VOCAB_SIZE = 100
"""Size of the larger vocabulary that the foreign batch was encoded with."""
FOREIGN_ROWS = 4
PERMUTED_SHARD_STEPS = 10
"""Length, in steps, of the wrongly encoded shard of the tokenizer_shard scenario."""
REGULARISER_WEIGHT = 0.01
SANE_TEMPERATURE = 1.0
COLLAPSED_TEMPERATURE = 1e-3


def confidence_regulariser(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Negative entropy sum(p * log p) of the tempered softmax, written without clamping."""
    p = torch.softmax(logits / temperature, dim=-1)
    return (p * torch.log(p)).sum(-1).mean()


def build(seed: int, recipe: Recipe) -> Workload:
    transition = finetuning_transition()
    model = scratch_gpt2() if recipe.from_scratch else pretrained_gpt2()
    if recipe.lora:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=recipe.lora_r, lora_alpha=recipe.lora_alpha,
                          lora_dropout=recipe.lora_dropout, fan_in_fan_out=True,
                          target_modules=["c_attn", "c_proj", "c_fc"])
        with warnings.catch_warnings():
            # peft still calls a transformers helper that transformers 5 deprecates.
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing",
                                    category=FutureWarning)
            model = get_peft_model(model, lora)
    model.train()
    late = list(model.transformer.h[0].parameters()) if recipe.late_group_at is not None else []
    for p in late:
        p.requires_grad_(False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = (torch.optim.AdamW(trainable, lr=recipe.lr, weight_decay=0.01)
                 if recipe.coupled_decay is None else
                 torch.optim.Adam(trainable, lr=recipe.lr, weight_decay=recipe.coupled_decay))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, partial(user_schedule, recipe=recipe))

    def before_step(step: int) -> None:
        if step == recipe.late_group_at:  # progressive unfreezing done by hand
            for p in late:
                p.requires_grad_(True)
            optimizer.add_param_group({"params": late, "lr": recipe.late_group_lr,
                                       "initial_lr": recipe.late_group_lr})
            # the schedule must know the new group too (LambdaLR zips its lists strictly)
            scheduler.base_lrs.append(recipe.late_group_lr)
            scheduler.lr_lambdas.append(scheduler.lr_lambdas[0])
    held_out = [sample_sequences(transition, BATCH_SIZE, _generator(seed, _EVAL_STREAM, i))
                for i in range(EVAL_BATCHES)]
    wrong_vocabulary = torch.randperm(VOCAB_SIZE, generator=_generator(seed, _VOCABULARY_STREAM, 0))

    def batch(step: int, micro: int) -> Batch:
        size = recipe.batch_size
        if recipe.truncated_from is not None and step >= recipe.truncated_from:
            size = recipe.truncated_size
        generator = _generator(seed, _TRAIN_STREAM, step, micro)
        tokens = sample_sequences(transition, size, generator, sequence_length(step, recipe,
                                                                               generator))
        shard = recipe.permuted_shard_at
        if recipe.permuted_vocabulary or (
                shard is not None and shard <= step < shard + PERMUTED_SHARD_STEPS):
            tokens = wrong_vocabulary[tokens]
        if step == recipe.foreign_ids_at:
            # A few rows come from a source tokenized with a larger vocabulary.
            tokens[:FOREIGN_ROWS] = torch.randint(VOCAB_SIZE, FOREIGN_VOCAB_SIZE,
                                                  (FOREIGN_ROWS, SEQ_LEN), generator=generator)
        return tokens

    def loss(model: nn.Module, tokens: Batch, step: int) -> torch.Tensor:
        summed = recipe.summed_loss_from
        if summed is not None and 0 <= summed <= step:
            # the masked-loss path's sum, with its division by the token count forgotten
            logits = next_token_logits(model, tokens)
            return F.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                   tokens[:, 1:].reshape(-1), reduction="sum")
        if recipe.temperature_collapse_at is None or step < 0:
            return next_token_loss(model, tokens)
        logits = next_token_logits(model, tokens)
        task = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))
        # The temperature bug: from the onset step the logits are divided by a tiny value, so all
        # but the top token get probability exactly 0 and log(0) = -inf.
        temperature = (COLLAPSED_TEMPERATURE if step >= recipe.temperature_collapse_at
                       else SANE_TEMPERATURE)
        return task + REGULARISER_WEIGHT * confidence_regulariser(logits, temperature)

    no_backward, no_zero_grad = recipe.no_backward_from, recipe.no_zero_grad_from
    return Workload(model=model, optimizer=optimizer, batch=batch, loss=loss,
                    evaluate=lambda m: lm_eval(m, held_out, loss), scheduler=scheduler,
                    autocast=recipe.autocast, accumulation=recipe.accumulation,
                    batch_size=recipe.batch_size,
                    before_step=before_step if recipe.late_group_at is not None else None,
                    skips_backward=(None if no_backward is None
                                    else lambda step: step >= no_backward),
                    skips_zero_grad=(None if no_zero_grad is None
                                     else lambda step: step >= no_zero_grad))


def sequence_length(step: int, recipe: Recipe, generator: torch.Generator) -> int:
    """The length of the sequences of step `step`'s batch."""
    if recipe.length_cycle is not None:
        into = step % recipe.length_cycle
        return MIN_LENGTH + into * (SEQ_LEN - MIN_LENGTH) // max(1, recipe.length_cycle - 1)
    if recipe.random_lengths:
        return int(torch.randint(MIN_LENGTH, SEQ_LEN + 1, (1,), generator=generator))
    return SEQ_LEN


def user_schedule(step: int, recipe: Recipe) -> float:
    """The LR multiplier the loop applies: warmup + cosine (or cosine with warm restarts),
    times the user's own changes."""
    if recipe.restart_every is not None and step >= recipe.warmup_steps:
        into = (step - recipe.warmup_steps) % recipe.restart_every
        return 0.5 * (1.0 + math.cos(math.pi * into / recipe.restart_every))
    factor = warmup_cosine(step, recipe.warmup_steps, recipe.schedule_steps or recipe.steps)
    if recipe.lr_jump_at is not None and step >= recipe.lr_jump_at and (
            recipe.lr_jump_steps is None or step < recipe.lr_jump_at + recipe.lr_jump_steps):
        factor *= recipe.lr_jump
    if recipe.lr_ramp_from is not None and step >= recipe.lr_ramp_from:
        # the schedule stops where the ramp starts, and the LR climbs from there
        factor = (warmup_cosine(recipe.lr_ramp_from, recipe.warmup_steps, recipe.steps)
                  * recipe.lr_ramp_rate ** (step - recipe.lr_ramp_from))
    return factor


def _scenario(name: str, recipe: Recipe, description: str, **fault: Any) -> Scenario:
    return Scenario(name=name, family="gpt2_lora" if recipe.lora else "gpt2",
                    build=partial(build, recipe=recipe), steps=recipe.steps,
                    description=description, **fault)


BASELINES: dict[str, str] = {
    # full fine-tunes in fp32, batch 16: the plain healthy run
    "gpt2_lr_too_high": "gpt2_healthy",
    "gpt2_missing_warmup": "gpt2_healthy",
    "gpt2_tokenizer_permuted": "gpt2_healthy",
    "gpt2_tokenizer_foreign_ids": "gpt2_healthy",
    "gpt2_tokenizer_shard": "gpt2_healthy",
    "gpt2_numerical_op": "gpt2_healthy",
    "gpt2_batch_truncated": "gpt2_healthy",
    "gpt2_user_lr_jump": "gpt2_healthy",
    "gpt2_transient_lr": "gpt2_healthy",
    # trained from the random initialisation
    "gpt2_scratch_transient_lr": "gpt2_scratch_healthy",
    "gpt2_lr_ramp": "gpt2_healthy",
    "gpt2_late_group_lr": "gpt2_healthy",
    "gpt2_forgotten_backward": "gpt2_healthy",
    "gpt2_forgotten_zero_grad": "gpt2_healthy",
    "gpt2_schedule_too_short": "gpt2_healthy",
    "gpt2_loss_summed": "gpt2_healthy",
    "gpt2_lr_too_low": "gpt2_healthy",
    "gpt2_adam_coupled_decay": "gpt2_healthy",
    # LoRA r=8 at the sane LoRA LR
    "gpt2_lora_lr_too_high": "gpt2_lora_healthy",
    "gpt2_lora_scaling": "gpt2_lora_healthy",
}
"""The healthy scenario of the same model and precision that each faulty one is measured
against (its final eval loss under no protection is the reference)."""


def scenarios() -> list[Scenario]:
    full = Recipe()
    lora = Recipe(lora=True, lr=SANE_LORA_LR)
    scratch = Recipe(from_scratch=True)
    sane = f"AdamW {SANE_FULL_LR:g} with {WARMUP_STEPS}-step warmup + cosine"
    sane_lora = f"AdamW {SANE_LORA_LR:g} with {WARMUP_STEPS}-step warmup + cosine"
    warmup_multiple = MISSING_WARMUP_LR / SANE_FULL_LR
    return [
        # -- healthy ------------------------------------------------------------------------------
        _scenario("gpt2_healthy", full, f"full fine-tune, fp32, batch {BATCH_SIZE}, sane {sane}"),
        _scenario("gpt2_healthy_no_warmup", replace(full, lr=SANE_FULL_LR / 3, warmup_steps=0),
                  f"full fine-tune without warmup at a modest LR {SANE_FULL_LR / 3:.0e} "
                  "(a third of the sane LR), cosine decay"),
        _scenario("gpt2_healthy_bf16", replace(full, autocast=torch.bfloat16),
                  f"full fine-tune under bf16 autocast, sane {sane}"),
        _scenario("gpt2_healthy_accumulation", replace(full, batch_size=4, accumulation=4),
                  f"full fine-tune, 4 accumulated micro-batches of 4, sane {sane}"),
        _scenario("gpt2_healthy_small_batch", replace(full, batch_size=2),
                  f"full fine-tune with noisy batches of 2 sequences, sane {sane}"),
        _scenario("gpt2_scratch_healthy", scratch,
                  f"the same GPT-2 trained from its random initialisation (no pre-training), "
                  f"fp32, batch {BATCH_SIZE}, {sane}: the loss falls from chance all run long"),
        _scenario("gpt2_healthy_length_curriculum", replace(full, length_cycle=LENGTH_CYCLE),
                  f"full fine-tune whose sequences grow from {MIN_LENGTH} to {SEQ_LEN} tokens "
                  f"over {LENGTH_CYCLE} steps, then start short again (a curriculum that "
                  f"restarts), sane {sane}"),
        _scenario("gpt2_healthy_group_by_length", replace(full, random_lengths=True),
                  f"full fine-tune whose batches each have their own length, {MIN_LENGTH} to "
                  f"{SEQ_LEN} tokens (grouped by length), sane {sane}"),
        _scenario("gpt2_healthy_warm_restarts", replace(full, restart_every=RESTART_EVERY),
                  f"full fine-tune, AdamW {SANE_FULL_LR:g} with a {WARMUP_STEPS}-step warmup, "
                  f"then cosine decay to 0 over {RESTART_EVERY} steps and back to the top LR, "
                  "again and again (cosine with warm restarts)"),
        _scenario("gpt2_lora_healthy", lora,
                  f"LoRA r=8 alpha=8 (alpha/r=1), lora_dropout 0.1, sane {sane_lora}"),
        _scenario("gpt2_lora_healthy_alpaca", replace(lora, lora_alpha=16),
                  f"LoRA r=8 alpha=16 (alpha/r=2, alpaca-lora's setting), lora_dropout 0.1, "
                  f"sane {sane_lora}"),
        # -- faulty -------------------------------------------------------------------------------
        _scenario("gpt2_lr_too_high", replace(full, lr=100 * SANE_FULL_LR),
                  f"full fine-tune at {100 * SANE_FULL_LR:g} = 100x the sane LR "
                  f"{SANE_FULL_LR:g} (warmup + cosine kept)",
                  cause="lr_too_high", onset_step=0, sudden=False, recoverable=False),
        _scenario("gpt2_lora_lr_too_high", replace(lora, lr=20 * SANE_LORA_LR),
                  f"LoRA r=8 alpha=8 at {20 * SANE_LORA_LR:g} = 20x the sane LoRA LR "
                  f"{SANE_LORA_LR:g} (warmup + cosine kept)",
                  cause="lr_too_high", onset_step=0, sudden=False, recoverable=False),
        _scenario("gpt2_missing_warmup", replace(full, lr=MISSING_WARMUP_LR, warmup_steps=0),
                  f"full fine-tune at {MISSING_WARMUP_LR:g} (~{warmup_multiple:.0f}x the sane "
                  f"LR), cosine but no warmup; the same LR trains well with a {WARMUP_STEPS}-step "
                  "warmup",
                  cause="missing_warmup", onset_step=0, sudden=False, recoverable=False),
        _scenario("gpt2_lora_scaling", replace(lora, lora_alpha=2048),
                  f"LoRA r=8 alpha=2048 (alpha/r=256), lora_dropout 0.1, sane {sane_lora}",
                  cause="lora_scaling", onset_step=0, sudden=False, recoverable=False),
        _scenario("gpt2_tokenizer_permuted", replace(full, permuted_vocabulary=True),
                  f"training data encoded with a wrong vocabulary (a fixed permutation of the "
                  f"{VOCAB_SIZE} ids) from step 0; held-out data encoded correctly",
                  cause="tokenizer_mismatch", onset_step=0, sudden=False, recoverable=False),
        _scenario("gpt2_tokenizer_foreign_ids", replace(full, foreign_ids_at=ONSET_STEP),
                  f"at step {ONSET_STEP}, {FOREIGN_ROWS} sequences of the batch come from a "
                  f"{FOREIGN_VOCAB_SIZE}-token vocabulary (ids >= {VOCAB_SIZE})",
                  cause="tokenizer_mismatch", onset_step=ONSET_STEP, sudden=True,
                  recoverable=True),
        _scenario("gpt2_tokenizer_shard", replace(full, permuted_shard_at=ONSET_STEP),
                  f"the {PERMUTED_SHARD_STEPS} batches from step {ONSET_STEP} come from a shard "
                  "encoded with a wrong vocabulary (a permutation of the ids), then clean data "
                  "again",
                  cause="tokenizer_mismatch", onset_step=ONSET_STEP, sudden=True,
                  recoverable=True),
        _scenario("gpt2_numerical_op", replace(full, temperature_collapse_at=ONSET_STEP),
                  f"loss + {REGULARISER_WEIGHT:g} * sum(p log p) with an unclamped log; from step "
                  f"{ONSET_STEP} a temperature bug ({COLLAPSED_TEMPERATURE:g}) underflows the "
                  "softmax to exact 0, so the loss is NaN",
                  cause="numerical_op", onset_step=ONSET_STEP, sudden=True, recoverable=False),
        _scenario("gpt2_user_lr_jump", replace(full, lr_jump_at=ONSET_STEP, lr_jump=100.0),
                  f"the training loop multiplies the LR by 100 at step {ONSET_STEP} and leaves "
                  "it there (a user's own LR change)",
                  cause="lr_too_high", onset_step=ONSET_STEP, sudden=True, recoverable=False),
        _scenario("gpt2_transient_lr",
                  replace(full, lr_jump_at=ONSET_STEP, lr_jump=100.0,
                          lr_jump_steps=TRANSIENT_LR_STEPS),
                  f"the training loop's schedule multiplies the LR by 100 at step {ONSET_STEP} "
                  f"for {TRANSIENT_LR_STEPS} steps, then the schedule is back (a user's LR "
                  "change undone)",
                  cause="lr_too_high", onset_step=ONSET_STEP, sudden=True, recoverable=True),
        _scenario("gpt2_scratch_transient_lr",
                  replace(scratch, lr_jump_at=ONSET_STEP, lr_jump=100.0,
                          lr_jump_steps=TRANSIENT_LR_STEPS),
                  f"gpt2_transient_lr from the random initialisation: the LR x100 at step "
                  f"{ONSET_STEP} for {TRANSIENT_LR_STEPS} steps, while the model is still far "
                  "from trained",
                  cause="lr_too_high", onset_step=ONSET_STEP, sudden=True, recoverable=True),
        _scenario("gpt2_lr_ramp", replace(full, lr_ramp_from=ONSET_STEP, lr_ramp_rate=1.05),
                  f"from step {ONSET_STEP} the LR grows 5% a step (x130 over 100 steps: a "
                  "scheduler stepped per batch instead of per epoch)",
                  cause="lr_too_high", onset_step=ONSET_STEP, sudden=False, recoverable=False),
        _scenario("gpt2_late_group_lr",
                  replace(full, late_group_at=ONSET_STEP, late_group_lr=100 * SANE_FULL_LR),
                  f"the first block starts frozen; at step {ONSET_STEP} the loop unfreezes it and "
                  f"adds it to the optimizer at {100 * SANE_FULL_LR:g} (100x the sane LR, the "
                  "head's LR given to a pre-trained block)",
                  cause="lr_too_high", onset_step=ONSET_STEP, sudden=True, recoverable=False),
        _scenario("gpt2_lr_too_low", replace(full, lr=1e-5 * SANE_FULL_LR),
                  f"full fine-tune at {1e-5 * SANE_FULL_LR:g} = 1e-5x the sane LR (warmup + "
                  "cosine kept): nothing moves, everything stays calm and finite",
                  cause="lr_too_low", onset_step=0, sudden=False, recoverable=False),
        _scenario("gpt2_adam_coupled_decay", replace(full, coupled_decay=0.1),
                  "full fine-tune with torch.optim.Adam(weight_decay=0.1), AdamW's setting: the "
                  "L2 term Adam adds to the gradient outweighs it and steers every step toward 0",
                  cause="weight_decay_coupled", onset_step=0, sudden=False, recoverable=False),
        _scenario("gpt2_forgotten_backward", replace(full, no_backward_from=ONSET_STEP),
                  f"from step {ONSET_STEP} the loop forgets loss.backward(): nothing trains",
                  cause="no_gradients", onset_step=ONSET_STEP, sudden=True, recoverable=False),
        _scenario("gpt2_forgotten_zero_grad", replace(full, no_zero_grad_from=ONSET_STEP - 1),
                  f"from step {ONSET_STEP} the loop no longer clears the gradients (its "
                  "optimizer.zero_grad() moved under a branch that stopped running): each "
                  "update applies the sum of every gradient since",
                  cause="grads_not_cleared", onset_step=ONSET_STEP, sudden=True,
                  recoverable=False),
        _scenario("gpt2_schedule_too_short", replace(full, schedule_steps=STEPS // 2),
                  f"the scheduler is told the run lasts {STEPS // 2} steps (one epoch of two "
                  f"counted): its cosine reaches 0 at step {STEPS // 2} and the LR stays there "
                  "for the rest of the run, which trains nothing",
                  cause="lr_at_zero", onset_step=STEPS // 2, sudden=False, recoverable=False),
        _scenario("gpt2_loss_summed", replace(full, summed_loss_from=ONSET_STEP),
                  f"from step {ONSET_STEP} the loop sums the token losses where it averaged "
                  f"them ({BATCH_SIZE} x {SEQ_LEN - 1} = {BATCH_SIZE * (SEQ_LEN - 1)}x the "
                  "mean): the division by their count forgotten",
                  cause="loss_reduction", onset_step=ONSET_STEP, sudden=True,
                  recoverable=False),
        _scenario("gpt2_batch_truncated",
                  replace(full, truncated_from=ONSET_STEP, truncated_size=2),
                  f"from step {ONSET_STEP} the loader silently yields 2 sequences instead of "
                  f"{BATCH_SIZE}, at the sane LR tuned for {BATCH_SIZE}; on this tiny model it "
                  "degrades the fine-tune rather than breaking it",
                  cause="batch_truncated", onset_step=ONSET_STEP, sudden=False,
                  recoverable=False),
    ]
