"""Tiny TRL runs for the integration tests: a 2-layer GPT-2 built from a config, a character
tokenizer built in memory (nothing downloaded), rule rewards, a few steps on the CPU."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")

import torch
import trl
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

from trainguard import GuardConfig
from trainguard.hf import TrainguardCallback

CHARS = "abcdefghijklmnopqrstuvwxyz0123456789 .,!?:+-="


def tokenizer() -> PreTrainedTokenizerFast:
    vocab = {c: i for i, c in enumerate(["<pad>", "<eos>", *CHARS])}
    inner = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    inner.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(tokenizer_object=inner, pad_token="<pad>", eos_token="<eos>")


def tiny_gpt2(tok: PreTrainedTokenizerFast, seed: int, dropout: float = 0.0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=len(tok), n_positions=64,
                        bos_token_id=1, eos_token_id=1, pad_token_id=0, resid_pdrop=dropout,
                        embd_pdrop=dropout, attn_pdrop=dropout)
    return GPT2LMHeadModel(config)


@dataclass
class Ran:
    trainer: Any
    callback: TrainguardCallback

    @property
    def events(self) -> list[Any]:
        assert self.callback.run is not None
        return self.callback.run.events

    def kinds(self, at_least: str = "warning") -> set[str]:
        from trainguard.events import at_least as severe

        return {e.kind for e in self.events if severe(e.severity, at_least)}

    def top_cause(self) -> str | None:
        assert self.callback.run is not None
        ranked = self.callback.run.diagnose()
        return ranked[0].code if ranked else None

    @property
    def verdict(self) -> Any:
        assert self.callback.run is not None
        return self.callback.run.verdict


def _common(tmp: Path, seed: int, steps: int, lr: float, logging: int) -> dict[str, Any]:
    return dict(output_dir=str(tmp), max_steps=steps, learning_rate=lr, logging_steps=logging,
                report_to=[], save_strategy="no", seed=seed, use_cpu=True, disable_tqdm=True)


def dpo(tmp: Path, *, seed: int = 0, lr: float = 1e-3, steps: int = 40,
        policy: str = "guarded", dropout: float = 0.0, beta: float = 0.1) -> Ran:
    """A DPO run on one preference ('yes good' over 'no bad x'), its reference a frozen copy of
    the policy. `policy`: 'observe' for the policy of that name. `dropout`: the model's dropout,
    left on in training (TRL's `disable_dropout=False`)."""
    tok = tokenizer()
    model = tiny_gpt2(tok, seed, dropout=dropout)
    rows = [{"prompt": f"q{i % 7} ", "chosen": "yes good", "rejected": "no bad x"}
            for i in range(64)]
    args = trl.DPOConfig(per_device_train_batch_size=4, max_length=32, beta=beta,
                         disable_dropout=not dropout, **_common(tmp, seed, steps, lr, 5))
    callback = TrainguardCallback(GuardConfig(policy="observe" if policy == "observe"
                                              else "protect"))
    trainer = trl.DPOTrainer(model=model, ref_model=copy.deepcopy(model), args=args,
                             train_dataset=Dataset.from_list(rows), processing_class=tok,
                             callbacks=[callback])
    trainer.train()
    return Ran(trainer, callback)


Reward = Callable[..., list[float]]


def letters_reward(completions: list[str], **kwargs: Any) -> list[float]:
    """The share of a completion's characters in the first half of the alphabet: completions
    of one prompt score differently."""
    return [sum(ch in "abcdefghijklm" for ch in c) / max(len(c), 1) for c in completions]


def grpo(tmp: Path, *, seed: int = 0, lr: float = 1e-3, steps: int = 12, beta: float = 0.0,
         reward: Reward | list[Reward] = letters_reward, max_completion_length: int = 8,
         policy: str = "protect", schedule: str = "linear") -> Ran:
    """`schedule`: the Trainer's `lr_scheduler_type` (its default decays the LR to 0 over the
    run: a fault of the LR in a short run fades with it)."""
    tok = tokenizer()
    model: Any = tiny_gpt2(tok, seed)
    if beta:  # GRPO builds its reference model from the policy's path
        model.save_pretrained(tmp / "policy")
        model = str(tmp / "policy")
    rows = [{"prompt": f"say a{i % 5} "} for i in range(64)]
    args = trl.GRPOConfig(per_device_train_batch_size=8, num_generations=4, beta=beta,
                          max_completion_length=max_completion_length,
                          lr_scheduler_type=schedule, **_common(tmp / "out", seed, steps, lr, 4))
    callback = TrainguardCallback(GuardConfig(policy=policy))
    rewards = reward if isinstance(reward, list) else [reward]
    trainer = trl.GRPOTrainer(model=model, reward_funcs=rewards, args=args,
                              train_dataset=Dataset.from_list(rows), processing_class=tok,
                              callbacks=[callback])
    trainer.train()
    return Ran(trainer, callback)


def kto(tmp: Path, *, seed: int = 0, lr: float = 1e-3, steps: int = 20) -> Ran:
    """A KTO run on unpaired examples ('yes good' desirable, 'no bad x' not)."""
    tok = tokenizer()
    model = tiny_gpt2(tok, seed)
    rows = [{"prompt": f"q{i % 7} ", "completion": "yes good" if i % 2 else "no bad x",
             "label": bool(i % 2)} for i in range(64)]
    args = trl.KTOConfig(per_device_train_batch_size=8, max_length=32,
                         **_common(tmp, seed, steps, lr, 5))
    callback = TrainguardCallback(GuardConfig(policy="protect"))
    trainer = trl.KTOTrainer(model=model, ref_model=copy.deepcopy(model), args=args,
                             train_dataset=Dataset.from_list(rows), processing_class=tok,
                             callbacks=[callback])
    trainer.train()
    return Ran(trainer, callback)


def rloo(tmp: Path, *, seed: int = 0, lr: float = 1e-3, steps: int = 12,
         reward: Reward = letters_reward) -> Ran:
    """An RLOO run (its KL term on by default: the reference is built from the policy's path)."""
    tok = tokenizer()
    tiny_gpt2(tok, seed).save_pretrained(tmp / "policy")
    rows = [{"prompt": f"say a{i % 5} "} for i in range(64)]
    args = trl.RLOOConfig(per_device_train_batch_size=8, num_generations=4,
                          max_completion_length=8, **_common(tmp / "out", seed, steps, lr, 4))
    callback = TrainguardCallback(GuardConfig(policy="protect"))
    trainer = trl.RLOOTrainer(model=str(tmp / "policy"), reward_funcs=[reward], args=args,
                              train_dataset=Dataset.from_list(rows), processing_class=tok,
                              callbacks=[callback])
    trainer.train()
    return Ran(trainer, callback)


def sft(tmp: Path, *, seed: int = 0, lr: float = 1e-3, steps: int = 20,
        policy: str = "recover") -> Ran:
    """An SFT run on short texts: a TRL trainer with no preference, no reward and no beta."""
    tok = tokenizer()
    model = tiny_gpt2(tok, seed)
    rows = [{"text": f"say a{i % 5} then b{i % 3}."} for i in range(64)]
    args = trl.SFTConfig(per_device_train_batch_size=8, max_length=32,
                         **_common(tmp, seed, steps, lr, 5))
    callback = TrainguardCallback(GuardConfig(policy=policy))
    trainer = trl.SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows),
                             processing_class=tok, callbacks=[callback])
    trainer.train()
    return Ran(trainer, callback)
