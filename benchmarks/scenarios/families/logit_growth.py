"""The `tiny_lm` transformer with its output head on an LR schedule of its own, for the faults whose
output logits grow before the loss spikes.

Model: `tiny_lm.TinyLM` (2 pre-norm blocks, 64 wide, vocabulary 64, sequences of 32) on a Markov
language whose first half of tokens has one successor (the head can fit them ever more
confidently: their logits, and log Z with them, can keep growing) and whose second half has 3
(a loss floor near 0.2 that keeps the ground truth's spike test clean). AdamW (betas 0.9, 0.999,
eps 1e-8, no weight decay, no z-loss), a 10-step warmup to `SANE_LR` = 3e-3 for every group.

Fault (guide section 3.1, `lr_too_high`):
    head_lr_ramp    from step `RAMP_FROM` the output head's group LR grows by `RAMP_RATE` per
                    step (a head LR multiplier on a scheduler stepped per batch, or a separate
                    head group whose warmup never ends); the body's LR stays sane. The head's
                    weights, the output logits and their log Z grow for some 80 steps while
                    the loss barely moves; the loss then more than doubles in a step, near step
                    190 (the head's LR some 80x the sane one), and diverges after.

Healthy twins: the same model at the sane LR throughout, the same head ramp stopped at
`SAFE_CAP` times the sane LR (a head LR that rises for 47 steps, then holds, without a spike),
and that capped ramp trained with a z-loss (`Z_LOSS` x log Z^2 added to the loss, PaLM's
coefficient: log Z held near 0, the trap for a detector that reads log Z's level or its drift
towards 0 as growth). A z-loss on the never-ending ramp (1e-3 x log Z^2) did not prevent the
spike (it holds the mean log Z near 2, not the head's growing updates): the fix here is the LR.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from ..base import Batch, Scenario, Workload, lm_eval
from .tiny_lm import BATCH_SIZE, SEQ_LEN, VOCAB_SIZE, TinyLM

STEPS = 215
SANE_LR = 3e-3
WARMUP_STEPS = 10
RAMP_FROM = 100
RAMP_RATE = 1.05
SAFE_CAP = 10.0
Z_LOSS = 1e-4
DETERMINISTIC_SHARE = 0.5
"""Share of the tokens with a single successor."""
LANGUAGE_SEED = 7
EVAL_BATCHES = 4
_TRAIN_STREAM, _EVAL_STREAM = 0, 1


def transition() -> torch.Tensor:
    """The language's next-token distribution: tokens below `DETERMINISTIC_SHARE` x vocabulary
    have one successor, the others three."""
    generator = torch.Generator().manual_seed(LANGUAGE_SEED)
    logits = torch.full((VOCAB_SIZE, VOCAB_SIZE), -1e9)
    for token in range(VOCAB_SIZE):
        branching = 1 if token < int(VOCAB_SIZE * DETERMINISTIC_SHARE) else 3
        successors = torch.randperm(VOCAB_SIZE, generator=generator)[:branching]
        logits[token, successors] = torch.randn(branching, generator=generator)
    return torch.softmax(logits, dim=-1)


@dataclass(frozen=True)
class Recipe:
    ramp_from: int | None = None
    ramp_cap: float | None = None
    """The head's ramp stops at this multiple of the sane LR (None: it never stops)."""
    z_loss: float = 0.0
    """The weight of log Z^2 (mean over positions) added to the loss."""


def lr_factor(step: int, recipe: Recipe, head: bool) -> float:
    factor = min(1.0, (step + 1) / WARMUP_STEPS)
    if head and recipe.ramp_from is not None and step >= recipe.ramp_from:
        ramp = RAMP_RATE ** (step - recipe.ramp_from)
        factor *= ramp if recipe.ramp_cap is None else min(ramp, recipe.ramp_cap)
    return factor


