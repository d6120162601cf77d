"""Preference and RL fine-tuning in a plain loop: DPO and GRPO written out, the step's metrics
handed to `guard.step(..., metrics=...)` under the names TRL logs.

DPO: a 1-block causal transformer (`trainguard.demo.TinyCausalLM`, vocabulary 16, 32 wide) as
the policy, a frozen copy of it as the reference; preference pairs of token sequences (a prompt
of 3 tokens, then a response of 3: the chosen one the prompt reversed, the rejected one random).
Loss `-logsigmoid(beta * ((logp_c - ref_c) - (logp_r - ref_r)))` with beta 0.1, AdamW 1e-3;
metrics `rewards/chosen` and `rewards/rejected`, beta times the policy's log-ratio to the
reference, means over the batch.

GRPO: a small policy over 8 tokens (token 0 ends a completion) that writes, token by token, a
completion of at most `max_completion_length` tokens for a prompt token; it starts as a model
tuned to the answer's format would (it rarely stops before 3 tokens, usually right after). The
rule reward parses the first 3 tokens of a completion as the answer (a completion shorter than
that cannot be parsed: 0) and scores the share of them that are right. 8 prompts a step, 8
completions each; advantages normalised within each group; loss TRL's
`-exp(logp - logp.detach()) * adv + beta * k3_kl` per token against a frozen reference, AdamW
1e-2, 40 steps. The loop hands `guard.step` no loss to judge (a surrogate's level says nothing
of progress), only its metrics: `reward`, `reward_std`, `frac_reward_zero_std`, `entropy`,
`completions/clipped_ratio`, and `kl` when beta > 0 (as TRL logs them).

Faults, each made the way users make it:
    rlhf_dpo_lr_zero               the LR is 0: the rewards stay exactly 0 (`lr_too_low`)
    rlhf_dpo_reference_is_policy   the reference passed is the policy module itself: the
                                   rewards stay exactly 0 while it trains (`reference_is_policy`)
    rlhf_dpo_dropout_on            the policy trains with dropout on, its reference a copy in eval
                                   mode: the first rewards are not 0 (`policy_dropout`)
    rlhf_dpo_fp16                  the policy and its reference loaded in float16, AdamW at its
                                   defaults: the first update's second moments underflow, m / (sqrt
                                   (v) + eps) overflows and the weights go to inf (`optimizer_eps`,
                                   as the float16 faults of the other families: Adam's state in
                                   float16, where float32 master weights or bf16 are needed)
    rlhf_grpo_reward_constant      the reward function returns 0 for everything
                                   (`reward_constant`)
    rlhf_grpo_completions_cut      `max_completion_length` 2, shorter than the answer the reward
                                   parses: every completion cut, every reward 0
                                   (`max_completion_length_too_small`)
    rlhf_grpo_beta_too_low         beta 1e-4 at the healthy LR with the KL logged: the policy
                                   drifts from its reference unheld (`beta_too_low`)
    rlhf_grpo_lr_too_high          AdamW 0.3 (30x), beta 0: the policy collapses and the reward,
                                   which told completions apart, stops doing so (`lr_too_high`)
    rlhf_grpo_lr_too_high_kl       the same LR with beta 0.3: the KL blows up (`lr_too_high`)

Healthy twins: DPO at LR 1e-3; GRPO with beta 0 (TRL's default, no KL logged) and with beta
0.3 (its KL stays near its level: 0.12 after 32 steps at seed 0, where beta 1e-4 reaches 0.49 at
step 31).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainguard.demo import TinyCausalLM

from ..base import Batch, Scenario, Workload

FAMILY = "rlhf"

# DPO
DPO_VOCAB = 16
PROMPT_LEN = 3
RESPONSE_LEN = 3
DPO_PAIRS = 16
DPO_STEPS = 40
DPO_LR = 1e-3
DPO_BETA = 0.1
DPO_DROPOUT = 0.1

# GRPO
VOCAB = 8
EOS = 0
ANSWER_LEN = 3
"""Tokens of the answer the reward parses."""
MAX_COMPLETION = ANSWER_LEN + 2
PROMPTS = 8
GROUP = 8
WIDTH = 32
GRPO_STEPS = 40
GRPO_LR = 1e-2
HEALTHY_BETA = 0.3
LOW_BETA = 1e-4
HIGH_GRPO_LR = 0.3
"""30x the healthy LR."""
EARLY_STOP_BIAS, STOP_BIAS = -8.0, 2.0
"""The starting EOS logit bias before and after the answer's length: a policy tuned to the
format rarely stops before its answer and usually right after."""

EVAL_BATCHES = 2
_TRAIN_STREAM, _EVAL_STREAM, _SAMPLE_STREAM = 0, 1, 2


def _generator(seed: int, stream: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(((seed * 7919 + stream) * 1_000_003 + step) * 101)


# ---------------------------------------------------------------- DPO


@dataclass(frozen=True)
class DPORecipe:
    lr: float = DPO_LR
    reference_is_policy: bool = False
    dropout: float = 0.0
    half: bool = False
    """The policy (and its reference, a copy) loaded in float16, AdamW at its defaults."""


def _pairs(generator: torch.Generator) -> torch.Tensor:
    """Chosen sequences (the prompt, then the prompt reversed) over rejected ones (the prompt,
    then random tokens): (2 * pairs, prompt + response)."""
    prompt = torch.randint(DPO_VOCAB, (DPO_PAIRS, PROMPT_LEN), generator=generator)
    chosen = torch.cat([prompt, prompt.flip(1)], 1)
    rejected = torch.cat([prompt, torch.randint(DPO_VOCAB, (DPO_PAIRS, RESPONSE_LEN),
                                                generator=generator)], 1)
    return torch.cat([chosen, rejected])


def _response_logp(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """The summed log-probability of each sequence's response tokens."""
    logp = F.log_softmax(model(tokens[:, :-1]).float(), -1)
    picked = logp.gather(-1, tokens[:, 1:, None]).squeeze(-1)
    return picked[:, PROMPT_LEN - 1:].sum(-1)


