"""A small causal transformer language model in plain PyTorch (no downloads, no extra packages)."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class TinyCausalLM(nn.Module):
    def __init__(self, vocab_size: int = 64, d_model: int = 64, n_layer: int = 2, n_head: int = 4,
                 max_len: int = 64, dropout: float = 0.0) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.tok = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        layer = nn.TransformerEncoderLayer(d_model, n_head, 4 * d_model, dropout=dropout,
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, n_layer, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        n = input_ids.shape[1]
        positions = torch.arange(n, device=input_ids.device)
        h = self.tok(input_ids) + self.pos(positions)
        mask = nn.Transformer.generate_square_subsequent_mask(n, device=input_ids.device)
        h = self.blocks(h, mask=mask, is_causal=True)
        return self.head(self.norm(h))

    def loss(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Next-token cross-entropy."""
        logits = self(input_ids[:, :-1])
        return F.cross_entropy(logits.reshape(-1, self.vocab_size), input_ids[:, 1:].reshape(-1))
