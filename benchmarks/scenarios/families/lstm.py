"""LSTM language model: a pre-trained recurrent LM fine-tuned on a shifted Markov language.

Model: `nn.Embedding` -> `nn.LSTM` (1 or 2 layers) -> `nn.Linear` over a 64-token vocabulary.
Data: documents from sparse first-order Markov chains (`trainguard.demo.MarkovLanguage`, 3 likely
successors per token), of random length and padded; the loss is the next-token cross-entropy
averaged over the real (unpadded) targets. The base model is pre-trained on one chain
(`pretrain.pretrained`); the fine-tune moves it to a related chain in which a third of the tokens
have new successors. The base model is confidently wrong on those, so the fine-tune starts at
~4.2 nats (chance is log 64 = 4.16) and falls towards the chain's entropy floor (~0.9); a healthy
run ends near 1.0.

Scenarios:
    lstm_healthy_sgd        1 layer (hidden 64), batch 16, plain SGD at its sane LR 1.0, constant
                            (like PyTorch's word_language_model, which anneals only on plateaus),
                            no clipping.
    lstm_healthy_adam       2 layers (hidden 96), batch 32, Adam at its sane LR 3e-3, 20-step
                            warmup + cosine.
    lstm_lr_too_high_x50/x100  (§3.1) the SGD run at 50x / 100x its sane LR, without clipping.
                            The first updates (lr x a gradient of norm ~0.6) throw the recurrent
                            and output weights to several times their size (|W_hh| 24 -> 107 in
                            one step at 100x); the gates and tanh saturate and the loss jumps
                            above its untrained value (4 -> 12 at 100x) and stays high. Saturated
                            gates pass little gradient, so the gradient norm itself never explodes
                            (it stays below ~3), and plain SGD cannot climb back. 30x still trains.
    lstm_numerical_op       (§3.3.2) the token-averaged loss divides by the number of real
                            targets; at the onset step the batch holds only one-token documents,
                            so that count is 0 and the loss is 0/0 = NaN, whose NaN gradients
                            poison every weight of an unprotected run. A single bad step:
                            skipping it saves the run.
    lstm_labels_ignored     (§3.2) the SGD run fed Hugging Face style: `input_ids` and `labels`
                            with -100 on padding, and the library's mean cross-entropy over the
                            labels not ignored. At the onset step a prompt-masking bug marks every
                            label of the batch -100: the mean over nothing is NaN. One bad batch:
                            skipping it saves the run.
    lstm_padding_labelled   (§3.2) the SGD run fed Hugging Face style with an `attention_mask`,
                            by a collator that copies the next tokens as labels where the pad
                            token doubles as token 0 (the end-of-text token some tokenizers pad
                            with): every padding position is labelled 0, and the loss trains
                            the model to predict it.
    lstm_lr_spike           (§3.1) the SGD run with a misconfigured schedule restart: for 3
                            scheduler steps from step 100 the LR is 50x, then back to 1.0. The
                            spiked updates throw the weights as in lstm_lr_too_high_x50, with
                            half the run left to climb back. The spike lives in the schedule, so
                            it comes back whenever the scheduler is rewound to before it.
    lstm_transient_lr       (§3.1) the SGD run whose loop writes the LR itself every step (no
                            scheduler): 100x for 6 steps from step 100, then the sane LR again.
                            The fault is the loop's and is gone once it has written the LR back.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, TypedDict

import torch
from torch import nn
from torch.nn import functional as F

from trainguard.demo.data import MarkovLanguage

from ..base import Scenario, Workload, lm_eval
from ..pretrain import pretrained

FAMILY = "lstm"

VOCAB = 64
PAD = VOCAB
"""Padding id, outside the language: the embedding has VOCAB + 1 rows, the output VOCAB."""
MIN_LEN, MAX_LEN = 8, 33
"""Document lengths in tokens (a document of n tokens has n - 1 next-token targets)."""
BASE_LANGUAGE_SEED = 5
SHIFTED_LANGUAGE_SEED = 6
SHIFTED_FRACTION = 1 / 3
"""Share of tokens whose successors the fine-tuning language redraws."""

SGD_SANE_LR = 1.0
"""Plain SGD LR at which the 1-layer LSTM fine-tunes well without clipping (at a constant LR,
1 to 30 all train; 50 and above do not)."""
ADAM_SANE_LR = 3e-3
STEPS = 200
BATCH = 16
ADAM_BATCH = 32

PRETRAIN_STEPS = 150
PRETRAIN_LR = 1e-2

NUMERICAL_ONSET = 120
LABELS_IGNORED_ONSET = 120
IGNORE_INDEX = -100
LR_SPIKE_ONSET = 100
LR_SPIKE_FACTOR = 50.0
LR_SPIKE_STEPS = 3
TRANSIENT_LR_FACTOR = 100.0
TRANSIENT_LR_STEPS = 6

_STREAM_TRAIN, _STREAM_EVAL, _STREAM_PRETRAIN = 1, 2, 3
PRETRAIN_SEED = 4321


class LSTMLanguageModel(nn.Module):
    def __init__(self, vocab: int = VOCAB, embed: int = 32, hidden: int = 64,
                 layers: int = 1) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab + 1, embed, padding_idx=vocab)
        self.lstm = nn.LSTM(embed, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.lstm(self.embedding(tokens))
        return self.head(hidden)


class Batch(TypedDict):
    """A dict of tensors (crash snapshots keep it whole)."""

    tokens: torch.Tensor
    """(batch, MAX_LEN) token ids, PAD after each document's end."""
    lengths: torch.Tensor


