"""BERT sequence classification: a pre-trained encoder fine-tuned with a newly added head.

Model: `transformers.BertForSequenceClassification` built from a tiny `BertConfig` (2 layers,
hidden 64, 4 heads, intermediate 128, vocabulary 100, 64 positions, dropout 0). The base model
(encoder and pooler) is first pre-trained on a related task, cached by `pretrain.pretrained`:
which one of eight marker tokens a sentence holds. The fine-tune loads that encoder and pooler and
adds a NEW classifier, an `nn.Linear(64, 4)` drawn as the guide recommends (normal, std 0.02, bias
zero), for a different task over four of those markers.

Data: sentences of a sparse Markov language (`trainguard.demo.MarkovLanguage`, 3 likely successors
per word) of 12-30 words, framed by [CLS] ... [SEP] and padded, with the attention mask on. The
fine-tuning label is the marker that occurs most often (2-3 copies; each other marker at most
once), so the class depends on counting token patterns. Like real labels, some are ambiguous: in
15% of the sentences two markers tie and the label is a coin flip between them, which a sound model
answers 50/50 (loss floor 0.15 * log 2 = 0.10; chance is log 4 = 1.39).

Optimizer: AdamW (weight decay 0.01) at the sane LR 2e-3 for this tiny model (the guide's 1e-6..5e-5
is for 7B models), 10% linear warmup then cosine decay.

Scenarios:
    bert_cls_healthy             fp32, batch 32, 150 steps.
    bert_cls_healthy_fp16        float16 autocast with a `torch.amp.GradScaler("cpu")` (weights and
                                 Adam state stay float32), batch 16, 100 steps. CPU float16 matmuls
                                 are ~5x slower than float32, hence the smaller run.
    bert_cls_bad_init_std10/100  (§3.3.1, §6) the new head drawn with std 10 / 100 instead of 0.02.
                                 The logits start at ~50 / ~500 (loss 59 / 589) and the first
                                 gradients are huge. AdamW normalises those gradients, so nothing
                                 overflows, but it moves each head weight by only ~lr per step: the
                                 head keeps |w| ~ 8 / 80 for the whole run, and the encoder has to
                                 bend its features to a random, huge head. The run ends worse and
                                 overconfident: 94% / 97% accuracy on unambiguous sentences (healthy
                                 99.9%), and tens of nats on the ambiguous ones.
    bert_cls_optimizer_eps_fp16  (§5.3) AdamW with eps 1e-16 and betas (0.9, 0.9) on a model cast
                                 to float16 (`model.half()`, no float32 master weights). Adam's
                                 denominator sqrt(v) + eps is computed in float16, where eps 1e-16
                                 rounds to 0, and v = (1 - beta2) * g^2 underflows to 0 for any
                                 |g| below ~5e-4. Every parameter whose second moment is that tiny
                                 gets m / 0 at the very first update: 84% of the weights turn inf,
                                 and those with a zero gradient (the padding row of the embedding,
                                 unused positions) turn NaN (0 / 0); the next forward is NaN.
                                 Pure float16 Adam is that fragile: eps 1e-8 (the default) and 1e-6
                                 (the guide's float16 advice) blew up here too, 1e-4 trained.
                                 In float32 (or with AMP's float32 state) the same eps and betas do
                                 not blow up this model: with b1 < sqrt(b2), |m / sqrt(v)| stays
                                 below (1 - b1) / sqrt(1 - b2) / (1 - b1 / sqrt(b2)) ~ 6 whatever
                                 eps is, and its gradients are far above 1e-8, so eps never acts
                                 (such a run matched the healthy one).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import TypedDict

import torch
from torch import nn
from torch.nn import functional as F
from transformers import BertConfig, BertForSequenceClassification
from transformers.utils import logging as hf_logging

from trainguard.demo.data import MarkovLanguage

from ..base import Scenario, Workload, lm_eval
from ..pretrain import pretrained

FAMILY = "bert_cls"

PAD, CLS, SEP = 0, 1, 2
PRETRAIN_MARKERS = tuple(range(3, 11))
"""Pre-training labels a sentence by which of these eight markers it holds."""
MARKERS = PRETRAIN_MARKERS[:4]
"""The fine-tune labels a sentence by which of these four markers it holds most often."""
FIRST_WORD = 11
VOCAB = 100
N_WORDS = VOCAB - FIRST_WORD
MIN_WORDS, MAX_WORDS = 12, 30
"""Sentence lengths in words; with [CLS] and [SEP] a padded batch is MAX_WORDS + 2 wide."""
LANGUAGE_SEED = 11
PRETRAIN_SEED = 1234

SANE_LR = 2e-3
"""AdamW LR at which this tiny encoder fine-tunes well (the guide's 1e-6..5e-5 is for 7B): 1e-3
learns more slowly, 3e-3 gets bumpy."""
WARMUP_FRACTION = 0.1
STEPS = 150
HEAD_SGD_LR = 0.2
FP16_STEPS = 100
EPS_STEPS = 60
BATCH = 32
FP16_BATCH = 16
HEAD_STD = 0.02
TIE_FRACTION = 0.15

PRETRAIN_STEPS = 100
PRETRAIN_LR = 3e-3
PRETRAIN_KEY = (f"bert_cls_presence8_markov{LANGUAGE_SEED}_h64l2_adamw{PRETRAIN_LR:g}"
                f"x{PRETRAIN_STEPS}_v1")
"""Names the pre-training recipe; change the version when the recipe changes."""

_STREAM_TRAIN, _STREAM_EVAL, _STREAM_HEAD, _STREAM_PRETRAIN = 1, 2, 3, 4


def _config(num_labels: int = len(MARKERS)) -> BertConfig:
    return BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                      num_attention_heads=4, intermediate_size=128, max_position_embeddings=64,
                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                      pad_token_id=PAD, num_labels=num_labels)


def _generator(seed: int, stream: int, step: int = 0, micro: int = 0) -> torch.Generator:
    """A generator that depends only on its arguments (no global RNG)."""
    return torch.Generator().manual_seed(((seed * 7919 + stream) * 1_000_003 + step) * 1009
                                         + micro)


class Batch(TypedDict):
    """A dict of tensors, as a Hugging Face loader yields (crash snapshots keep it whole)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor


@functools.cache
def _transition() -> torch.Tensor:
    """The Markov chain the sentences' words follow (shared by pre-training and fine-tuning)."""
    return MarkovLanguage(vocab_size=N_WORDS, branching=3, seed=LANGUAGE_SEED).transition


def _sentences(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """n padded Markov sentences framed by [CLS] ... [SEP], and their word counts."""
    transition = _transition()
    words = torch.empty(n, MAX_WORDS, dtype=torch.long)
    words[:, 0] = torch.randint(N_WORDS, (n,), generator=generator)
    for i in range(1, MAX_WORDS):
        words[:, i] = torch.multinomial(transition[words[:, i - 1]], 1,
                                        generator=generator).squeeze(1)
    lengths = torch.randint(MIN_WORDS, MAX_WORDS + 1, (n,), generator=generator)
    ids = torch.full((n, MAX_WORDS + 2), PAD, dtype=torch.long)
    ids[:, 0] = CLS
    for row in range(n):
        length = int(lengths[row])
        ids[row, 1:1 + length] = words[row, :length] + FIRST_WORD
        ids[row, 1 + length] = SEP
    return ids, lengths


def _place_markers(ids: torch.Tensor, lengths: torch.Tensor, counts: torch.Tensor,
                   markers: tuple[int, ...], generator: torch.Generator) -> None:
    """Overwrite random word positions of each sentence with counts[row, m] copies of markers[m]."""
    for row in range(ids.shape[0]):
        tokens = [markers[m] for m in range(len(markers)) for _ in range(int(counts[row, m]))]
        positions = 1 + torch.randperm(int(lengths[row]), generator=generator)[:len(tokens)]
        ids[row, positions] = torch.tensor(tokens, dtype=torch.long)


def majority_batch(n: int, generator: torch.Generator) -> Batch:
    """The fine-tuning task: sentences labelled with the marker that occurs most often.

    The winner occurs 2 or 3 times and each other marker once with probability 1/2, so the model
    has to count, not just spot a marker. Like real labels, some are ambiguous: in TIE_FRACTION of
    the sentences a second marker occurs as often as the winner, and the label is a coin flip
    between the two, so a sound model answers those 50/50 and the loss floor is
    TIE_FRACTION * log(2).
    """
    ids, lengths = _sentences(n, generator)
    rows = torch.arange(n)
    labels = torch.randint(len(MARKERS), (n,), generator=generator)
    counts = (torch.rand(n, len(MARKERS), generator=generator) < 0.5).long()
    counts[rows, labels] = torch.randint(2, 4, (n,), generator=generator)
    # the tied rival is another marker: shift the label by 1..3 (mod 4)
    rival = (labels + torch.randint(1, len(MARKERS), (n,), generator=generator)) % len(MARKERS)
    tied = torch.rand(n, generator=generator) < TIE_FRACTION
    counts[rows[tied], rival[tied]] = counts[rows[tied], labels[tied]]
    coin = torch.rand(n, generator=generator) < 0.5
    labels = torch.where(tied & coin, rival, labels)
    _place_markers(ids, lengths, counts, MARKERS, generator)
    return Batch(input_ids=ids, attention_mask=(ids != PAD).long(), labels=labels)


def presence_batch(n: int, generator: torch.Generator) -> Batch:
    """The pre-training task: which one of eight markers a sentence holds (1-3 copies of it)."""
    ids, lengths = _sentences(n, generator)
    labels = torch.randint(len(PRETRAIN_MARKERS), (n,), generator=generator)
    counts = torch.zeros(n, len(PRETRAIN_MARKERS), dtype=torch.long)
    counts[torch.arange(n), labels] = torch.randint(1, 4, (n,), generator=generator)
    _place_markers(ids, lengths, counts, PRETRAIN_MARKERS, generator)
    return Batch(input_ids=ids, attention_mask=(ids != PAD).long(), labels=labels)



def _pretrain_presence(model: nn.Module) -> None:
    optimizer = torch.optim.AdamW(model.parameters(), lr=PRETRAIN_LR, weight_decay=0.01)
    scheduler = warmup_cosine(optimizer, PRETRAIN_STEPS)
    model.train()
    for step in range(PRETRAIN_STEPS):
        batch = presence_batch(BATCH, _generator(PRETRAIN_SEED, _STREAM_PRETRAIN, step))
        classifier_loss(model, batch, step).backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)


def _quiet_classifier(num_labels: int) -> BertForSequenceClassification:
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return BertForSequenceClassification(_config(num_labels))
    finally:
        hf_logging.set_verbosity(verbosity)


def _pretrained_encoder_state() -> dict[str, torch.Tensor]:
    """Encoder and pooler of the base model, pre-trained on marker presence (cached)."""
    with torch.random.fork_rng():  # the cached weights must not depend on who built them first
        torch.manual_seed(PRETRAIN_SEED)
        base = _quiet_classifier(len(PRETRAIN_MARKERS))
    pretrained(PRETRAIN_KEY, base, _pretrain_presence)
    return base.bert.state_dict()


def new_head(hidden: int, classes: int, std: float, generator: torch.Generator) -> nn.Linear:
    head = nn.Linear(hidden, classes)
    with torch.no_grad():
        head.weight.normal_(0.0, std, generator=generator)
        head.bias.zero_()
    return head


def classifier_loss(model: nn.Module, batch: Batch, step: int) -> torch.Tensor:
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return F.cross_entropy(logits.float(), batch["labels"])


def warmup_cosine(optimizer: torch.optim.Optimizer, steps: int,
                  warmup_fraction: float = WARMUP_FRACTION) -> torch.optim.lr_scheduler.LambdaLR:
    warmup = max(1, round(steps * warmup_fraction))

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, steps - warmup))
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _builder(steps: int, *, batch_size: int = BATCH, head_std: float = HEAD_STD,
             eps: float = 1e-8, betas: tuple[float, float] = (0.9, 0.999),
             precision: str = "fp32", head_only: bool = False,
             lr: float = SANE_LR, sgd: bool = False) -> Callable[[int], Workload]:
    """precision: "fp32"; "amp_fp16" (float16 autocast, GradScaler, float32 weights and Adam
    state); "pure_fp16" (model.half(): float16 weights, gradients and Adam state). head_only:
    the encoder frozen, only the new classifier head trains (a linear probe)."""

    def build(seed: int) -> Workload:
        encoder_state = _pretrained_encoder_state()
        model = _quiet_classifier(len(MARKERS))
        model.bert.load_state_dict(encoder_state)
        model.classifier = new_head(model.config.hidden_size, len(MARKERS), head_std,
                                    _generator(seed, _STREAM_HEAD))
        if precision == "pure_fp16":
            model.half()
        model.train()
        if head_only:
            model.bert.requires_grad_(False)
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer: torch.optim.Optimizer = (
            torch.optim.SGD(trainable, lr=lr, momentum=0.9) if sgd else
            torch.optim.AdamW(trainable, lr=lr, eps=eps, betas=betas, weight_decay=0.01))
        held_out = [majority_batch(128, _generator(seed, _STREAM_EVAL, i)) for i in range(2)]

        def batch(step: int, micro: int) -> Batch:
            return majority_batch(batch_size, _generator(seed, _STREAM_TRAIN, step, micro))

        amp = precision == "amp_fp16"
        return Workload(
            model=model, optimizer=optimizer, batch=batch, loss=classifier_loss,
            evaluate=lambda m: lm_eval(m, held_out, classifier_loss),
            scheduler=warmup_cosine(optimizer, steps),
            scaler=torch.amp.GradScaler("cpu") if amp else None,
            autocast=torch.float16 if amp else None, batch_size=batch_size,
            notes={"lr": lr, "head_std": head_std, "eps": eps, "betas": betas,
                   "precision": precision, "head_only": head_only})

    return build