def _dpo(model: nn.Module, reference: nn.Module, tokens: Batch
         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The DPO loss and the chosen and rejected rewards of a batch."""
    logp = _response_logp(model, tokens)
    with torch.no_grad():
        ref = _response_logp(reference, tokens)
    rewards = DPO_BETA * (logp - ref)
    chosen, rejected = rewards[:DPO_PAIRS], rewards[DPO_PAIRS:]
    return -F.logsigmoid(chosen - rejected).mean(), chosen, rejected


def build_dpo(seed: int, recipe: DPORecipe) -> Workload:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = TinyCausalLM(DPO_VOCAB, d_model=32, n_layer=1, n_head=2,
                             max_len=PROMPT_LEN + RESPONSE_LEN, dropout=recipe.dropout)
    model.train()
    if recipe.half:  # as `from_pretrained(..., torch_dtype=torch.float16)` loads it
        model.half()
    reference = model if recipe.reference_is_policy else copy.deepcopy(model).requires_grad_(False)
    if recipe.dropout and reference is not model:
        reference.eval()  # as TRL keeps its reference; the policy trains with its dropout on
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.0)
    held_out = [_pairs(_generator(seed, _EVAL_STREAM, i)) for i in range(EVAL_BATCHES)]
    metrics: dict[int, dict[str, Any]] = {}

    def loss(m: nn.Module, tokens: Batch, step: int) -> torch.Tensor:
        value, chosen, rejected = _dpo(m, reference, tokens)
        metrics[step] = {"rewards/chosen": chosen.detach().mean(),
                         "rewards/rejected": rejected.detach().mean()}
        return value

    def evaluate(m: nn.Module) -> float:
        with torch.no_grad():
            values = [float(_dpo(m, reference, tokens)[0]) for tokens in held_out]
        return sum(values) / len(values)

    return Workload(model=model, optimizer=optimizer,
                    batch=lambda step, micro: _pairs(_generator(seed, _TRAIN_STREAM, step)),
                    loss=loss, evaluate=evaluate, batch_size=DPO_PAIRS,
                    metrics=lambda step: metrics.pop(step, {}))


# ---------------------------------------------------------------- GRPO


class Policy(nn.Module):
    """A next-token policy of the prompt token, the position and the token before."""

    def __init__(self) -> None:
        super().__init__()
        self.prompt = nn.Embedding(VOCAB, WIDTH)
        self.position = nn.Embedding(MAX_COMPLETION, WIDTH)
        self.previous = nn.Embedding(VOCAB, WIDTH)
        self.hidden = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)
        self.stop = nn.Parameter(torch.tensor(
            [EARLY_STOP_BIAS if i < ANSWER_LEN else STOP_BIAS for i in range(MAX_COMPLETION)]))
        for module in (self.prompt, self.position, self.previous):
            nn.init.normal_(module.weight, std=0.5)
        nn.init.normal_(self.head.weight, std=0.02)
        nn.init.zeros_(self.head.bias)

    def forward(self, prompts: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        """Logits of every position: prompts (n,), previous tokens (n, length)."""
        length = previous.shape[1]
        h = (self.prompt(prompts)[:, None] + self.position.weight[:length]
             + self.previous(previous))
        logits = self.head(torch.tanh(self.hidden(torch.tanh(h))))
        stop = F.one_hot(torch.tensor(EOS), VOCAB).float() * self.stop[:length, None]
        return logits + stop


def answer(prompts: torch.Tensor) -> torch.Tensor:
    """The right answer to each prompt token: the next `ANSWER_LEN` tokens after it (1..7)."""
    steps = torch.arange(1, ANSWER_LEN + 1)
    return (prompts[:, None] - 1 + steps) % (VOCAB - 1) + 1


def parsed_answer_reward(prompts: torch.Tensor, completions: torch.Tensor,
                         lengths: torch.Tensor) -> torch.Tensor:
    """The share of the answer's tokens that are right; 0 when the completion is shorter than
    the answer (nothing to parse)."""
    if completions.shape[1] < ANSWER_LEN:
        return torch.zeros(len(prompts))
    right = (completions[:, :ANSWER_LEN] == answer(prompts)).float().mean(1)
    return torch.where(lengths >= ANSWER_LEN, right, torch.zeros(()))


def zero_reward(prompts: torch.Tensor, completions: torch.Tensor,
                lengths: torch.Tensor) -> torch.Tensor:
    """A reward that gives every completion the same score."""
    del completions, lengths
    return torch.zeros(len(prompts))


Reward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class GRPORecipe:
    lr: float = GRPO_LR
    beta: float = 0.0
    max_completion_length: int = MAX_COMPLETION
    reward: Reward = parsed_answer_reward


def sample(policy: Policy, prompts: torch.Tensor, max_length: int,
           generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Completions token by token (sampled, or greedy without a generator), padded with EOS
    after their end, and their lengths before EOS."""
    n = len(prompts)
    tokens = torch.full((n, max_length), EOS, dtype=torch.long)
    previous = torch.full((n, 1), EOS, dtype=torch.long)
    ended = torch.zeros(n, dtype=torch.bool)
    lengths = torch.full((n,), max_length)
    with torch.no_grad():
        for i in range(max_length):
            logits = policy(prompts, previous)[:, -1]
            token = (torch.multinomial(F.softmax(logits, -1), 1, generator=generator).squeeze(1)
                     if generator is not None else logits.argmax(-1))
            token = torch.where(ended, torch.full_like(token, EOS), token)
            lengths = torch.where(~ended & (token == EOS), torch.full_like(lengths, i), lengths)
            ended = ended | (token == EOS)
            tokens[:, i] = token
            previous = torch.cat([previous, token[:, None]], 1)
    return tokens, lengths


def _previous(tokens: torch.Tensor) -> torch.Tensor:
    return torch.cat([torch.full((len(tokens), 1), EOS, dtype=torch.long), tokens[:, :-1]], 1)


@dataclass
class KLPenaltyHolder:
    """The loop's KL coefficient, read by its loss at every step (as a TRL trainer's
    `self.beta`)."""

    beta: float


def build_grpo(seed: int, recipe: GRPORecipe) -> Workload:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        policy = Policy()
    policy.train()
    reference = copy.deepcopy(policy).requires_grad_(False)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=recipe.lr, weight_decay=0.0)
    max_length = recipe.max_completion_length
    metrics: dict[int, dict[str, Any]] = {}
    penalty = KLPenaltyHolder(recipe.beta)  # read every step: a guard may raise it

    def batch(step: int, micro: int) -> Batch:
        del micro
        prompts = torch.randint(1, VOCAB, (PROMPTS,), generator=_generator(seed, _TRAIN_STREAM,
                                                                           step))
        return prompts.repeat_interleave(GROUP)

    def loss(model: nn.Module, prompts: Batch, step: int) -> torch.Tensor:
        generator = _generator(seed, _SAMPLE_STREAM, step)
        assert isinstance(model, Policy)
        completions, lengths = sample(model, prompts, max_length, generator)
        rewards = recipe.reward(prompts, completions, lengths)
        grouped = rewards.view(PROMPTS, GROUP)
        std = grouped.std(1)
        advantages = ((grouped - grouped.mean(1, keepdim=True))
                      / (std[:, None] + 1e-4)).reshape(-1)
        # the tokens a completion holds, its EOS included
        mask = (torch.arange(max_length)[None] <= lengths[:, None]).float()
        previous = _previous(completions)
        logp_all = F.log_softmax(model(prompts, previous), -1)
        logp = logp_all.gather(-1, completions[..., None]).squeeze(-1)
        per_token = -torch.exp(logp - logp.detach()) * advantages[:, None]
        found: dict[str, Any] = {}
        if penalty.beta:
            with torch.no_grad():
                ref = F.log_softmax(reference(prompts, previous), -1).gather(
                    -1, completions[..., None]).squeeze(-1)
            kl = torch.exp(ref - logp) - (ref - logp) - 1
            per_token = per_token + penalty.beta * kl
            found["kl"] = ((kl * mask).sum() / mask.sum()).detach()
        value = ((per_token * mask).sum(1) / mask.sum(1)).mean()
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        found.update({
            "reward": rewards.mean(), "reward_std": std.mean(),
            "frac_reward_zero_std": (std == 0).float().mean(),
            "entropy": ((entropy * mask).sum() / mask.sum()).detach(),
            "completions/clipped_ratio": (lengths == max_length).float().mean()})
        metrics[step] = found
        return value

    held_out = torch.arange(1, VOCAB)

    def evaluate(model: nn.Module) -> float:
        """1 - the mean reward of greedy answers to every prompt (NaN for a broken policy)."""
        assert isinstance(model, Policy)
        if not all(torch.isfinite(p).all() for p in model.parameters()):
            return math.nan
        completions, lengths = sample(model, held_out, max_length, None)
        return 1.0 - float(parsed_answer_reward(held_out, completions, lengths).mean())

    return Workload(model=policy, optimizer=optimizer, batch=batch, loss=loss,
                    evaluate=evaluate, batch_size=PROMPTS * GROUP,
                    metrics=lambda step: metrics.pop(step, {}), surrogate=True,
                    kl_penalty=penalty if recipe.beta else None)


