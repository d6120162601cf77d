"""A small causal transformer trained from scratch, for the faults that warn before the loss moves.

Model: a pre-norm transformer written out here (2 blocks, 64 wide, 4 heads, vocabulary 64,
sequences of 32; no dropout) on a sparse Markov chain language (`trainguard.demo.MarkovLanguage`,
3 likely successors per token): the loss falls from ln(64) to about 1 within 100 steps. AdamW
(betas 0.9, 0.999, eps 1e-8, no weight decay), a 10-step linear warmup to `SANE_LR` = 3e-3.

Fault (guide section 3.1, `lr_too_high`):
    lr_ramp     from step `RAMP_FROM` the LR keeps growing by `RAMP_RATE` per step (a warmup
                that never stops, a scheduler stepped per batch): for some 100 steps the loss
                stays where it was while the LR passes 10x, then 30x the sane LR; the loss
                spikes (about 3x in one step) once the weights can no longer take it, near
                120 steps into the ramp. The gradients outgrow Adam's second moment some steps
                before the loss moves, lower layers first: the signal `instability_precursor`
                reads.

Healthy twins (the false-alarm traps): the same model at the sane LR throughout, and the same
ramp stopped at 10x the sane LR (an LR that rises for 80 steps, then holds, without a spike).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from trainguard.demo.data import MarkovLanguage

from ..base import Batch, Scenario, Workload, lm_eval

VOCAB_SIZE = 64
SEQ_LEN = 32
WIDTH = 64
HEADS = 4
BLOCKS = 2
BATCH_SIZE = 16
STEPS = 220
SANE_LR = 3e-3
WARMUP_STEPS = 10
RAMP_FROM = 50
RAMP_RATE = 1.03
SAFE_CAP = 10.0
"""The healthy ramp stops at this multiple of the sane LR."""
LANGUAGE_SEED = 7
EVAL_BATCHES = 4
_TRAIN_STREAM, _EVAL_STREAM = 0, 1


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.fc = nn.Linear(WIDTH, 4 * WIDTH)
        self.out = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = (t.view(batch, length, HEADS, WIDTH // HEADS).transpose(1, 2)
                   for t in self.qkv(self.ln1(x)).split(WIDTH, -1))
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, WIDTH))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB_SIZE, WIDTH)
        self.pos = nn.Embedding(SEQ_LEN, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))
        self.ln = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB_SIZE, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


@dataclass(frozen=True)
class Recipe:
    ramp_from: int | None = None
    ramp_cap: float | None = None
    """The ramp stops at this multiple of the sane LR (None: it never stops)."""


def lr_factor(step: int, recipe: Recipe) -> float:
    factor = min(1.0, (step + 1) / WARMUP_STEPS)
    if recipe.ramp_from is not None and step >= recipe.ramp_from:
        factor *= RAMP_RATE ** (step - recipe.ramp_from)
        if recipe.ramp_cap is not None:
            factor = min(factor, recipe.ramp_cap)
    return factor


def _generator(seed: int, stream: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(((seed * 7919 + stream) * 1_000_003 + step) * 101)


def _sequences(transition: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    tokens = torch.empty(BATCH_SIZE, SEQ_LEN + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(VOCAB_SIZE, (BATCH_SIZE,), generator=generator)
    for i in range(1, SEQ_LEN + 1):
        tokens[:, i] = torch.multinomial(transition[tokens[:, i - 1]], 1,
                                         generator=generator).squeeze(1)
    return tokens


def next_token_loss(model: nn.Module, tokens: Batch, step: int) -> torch.Tensor:
    del step
    logits = model(tokens[:, :-1]).float()
    return F.cross_entropy(logits.reshape(-1, VOCAB_SIZE), tokens[:, 1:].reshape(-1))


def build(seed: int, recipe: Recipe) -> Workload:
    transition = MarkovLanguage(VOCAB_SIZE, branching=3, seed=LANGUAGE_SEED).transition
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = TinyLM()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=SANE_LR, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, partial(lr_factor, recipe=recipe))
    held_out = [_sequences(transition, _generator(seed, _EVAL_STREAM, i))
                for i in range(EVAL_BATCHES)]

    def batch(step: int, micro: int) -> Batch:
        del micro
        return _sequences(transition, _generator(seed, _TRAIN_STREAM, step))

    return Workload(model=model, optimizer=optimizer, batch=batch, loss=next_token_loss,
                    evaluate=lambda m: lm_eval(m, held_out, next_token_loss),
                    scheduler=scheduler, batch_size=BATCH_SIZE)


def _scenario(name: str, recipe: Recipe, description: str, **fault: object) -> Scenario:
    return Scenario(name=name, family="tiny_lm", build=partial(build, recipe=recipe),
                    steps=STEPS, description=description, **fault)  # type: ignore[arg-type]


BASELINES: dict[str, str] = {"tiny_lm_lr_ramp": "tiny_lm_healthy"}


def scenarios() -> list[Scenario]:
    sane = Recipe()
    growth = f"{100 * (RAMP_RATE - 1):.0f}% a step"
    return [
        _scenario("tiny_lm_healthy", sane,
                  f"a 2-block transformer from scratch, AdamW {SANE_LR:g} after a "
                  f"{WARMUP_STEPS}-step warmup"),
        _scenario("tiny_lm_healthy_capped_ramp",
                  replace(sane, ramp_from=RAMP_FROM, ramp_cap=SAFE_CAP),
                  f"from step {RAMP_FROM} the LR grows {growth} until it is {SAFE_CAP:g}x the "
                  f"sane LR ({SAFE_CAP * SANE_LR:g}), then holds: a rising LR that the model "
                  "takes"),
        _scenario("tiny_lm_lr_ramp", replace(sane, ramp_from=RAMP_FROM),
                  f"from step {RAMP_FROM} the LR grows {growth} and never stops (a warmup "
                  f"without an end): the loss spikes about {math.log(40) / math.log(RAMP_RATE):.0f}"
                  " steps later, once the LR is some 40x the sane one",
                  cause="lr_too_high", onset_step=RAMP_FROM, sudden=False, recoverable=False),
    ]
