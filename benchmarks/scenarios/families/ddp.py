"""Data-parallel fine-tuning of a tiny causal LM on two ranks (DistributedDataParallel, gloo).

Model: `TinyCausalLM` (2 pre-norm transformer layers, d_model 48, 64-token vocabulary),
pre-trained briefly on a 64-token Markov language (`MarkovLanguage`, branching 3) and fine-tuned
on a different, two-domain language: domain A is a sparse Markov chain over tokens 0-31, domain B
another one over tokens 32-63. The corpus comes as one file per domain and each rank reads its
own file (rank 0 domain A, rank 1 domain B), as file-sharded loaders do. That is harmless as long
as DDP all-reduces every gradient: each update is the average over both domains. The held-out
loss is measured on both domains in equal parts.

The fine-tune follows the gradual-unfreezing recipe (ULMFiT, in two stages): for the first
`UNFREEZE_STEP` steps only the output layer (final norm and LM head) learns, then the whole model
does, with a linear warmup and cosine decay. The sane AdamW learning rate of this tiny model,
`SANE_LR` = 1e-2, is calibrated here (the guide's 1e-6..5e-5 is for 7B models): in 150 steps
the held-out loss (entropy floor 0.54) reaches 1.19 at 1e-3, 0.71 at 3e-3, 0.57 at 1e-2, 0.58 at
3e-2 and 2.0 at 1e-1; 1e-2 is the lower of the two best.

Scenarios:

- `ddp_healthy`: the backbone is frozen through its learning rate (0 until `UNFREEZE_STEP`), so
  every parameter is trainable when the model is wrapped in DistributedDataParallel and every
  gradient is all-reduced. The replicas stay identical.
- `ddp_desync` (guide 3.4.1, "replicas out of sync across ranks"): the backbone is frozen with
  `requires_grad=False` before the model is wrapped and unfrozen at `UNFREEZE_STEP`. DDP decides at
  construction which parameters it all-reduces, so from that step the backbone learns from each
  rank's local gradients only: rank 0's backbone learns domain A alone, rank 1's domain B alone,
  and the replicas drift apart while each rank's own training loss keeps falling. Rank 0 (the
  rank that saves checkpoints) ends with a model that has lost domain B. Persistent: no skipped
  step brings the replicas back together. (A monitor attached before the unfreeze, as a Guard
  built with the workload is, watches only the parameters that were trainable then: the output
  layer.)
"""

from __future__ import annotations

import math
from functools import partial

import torch
from torch import nn
from torch.nn import functional as F

from trainguard.demo import MarkovLanguage, TinyCausalLM

from ..base import Scenario, Workload, lm_eval
from ..distributed import rank_and_world, rank_zero_first, unwrap
from ..pretrain import pretrained

FAMILY = "ddp"
VOCAB = 64
DOMAIN_VOCAB = 32
"""Each fine-tuning domain uses its own half of the vocabulary."""
SEQ_LEN = 32
D_MODEL = 48
BATCH_PER_RANK = 16
POOL_PER_DOMAIN = 1024
"""Sequences in each domain's training file."""
EVAL_BATCHES = 4
EVAL_BATCH = 64
STEPS = 150
UNFREEZE_STEP = 20
WARMUP_STEPS = 10
SANE_LR = 1e-2
WEIGHT_DECAY = 0.01

PRETRAIN_KEY = "ddp_tinylm48_markov64b3_s1234_adamw150"
PRETRAIN_STEPS = 150
PRETRAIN_SEED = 1234


def _sample(transition: torch.Tensor, count: int, length: int,
            generator: torch.Generator) -> torch.Tensor:
    """`count` sequences of a Markov chain with the given transition matrix."""
    tokens = torch.empty(count, length, dtype=torch.long)
    tokens[:, 0] = torch.randint(transition.shape[0], (count,), generator=generator)
    for i in range(1, length):
        tokens[:, i] = torch.multinomial(transition[tokens[:, i - 1]], 1,
                                         generator=generator).squeeze(1)
    return tokens


def _new_model() -> TinyCausalLM:
    return TinyCausalLM(vocab_size=VOCAB, d_model=D_MODEL, n_layer=2, n_head=4, max_len=SEQ_LEN)


def _pretrain(model: nn.Module) -> None:
    """Pre-training language: one 64-token Markov chain, unrelated to the fine-tuning domains."""
    generator = torch.Generator().manual_seed(PRETRAIN_SEED)
    language = MarkovLanguage(vocab_size=VOCAB, branching=3, seed=7)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=WEIGHT_DECAY)
    for _ in range(PRETRAIN_STEPS):
        tokens = _sample(language.transition, 32, SEQ_LEN, generator)
        loss = _next_token_loss(model, tokens)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def _next_token_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    # Through the model's own forward: under DDP that is what registers the gradient all-reduce.
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