# ---------------------------------------------------------------- scenarios


def _dpo_scenario(name: str, recipe: DPORecipe, description: str, **fault: object) -> Scenario:
    return Scenario(name=name, family=FAMILY, build=partial(build_dpo, recipe=recipe),
                    steps=DPO_STEPS, description=description, **fault)  # type: ignore[arg-type]


def _grpo_scenario(name: str, recipe: GRPORecipe, description: str, **fault: object) -> Scenario:
    return Scenario(name=name, family=FAMILY, build=partial(build_grpo, recipe=recipe),
                    steps=GRPO_STEPS, description=description, **fault)  # type: ignore[arg-type]


BASELINES: dict[str, str] = {
    "rlhf_dpo_lr_zero": "rlhf_dpo_healthy",
    "rlhf_dpo_reference_is_policy": "rlhf_dpo_healthy",
    "rlhf_dpo_dropout_on": "rlhf_dpo_healthy",
    "rlhf_dpo_fp16": "rlhf_dpo_healthy",
    "rlhf_grpo_reward_constant": "rlhf_grpo_healthy",
    "rlhf_grpo_completions_cut": "rlhf_grpo_healthy",
    "rlhf_grpo_beta_too_low": "rlhf_grpo_healthy_kl",
    "rlhf_grpo_lr_too_high": "rlhf_grpo_healthy",
    "rlhf_grpo_lr_too_high_kl": "rlhf_grpo_healthy_kl",
}
"""Each fault's healthy twin (`benchmarks/scenarios/recovery.py`): the same loop made right."""