def _generator(seed: int, stream: int, step: int = 0, micro: int = 0) -> torch.Generator:
    """A generator that depends only on its arguments (no global RNG)."""
    return torch.Generator().manual_seed(((seed * 7919 + stream) * 1_000_003 + step) * 1009
                                         + micro)


@functools.cache
def _transition(kind: str) -> torch.Tensor:
    """The pre-training chain ("base"), or the fine-tuning one ("shifted"): the base chain with
    a third of its tokens given the successors they have in another chain."""
    base = MarkovLanguage(VOCAB, branching=3, seed=BASE_LANGUAGE_SEED).transition
    if kind == "base":
        return base
    other = MarkovLanguage(VOCAB, branching=3, seed=SHIFTED_LANGUAGE_SEED).transition
    shifted = base.clone()
    moved = torch.arange(VOCAB) < round(VOCAB * SHIFTED_FRACTION)
    shifted[moved] = other[moved]
    return shifted


def documents(transition: torch.Tensor, n: int, generator: torch.Generator,
              lengths: torch.Tensor | None = None) -> Batch:
    """n documents sampled from a Markov chain, padded to MAX_LEN."""
    tokens = torch.empty(n, MAX_LEN, dtype=torch.long)
    tokens[:, 0] = torch.randint(VOCAB, (n,), generator=generator)
    for i in range(1, MAX_LEN):
        tokens[:, i] = torch.multinomial(transition[tokens[:, i - 1]], 1,
                                         generator=generator).squeeze(1)
    if lengths is None:
        lengths = torch.randint(MIN_LEN, MAX_LEN + 1, (n,), generator=generator)
    tokens[torch.arange(MAX_LEN)[None, :] >= lengths[:, None]] = PAD
    return Batch(tokens=tokens, lengths=lengths)


def token_average_loss(model: nn.Module, batch: Batch, step: int) -> torch.Tensor:
    """Next-token cross-entropy summed over the real targets, divided by their number.

    The division is unguarded, as in many hand-written training loops: a batch without a single
    target gives 0/0.
    """
    logits = model(batch["tokens"][:, :-1])
    targets = batch["tokens"][:, 1:]
    real = targets != PAD
    per_token = F.cross_entropy(logits.reshape(-1, VOCAB),
                                targets.reshape(-1).clamp_max(VOCAB - 1), reduction="none")
    return (per_token * real.reshape(-1)).sum() / real.sum()


def labelled(batch: Batch) -> dict[str, torch.Tensor]:
    """The batch as a Hugging Face collator gives it: inputs, and the next tokens as labels with
    padding ignored (-100)."""
    targets = batch["tokens"][:, 1:]
    return {"input_ids": batch["tokens"][:, :-1],
            "labels": targets.masked_fill(targets == PAD, IGNORE_INDEX)}


def label_mean_loss(model: nn.Module, batch: dict[str, torch.Tensor],
                    step: int) -> torch.Tensor:
    """The library's cross-entropy: the mean over the labels that are not ignored (NaN when
    every label is)."""
    logits = model(batch["input_ids"])
    return F.cross_entropy(logits.reshape(-1, VOCAB), batch["labels"].reshape(-1),
                           ignore_index=IGNORE_INDEX)