def _generator(seed: int, stream: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(((seed * 7919 + stream) * 1_000_003 + step) * 103)


def _sequences(chain: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    tokens = torch.empty(BATCH_SIZE, SEQ_LEN + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(VOCAB_SIZE, (BATCH_SIZE,), generator=generator)
    for i in range(1, SEQ_LEN + 1):
        tokens[:, i] = torch.multinomial(chain[tokens[:, i - 1]], 1,
                                         generator=generator).squeeze(1)
    return tokens


def next_token_loss(model: nn.Module, tokens: Batch, step: int,
                    z_loss: float = 0.0) -> torch.Tensor:
    del step
    logits = model(tokens[:, :-1]).float().reshape(-1, VOCAB_SIZE)
    loss = F.cross_entropy(logits, tokens[:, 1:].reshape(-1))
    if z_loss:
        loss = loss + z_loss * torch.logsumexp(logits, dim=-1).square().mean()
    return loss


def build(seed: int, recipe: Recipe) -> Workload:
    chain = transition()
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = TinyLM()
    model.train()
    body = [p for name, p in model.named_parameters() if not name.startswith("head.")]
    optimizer = torch.optim.AdamW([{"params": body}, {"params": list(model.head.parameters())}],
                                  lr=SANE_LR, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, [partial(lr_factor, recipe=recipe, head=False),
                    partial(lr_factor, recipe=recipe, head=True)])
    held_out = [_sequences(chain, _generator(seed, _EVAL_STREAM, i))
                for i in range(EVAL_BATCHES)]

    def batch(step: int, micro: int) -> Batch:
        del micro
        return _sequences(chain, _generator(seed, _TRAIN_STREAM, step))

    loss = partial(next_token_loss, z_loss=recipe.z_loss) if recipe.z_loss else next_token_loss
    return Workload(model=model, optimizer=optimizer, batch=batch, loss=loss,
                    evaluate=lambda m: lm_eval(m, held_out, next_token_loss),
                    scheduler=scheduler, batch_size=BATCH_SIZE)


def _scenario(name: str, recipe: Recipe, description: str, **fault: object) -> Scenario:
    return Scenario(name=name, family="logit_growth", build=partial(build, recipe=recipe),
                    steps=STEPS, description=description, **fault)  # type: ignore[arg-type]


BASELINES: dict[str, str] = {"logit_growth_head_lr_ramp": "logit_growth_healthy"}


def scenarios() -> list[Scenario]:
    sane = Recipe()
    growth = f"{100 * (RAMP_RATE - 1):.0f}% a step"
    return [
        _scenario("logit_growth_healthy", sane,
                  f"a 2-block transformer from scratch on a half-deterministic language, AdamW "
                  f"{SANE_LR:g} for body and head after a {WARMUP_STEPS}-step warmup"),
        _scenario("logit_growth_healthy_capped_head_ramp",
                  replace(sane, ramp_from=RAMP_FROM, ramp_cap=SAFE_CAP),
                  f"from step {RAMP_FROM} the output head's LR grows {growth} until it is "
                  f"{SAFE_CAP:g}x the sane LR, then holds: a head LR that the model takes"),
        _scenario("logit_growth_healthy_z_loss",
                  replace(sane, ramp_from=RAMP_FROM, ramp_cap=SAFE_CAP, z_loss=Z_LOSS),
                  f"the capped head ramp (to {SAFE_CAP:g}x from step {RAMP_FROM}) trained with "
                  f"a z-loss, {Z_LOSS:g} x log Z^2 added to the loss: log Z held near 0"),
        _scenario("logit_growth_head_lr_ramp", replace(sane, ramp_from=RAMP_FROM),
                  f"from step {RAMP_FROM} the output head's LR grows {growth} and never stops: "
                  "the output logits and log Z grow, and the loss spikes about "
                  f"{math.log(80) / math.log(RAMP_RATE):.0f} steps later, the head's LR some "
                  "80x the sane one",
                  cause="lr_too_high", onset_step=RAMP_FROM, sudden=False, recoverable=False),
    ]