def scenarios() -> list[Scenario]:
    dpo, grpo = DPORecipe(), GRPORecipe()
    stall = {"onset_step": 0, "sudden": False, "recoverable": False}
    return [
        _dpo_scenario("rlhf_dpo_healthy", dpo,
                      f"DPO in a plain loop: a 1-block causal LM against a frozen copy, beta "
                      f"{DPO_BETA:g}, AdamW {DPO_LR:g}"),
        _dpo_scenario("rlhf_dpo_lr_zero", replace(dpo, lr=0.0),
                      "the same DPO loop at LR 0: the policy never leaves its reference",
                      cause="lr_too_low", **stall),
        _dpo_scenario("rlhf_dpo_reference_is_policy", replace(dpo, reference_is_policy=True),
                      "the policy module passed as its own reference: the rewards stay exactly "
                      "0 while it trains", cause="reference_is_policy", **stall),
        _dpo_scenario("rlhf_dpo_dropout_on", replace(dpo, dropout=DPO_DROPOUT),
                      f"the policy trained with dropout {DPO_DROPOUT:g} on, its reference a copy "
                      "in eval mode: their log-probabilities differ before any update",
                      cause="policy_dropout", **stall),
        _dpo_scenario("rlhf_dpo_fp16", replace(dpo, half=True),
                      "the same DPO loop with the policy and its reference loaded in float16, "
                      "AdamW at its defaults: the first update overflows the weights",
                      cause="optimizer_eps", onset_step=0, sudden=True, recoverable=False),
        _grpo_scenario("rlhf_grpo_healthy", grpo,
                       f"GRPO in a plain loop: {GROUP} completions of up to {MAX_COMPLETION} "
                       f"tokens per prompt, a rule reward on the parsed answer, beta 0, AdamW "
                       f"{GRPO_LR:g}"),
        _grpo_scenario("rlhf_grpo_healthy_kl", replace(grpo, beta=HEALTHY_BETA),
                       f"the same GRPO loop with a KL penalty to a frozen reference, beta "
                       f"{HEALTHY_BETA:g}"),
        _grpo_scenario("rlhf_grpo_reward_constant", replace(grpo, reward=zero_reward),
                       "a reward function that returns 0 for every completion",
                       cause="reward_constant", **stall),
        _grpo_scenario("rlhf_grpo_completions_cut", replace(grpo, max_completion_length=2),
                       f"max_completion_length 2, shorter than the {ANSWER_LEN}-token answer the "
                       "reward parses: every completion cut, every reward 0",
                       cause="max_completion_length_too_small", **stall),
        _grpo_scenario("rlhf_grpo_beta_too_low", replace(grpo, beta=LOW_BETA),
                       f"beta {LOW_BETA:g} at the healthy LR: the KL to the reference drifts up "
                       "unheld", cause="beta_too_low", **stall),
        _grpo_scenario("rlhf_grpo_lr_too_high", replace(grpo, lr=HIGH_GRPO_LR),
                       f"AdamW {HIGH_GRPO_LR:g}, beta 0: the policy collapses, every completion "
                       "of a prompt alike, and the reward stops telling them apart",
                       cause="lr_too_high", **stall),
        _grpo_scenario("rlhf_grpo_lr_too_high_kl",
                       replace(grpo, lr=HIGH_GRPO_LR, beta=HEALTHY_BETA),
                       f"AdamW {HIGH_GRPO_LR:g} with beta {HEALTHY_BETA:g}: the KL blows up at "
                       "the first updates", cause="lr_too_high", **stall),
    ]