def _pretrain(model: nn.Module) -> None:
    optimizer = torch.optim.Adam(model.parameters(), lr=PRETRAIN_LR)
    transition = _transition("base")
    model.train()
    for step in range(PRETRAIN_STEPS):
        generator = _generator(PRETRAIN_SEED, _STREAM_PRETRAIN, step)
        token_average_loss(model, documents(transition, ADAM_BATCH, generator), step).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def _base_model(layers: int, hidden: int) -> LSTMLanguageModel:
    """The pre-trained LM of this size (cached); each size has its own pre-training run."""
    with torch.random.fork_rng():  # the cached weights must not depend on who built them first
        torch.manual_seed(PRETRAIN_SEED)
        model = LSTMLanguageModel(hidden=hidden, layers=layers)
    key = (f"lstm_markov{BASE_LANGUAGE_SEED}_e32h{hidden}l{layers}_adam{PRETRAIN_LR:g}"
           f"x{PRETRAIN_STEPS}_v1")
    return pretrained(key, model, _pretrain)


def warmup_cosine(optimizer: torch.optim.Optimizer, steps: int,
                  warmup: int) -> torch.optim.lr_scheduler.LambdaLR:
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, steps - warmup))
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def lr_spike(optimizer: torch.optim.Optimizer, at: int) -> torch.optim.lr_scheduler.LambdaLR:
    """A constant LR, except LR_SPIKE_FACTOR times higher for LR_SPIKE_STEPS scheduler steps
    from `at` (a schedule restart configured with the wrong peak)."""
    def factor(step: int) -> float:
        return LR_SPIKE_FACTOR if at <= step < at + LR_SPIKE_STEPS else 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def _builder(steps: int, *, optimizer: str = "sgd", lr: float = SGD_SANE_LR, layers: int = 1,
             hidden: int = 64, batch_size: int = BATCH, warmup: int = 0, cosine: bool = False,
             empty_batch_at: int | None = None, lr_spike_at: int | None = None,
             transient_lr_at: int | None = None, labels_ignored_at: int | None = None,
             hf_labels: bool = False, padding_labelled: bool = False
             ) -> Callable[[int], Workload]:
    def build(seed: int) -> Workload:
        model = _base_model(layers, hidden)
        model.train()
        if optimizer == "sgd":
            opt: torch.optim.Optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        else:
            opt = torch.optim.Adam(model.parameters(), lr=lr)
        transition = _transition("shifted")
        held_out = [documents(transition, 64, _generator(seed, _STREAM_EVAL, i))
                    for i in range(2)]

        def plain(step: int, micro: int) -> Batch:
            generator = _generator(seed, _STREAM_TRAIN, step, micro)
            if step == empty_batch_at:  # only one-token documents: no next-token target at all
                return documents(transition, batch_size, generator,
                                 lengths=torch.ones(batch_size, dtype=torch.long))
            return documents(transition, batch_size, generator)

        def with_labels(step: int, micro: int) -> dict[str, torch.Tensor]:
            data = labelled(plain(step, micro))
            if step == labels_ignored_at:  # the whole document taken for the prompt
                data["labels"] = torch.full_like(data["labels"], IGNORE_INDEX)
            if padding_labelled:  # a collator that masks nothing, padding with token 0
                padding = data["input_ids"] == PAD
                data["attention_mask"] = (~padding).long()
                data["labels"] = data["labels"].masked_fill(padding, 0)
            return data

        scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        if cosine:
            scheduler = warmup_cosine(opt, steps, warmup)
        elif lr_spike_at is not None:
            scheduler = lr_spike(opt, lr_spike_at)

        def loop_lr(step: int) -> None:
            """The loop sets its own LR every step: TRANSIENT_LR_FACTOR times too high for
            TRANSIENT_LR_STEPS steps from `transient_lr_at`, then its LR again."""
            assert transient_lr_at is not None
            high = transient_lr_at <= step < transient_lr_at + TRANSIENT_LR_STEPS
            for group in opt.param_groups:
                group["lr"] = lr * TRANSIENT_LR_FACTOR if high else lr

        return Workload(
            model=model, optimizer=opt, batch=with_labels if hf_labels else plain,
            loss=label_mean_loss if hf_labels else token_average_loss,
            evaluate=lambda m: lm_eval(m, held_out, token_average_loss),
            scheduler=scheduler, batch_size=batch_size,
            before_step=loop_lr if transient_lr_at is not None else None,
            notes={"optimizer": optimizer, "lr": lr, "layers": layers, "hidden": hidden})

    return build


