"""A small causal transformer whose attention logits grow until the loss spikes.

Model: a pre-norm transformer written out here (2 blocks, 64 wide, 4 heads, vocabulary 64; no
dropout), optionally with QK-norm (a LayerNorm on each head's q and k, Dehghani et al. 2023).
Task: sequences of 32 tokens whose first 17 follow a sparse Markov chain
(`trainguard.demo.MarkovLanguage`, 3 likely successors per token) and whose rest repeats them,
so that attention pays (copying wants one sharp look back). AdamW (betas 0.9, 0.999, eps 1e-8,
no weight decay), a 30-step linear warmup to a constant LR.

Fault (`attention_logit_growth`):
    no_qk_norm   the LR is `HIGH_LR` (0.1) without QK-norm: the loss falls to the Markov level
                 (~1.2) and holds there while the second block's largest attention logit grows
                 from ~50 to thousands; attention collapses onto one key and the loss spikes
                 (about 3x in a few steps) 200-300 steps in (seeds 0-5 under `observe`). The
                 logits keep growing for over a hundred steps before that: the signal
                 `instability_precursor` reads from `probes/attention_logits.py`.

Healthy twins (the false-alarm traps): the same model and LR with QK-norm (its logits stay
below 30), and the same model without QK-norm at the safe LR `SAFE_LR` (0.01).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
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
HEAD_DIM = WIDTH // HEADS
BLOCKS = 2
BATCH_SIZE = 16
STEPS = 300
HIGH_LR = 0.1
SAFE_LR = 0.01
WARMUP_STEPS = 30
LANGUAGE_SEED = 7
EVAL_BATCHES = 4
_TRAIN_STREAM, _EVAL_STREAM = 0, 1


class Block(nn.Module):
    num_heads = HEADS
    """Read by the attention probe to split the `qkv` output into heads."""
    is_causal = True

    def __init__(self, qk_norm: bool) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.fc = nn.Linear(WIDTH, 4 * WIDTH)
        self.out = nn.Linear(4 * WIDTH, WIDTH)
        self.q_norm = nn.LayerNorm(HEAD_DIM) if qk_norm else None
        self.k_norm = nn.LayerNorm(HEAD_DIM) if qk_norm else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = (t.view(batch, length, HEADS, HEAD_DIM)
                   for t in self.qkv(self.ln1(x)).split(WIDTH, -1))
        if self.q_norm is not None and self.k_norm is not None:  # (batch, length, heads, d)
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, length, WIDTH))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyAttn(nn.Module):
    def __init__(self, qk_norm: bool) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB_SIZE, WIDTH)
        self.pos = nn.Embedding(SEQ_LEN, WIDTH)
        self.blocks = nn.ModuleList(Block(qk_norm) for _ in range(BLOCKS))
        self.ln = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB_SIZE, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


@dataclass(frozen=True)
class Recipe:
    lr: float
    qk_norm: bool = False


def warmup(step: int) -> float:
    return min(1.0, (step + 1) / WARMUP_STEPS)


def _generator(seed: int, stream: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(((seed * 7919 + stream) * 1_000_003 + step) * 103)


def _sequences(transition: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """SEQ_LEN + 1 tokens: a Markov chain of HALF tokens, then the chain again."""
    half = SEQ_LEN // 2 + 1
    chain = torch.empty(BATCH_SIZE, half, dtype=torch.long)
    chain[:, 0] = torch.randint(VOCAB_SIZE, (BATCH_SIZE,), generator=generator)
    for i in range(1, half):
        chain[:, i] = torch.multinomial(transition[chain[:, i - 1]], 1,
                                        generator=generator).squeeze(1)
    return torch.cat([chain, chain], 1)[:, :SEQ_LEN + 1]


def next_token_loss(model: nn.Module, tokens: Batch, step: int) -> torch.Tensor:
    del step
    logits = model(tokens[:, :-1]).float()
    return F.cross_entropy(logits.reshape(-1, VOCAB_SIZE), tokens[:, 1:].reshape(-1))


def build(seed: int, recipe: Recipe) -> Workload:
    transition = MarkovLanguage(VOCAB_SIZE, branching=3, seed=LANGUAGE_SEED).transition
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = TinyAttn(recipe.qk_norm)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup)
    held_out = [_sequences(transition, _generator(seed, _EVAL_STREAM, i))
                for i in range(EVAL_BATCHES)]

    def batch(step: int, micro: int) -> Batch:
        del micro
        return _sequences(transition, _generator(seed, _TRAIN_STREAM, step))

    return Workload(model=model, optimizer=optimizer, batch=batch, loss=next_token_loss,
                    evaluate=lambda m: lm_eval(m, held_out, next_token_loss),
                    scheduler=scheduler, batch_size=BATCH_SIZE)


def _scenario(name: str, recipe: Recipe, description: str, **fault: object) -> Scenario:
    return Scenario(name=name, family="tiny_attn", build=partial(build, recipe=recipe),
                    steps=STEPS, description=description, **fault)  # type: ignore[arg-type]


BASELINES: dict[str, str] = {"tiny_attn_no_qk_norm": "tiny_attn_healthy_qk_norm"}


def scenarios() -> list[Scenario]:
    chance = math.log(VOCAB_SIZE)
    return [
        _scenario("tiny_attn_healthy_qk_norm", Recipe(HIGH_LR, qk_norm=True),
                  f"a 2-block transformer on a Markov chain and its copy, AdamW {HIGH_LR:g} "
                  "with QK-norm: the attention logits stay bounded"),
        _scenario("tiny_attn_healthy_safe_lr", Recipe(SAFE_LR),
                  f"the same without QK-norm at AdamW {SAFE_LR:g}"),
        _scenario("tiny_attn_no_qk_norm", Recipe(HIGH_LR),
                  f"AdamW {HIGH_LR:g} without QK-norm: the largest attention logits grow into "
                  f"the thousands and attention collapses; the loss spikes from ~1.2 towards "
                  f"chance ({chance:.2f}) 200-300 steps in",
                  cause="attention_logit_growth", onset_step=0, sudden=False,
                  recoverable=False),
    ]