BASELINES: dict[str, str] = {
    "bert_cls_bad_init_std10": "bert_cls_healthy",
    "bert_cls_bad_init_std100": "bert_cls_healthy",
    # no healthy pure-fp16 run exists (pure fp16 Adam is the fault); the nearest is the float16
    # run of batch 16 under autocast, which trains 100 steps where this one trains 60
    "bert_cls_optimizer_eps_fp16": "bert_cls_healthy_fp16",
}
"""The healthy scenario of the same model and precision that each faulty one is measured
against (its final eval loss under no protection is the reference)."""


def scenarios() -> list[Scenario]:
    sane = f"AdamW lr {SANE_LR:g} (the sane LR), 10% warmup + cosine"
    return [
        Scenario("bert_cls_healthy", FAMILY, _builder(STEPS), STEPS,
                 description=f"fp32, {sane}, new head std {HEAD_STD:g}"),
        Scenario("bert_cls_head_sgd_healthy", FAMILY,
                 _builder(STEPS, head_only=True, lr=HEAD_SGD_LR, sgd=True), STEPS,
                 description=f"a linear probe: the encoder frozen, the new head trained with SGD "
                             f"lr {HEAD_SGD_LR:g} momentum 0.9, 10% warmup + cosine; its healthy "
                             "gradient norm sits above 1, so a fixed clip at 1.0 slows it"),
        Scenario("bert_cls_healthy_fp16", FAMILY,
                 _builder(FP16_STEPS, batch_size=FP16_BATCH, precision="amp_fp16"), FP16_STEPS,
                 description=f"float16 autocast + GradScaler (fp32 master weights), {sane}"),
        Scenario("bert_cls_bad_init_std10", FAMILY, _builder(STEPS, head_std=10.0), STEPS,
                 cause="bad_init", onset_step=0, sudden=False, severity="mild",
                 recoverable=False,
                 description=f"new classifier head drawn with std 10 (vs {HEAD_STD:g}); {sane}"),
        Scenario("bert_cls_bad_init_std100", FAMILY, _builder(STEPS, head_std=100.0), STEPS,
                 cause="bad_init", onset_step=0, sudden=False, severity="severe",
                 recoverable=False,
                 description=f"new classifier head drawn with std 100 (vs {HEAD_STD:g}); {sane}"),
        Scenario("bert_cls_optimizer_eps_fp16", FAMILY,
                 _builder(EPS_STEPS, batch_size=FP16_BATCH, eps=1e-16, betas=(0.9, 0.9),
                          precision="pure_fp16"), EPS_STEPS,
                 cause="optimizer_eps", onset_step=0, sudden=True, recoverable=False,
                 description="pure float16 weights and Adam state (model.half()), AdamW eps "
                             f"1e-16 (rounds to 0 in fp16), betas (0.9, 0.9); {sane}"),
    ]
