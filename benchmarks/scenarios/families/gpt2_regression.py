"""A regression head on GPT-2: a sequence-level score fine-tuned with the Hugging Face model class.

Model: `transformers.GPT2ForSequenceClassification` with `num_labels=1` and
`problem_type="regression"` (the MSE loss of the model itself), built from a config (2 layers,
64 wide, 4 heads, vocabulary 64, dropout 0), trained from its initialisation. The
head reads the last token's state, which the causal attention lets see the whole sequence.

Data: sequences (`gpt2.SEQ_LEN` tokens) of the fine-tuning language of the `gpt2` family (a
sparse Markov chain); the target is the share of "low" tokens (ids below 16) minus the share of
"high" ones (48 and above), scaled to unit spread, plus Gaussian noise of standard deviation 0.5:
a score the model must count its way to, with a noise floor (MSE 0.25) it cannot beat.

Optimizer: AdamW 1e-3 (weight decay 0.01), 10% linear warm-up then cosine decay, batch 16, 200
steps. Its healthy gradient norm sits around 1 to 5 (a freshly drawn head on a regression loss),
so a fixed clip at 1.0 (the Trainer's default) clips most of its steps: the family where users'
clip at 1.0 and the adaptive clip, which leaves healthy steps alone, differ most.

Scenarios:
    gpt2_regression_healthy     the healthy fine-tune.
"""

from __future__ import annotations

import math
from functools import partial

import torch
from torch import nn
from transformers import GPT2Config, GPT2ForSequenceClassification
from transformers.utils import logging as hf_logging

from ..base import Scenario, Workload
from .gpt2 import SEQ_LEN, finetuning_transition, sample_sequences

FAMILY = "gpt2_regression"
STEPS = 200
BATCH_SIZE = 16
LR = 1e-3
WARMUP = STEPS // 10
NOISE = 0.5
EVAL_BATCHES = 8
LOW, HIGH = 16, 48
"""Token ids below LOW count up, ids from HIGH on count down."""

_TRAIN_STREAM, _EVAL_STREAM = 0, 1


def _generator(seed: int, stream: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(((seed * 7919 + stream) * 1_000_003 + step) * 131)


def _config() -> GPT2Config:
    return GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=64, n_positions=SEQ_LEN,
                      num_labels=1, problem_type="regression", pad_token_id=0,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


def build(seed: int) -> Workload:
    hf_logging.set_verbosity_error()
    transition = finetuning_transition()

    def sample(generator: torch.Generator) -> dict[str, torch.Tensor]:
        ids = sample_sequences(transition, BATCH_SIZE, generator)
        share = (ids < LOW).float().mean(1) - (ids >= HIGH).float().mean(1)
        score = share / 0.2 + NOISE * torch.randn(BATCH_SIZE, generator=generator)
        return {"input_ids": ids, "labels": score}

    held_out = [sample(_generator(seed, _EVAL_STREAM, i)) for i in range(EVAL_BATCHES)]
    torch.manual_seed(seed)
    model = GPT2ForSequenceClassification(_config())
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)

    def schedule(step: int) -> float:
        if step < WARMUP:
            return (step + 1) / WARMUP
        return 0.5 * (1 + math.cos(math.pi * (step - WARMUP) / (STEPS - WARMUP)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)

    def batch(step: int, micro: int) -> dict[str, torch.Tensor]:
        return sample(_generator(seed, _TRAIN_STREAM, step))

    def loss(model: nn.Module, data: dict[str, torch.Tensor], step: int) -> torch.Tensor:
        return model(**data).loss

    def evaluate(model: nn.Module) -> float:
        with torch.no_grad():
            return float(torch.stack([model(**d).loss for d in held_out]).mean())

    return Workload(model=model, optimizer=optimizer, batch=batch, loss=loss,
                    evaluate=evaluate, scheduler=scheduler, batch_size=BATCH_SIZE)


def scenarios() -> list[Scenario]:
    return [
        Scenario("gpt2_regression_healthy", FAMILY, partial(build), STEPS,
                 description=f"GPT-2 regression head (MSE), AdamW {LR:g} with warm-up and "
                             f"cosine, batch {BATCH_SIZE}: a healthy norm above 1"),
    ]