DOMAIN_SEEDS = (21, 22)


def _domain_chains() -> list[MarkovLanguage]:
    """The two fine-tuning domains, each a chain over its own half of the vocabulary."""
    return [MarkovLanguage(vocab_size=DOMAIN_VOCAB, branching=2, seed=s) for s in DOMAIN_SEEDS]


def _domain_file(chain: MarkovLanguage, domain: int, count: int,
                 generator: torch.Generator) -> torch.Tensor:
    return _sample(chain.transition, count, SEQ_LEN, generator) + domain * DOMAIN_VOCAB


def _build(seed: int, *, desync: bool) -> Workload:
    rank, world = rank_and_world()
    with torch.random.fork_rng():  # the same initial weights whatever the caller's RNG state
        torch.manual_seed(PRETRAIN_SEED)
        model = _new_model()
    with rank_zero_first():  # one rank fills the cache, the other reads it
        pretrained(PRETRAIN_KEY, model, _pretrain)
    chains = _domain_chains()
    data_gen = torch.Generator().manual_seed(10_000 + seed)
    files = [_domain_file(chain, d, POOL_PER_DOMAIN, data_gen) for d, chain in enumerate(chains)]
    held_out = [torch.cat([_domain_file(chain, d, EVAL_BATCH // 2, data_gen)
                           for d, chain in enumerate(chains)]) for _ in range(EVAL_BATCHES)]
    # File sharding: each rank reads one domain's file; a single process reads both.
    shard = torch.cat(files) if world == 1 else files[rank % len(files)]

    head = [*model.norm.parameters(), *model.head.parameters()]
    head_ids = {id(p) for p in head}
    backbone = [p for p in model.parameters() if id(p) not in head_ids]
    if desync:
        for p in backbone:  # frozen before DDP is built: DDP will never all-reduce them
            p.requires_grad_(False)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)

    optimizer = torch.optim.AdamW([{"params": head}, {"params": backbone}], lr=SANE_LR,
                                  weight_decay=WEIGHT_DECAY)

    def warmup_cosine(step: int) -> float:
        return min(1.0, (step + 1) / WARMUP_STEPS) * 0.5 * (1 + math.cos(math.pi * step / STEPS))

    def backbone_schedule(step: int) -> float:
        return 0.0 if step < UNFREEZE_STEP else warmup_cosine(step)

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, [warmup_cosine, backbone_schedule])

    def batch(step: int, micro: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(
            ((seed * 4 + rank) * 1_000_003 + step) * 64 + micro)
        index = torch.randint(len(shard), (BATCH_PER_RANK,), generator=generator)
        return shard[index]

    def loss(model: nn.Module, tokens: torch.Tensor, step: int) -> torch.Tensor:
        if desync and step >= UNFREEZE_STEP and not backbone[0].requires_grad:
            for p in backbone:  # the unfreezing callback: too late for DDP to see it
                p.requires_grad_(True)
        return _next_token_loss(model, tokens)

    def evaluate(model: nn.Module) -> float:
        # The local replica alone: evaluation never waits for another rank.
        return lm_eval(unwrap(model), held_out, lambda m, b, _: _next_token_loss(m, b))

    notes = {"initial_eval_loss": evaluate(model),
             "entropy_floor": sum(chain.entropy_floor for chain in chains) / len(chains)}
    return Workload(model=model, optimizer=optimizer, batch=batch, loss=loss,
                    evaluate=evaluate, scheduler=scheduler, batch_size=BATCH_PER_RANK,
                    notes=notes)


BASELINES: dict[str, str] = {"ddp_desync": "ddp_healthy"}
"""The healthy scenario of the same model and precision that each faulty one is measured
against (its final eval loss under no protection is the reference)."""


def scenarios() -> list[Scenario]:
    return [
        Scenario(
            name="ddp_healthy", family=FAMILY, build=partial(_build, desync=False), steps=STEPS,
            distributed=True,
            description=(f"2-rank DDP fine-tune, one domain per rank, AdamW lr {SANE_LR:g} "
                         f"warmup+cosine, backbone unfrozen at step {UNFREEZE_STEP} through its "
                         "LR so DDP all-reduces every gradient")),
        Scenario(
            name="ddp_desync", family=FAMILY, build=partial(_build, desync=True), steps=STEPS,
            cause="ddp_desync", onset_step=UNFREEZE_STEP, sudden=False, recoverable=False,
            distributed=True,
            description=(f"backbone frozen (requires_grad=False) before DDP wrapping, unfrozen "
                         f"at step {UNFREEZE_STEP}: its gradients are never all-reduced, each "
                         "rank's backbone learns only its own domain and the replicas drift")),
    ]