BASELINES: dict[str, str] = {
    # all faulty runs are the 1-layer SGD LM
    "lstm_lr_too_high_x50": "lstm_healthy_sgd",
    "lstm_lr_too_high_x100": "lstm_healthy_sgd",
    "lstm_numerical_op": "lstm_healthy_sgd",
    "lstm_lr_spike": "lstm_healthy_sgd",
    "lstm_transient_lr": "lstm_healthy_sgd",
    "lstm_labels_ignored": "lstm_healthy_sgd",
    "lstm_padding_labelled": "lstm_healthy_sgd",
}
"""The healthy scenario of the same model and precision that each faulty one is measured
against (its final eval loss under no protection is the reference)."""


def scenarios() -> list[Scenario]:
    sgd = f"plain SGD, constant LR, no clipping; sane LR {SGD_SANE_LR:g}"

    def sgd_at(multiple: float, **fault: Any) -> Callable[[int], Workload]:
        return _builder(STEPS, lr=SGD_SANE_LR * multiple, **fault)

    spike = (f"from step {LR_SPIKE_ONSET} the LR is {LR_SPIKE_FACTOR:g}x for {LR_SPIKE_STEPS} "
             "steps, then back")
    return [
        Scenario("lstm_healthy_sgd", FAMILY, sgd_at(1), STEPS,
                 description=f"1-layer LSTM LM (hidden 64, batch {BATCH}), {sgd}"),
        Scenario("lstm_healthy_adam", FAMILY,
                 _builder(STEPS, optimizer="adam", lr=ADAM_SANE_LR, layers=2, hidden=96,
                          batch_size=ADAM_BATCH, warmup=20, cosine=True), STEPS,
                 description=f"2-layer LSTM LM (hidden 96, batch {ADAM_BATCH}), Adam lr "
                             f"{ADAM_SANE_LR:g} (sane), 20-step warmup + cosine"),
        Scenario("lstm_lr_too_high_x50", FAMILY, sgd_at(50), STEPS, cause="lr_too_high",
                 onset_step=0, sudden=False, severity="mild", recoverable=False,
                 description=f"SGD lr {50 * SGD_SANE_LR:g} = 50x the sane LR, no clipping; 1-layer"
                             " LSTM LM"),
        Scenario("lstm_lr_too_high_x100", FAMILY, sgd_at(100), STEPS, cause="lr_too_high",
                 onset_step=0, sudden=False, severity="severe", recoverable=False,
                 description=f"SGD lr {100 * SGD_SANE_LR:g} = 100x the sane LR, no clipping; "
                             "1-layer LSTM LM"),
        Scenario("lstm_numerical_op", FAMILY, sgd_at(1, empty_batch_at=NUMERICAL_ONSET), STEPS,
                 cause="numerical_op", onset_step=NUMERICAL_ONSET, sudden=True, recoverable=True,
                 description="token-averaged loss divides by the target count, which is 0 for a "
                             f"batch of one-token documents at step {NUMERICAL_ONSET} (0/0 = NaN);"
                             f" {sgd}"),
        Scenario("lstm_labels_ignored", FAMILY,
                 sgd_at(1, hf_labels=True, labels_ignored_at=LABELS_IGNORED_ONSET), STEPS,
                 cause="empty_loss", onset_step=LABELS_IGNORED_ONSET, sudden=True,
                 recoverable=True,
                 description="input_ids and labels (-100 on padding), mean cross-entropy over "
                             f"the labels kept; every label of the batch at step "
                             f"{LABELS_IGNORED_ONSET} is -100 (NaN); {sgd}"),
        Scenario("lstm_padding_labelled", FAMILY,
                 sgd_at(1, hf_labels=True, padding_labelled=True), STEPS,
                 cause="padding_labels", onset_step=0, sudden=False, recoverable=False,
                 description="input_ids, an attention_mask and labels copied from the next "
                             "tokens with the padding labelled 0 (not -100): the loss trains "
                             f"the model to predict the padding; {sgd}"),
        Scenario("lstm_lr_spike", FAMILY, sgd_at(1, lr_spike_at=LR_SPIKE_ONSET), STEPS,
                 cause="lr_too_high", onset_step=LR_SPIKE_ONSET, sudden=True, recoverable=True,
                 description=f"a misconfigured schedule restart: {spike}; {sgd}"),
        Scenario("lstm_transient_lr", FAMILY, sgd_at(1, transient_lr_at=LR_SPIKE_ONSET), STEPS,
                 cause="lr_too_high", onset_step=LR_SPIKE_ONSET, sudden=True, recoverable=True,
                 description=f"the loop sets the LR itself each step: {TRANSIENT_LR_FACTOR:g}x "
                             f"for {TRANSIENT_LR_STEPS} steps from step {LR_SPIKE_ONSET}, then "
                             f"its LR again; {sgd}"),
    ]
