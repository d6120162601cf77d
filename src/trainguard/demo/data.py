"""A synthetic language whose structure a small model can learn, so the loss really falls."""

from __future__ import annotations

import torch

from trainguard.chance_level import chance_loss


class MarkovLanguage:
    """Token sequences from a sparse first-order Markov chain.

    Every token has `branching` likely successors, so a model that learns the chain reaches a loss
    near log(branching), far below the log(vocab_size) of random guessing.
    """

    def __init__(self, vocab_size: int = 64, branching: int = 3, seed: int = 0) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.vocab_size = vocab_size
        logits = torch.full((vocab_size, vocab_size), -1e9)
        for token in range(vocab_size):
            successors = torch.randperm(vocab_size, generator=generator)[:branching]
            logits[token, successors] = torch.randn(branching, generator=generator)
        self.transition = torch.softmax(logits, dim=-1)
        self.generator = torch.Generator().manual_seed(seed + 1)

    @property
    def entropy_floor(self) -> float:
        """Average next-token entropy: the loss a perfect model reaches."""
        p = self.transition
        per_token = -(p * torch.log(p.clamp_min(1e-12))).sum(-1)
        return float(per_token.mean())

    @property
    def chance_loss(self) -> float:
        return chance_loss(self.vocab_size)

    def batch(self, batch_size: int, seq_len: int) -> torch.Tensor:
        tokens = torch.empty(batch_size, seq_len, dtype=torch.long)
        tokens[:, 0] = torch.randint(self.vocab_size, (batch_size,), generator=self.generator)
        for i in range(1, seq_len):
            tokens[:, i] = torch.multinomial(self.transition[tokens[:, i - 1]], 1,
                                             generator=self.generator).squeeze(1)
        return tokens
