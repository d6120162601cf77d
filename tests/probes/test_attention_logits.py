"""The attention probe: the largest q.k / sqrt(d_head) of each attention layer, against values
computed by hand; fused (GPT-2, a `qkv` Linear) and separate (BERT, LLaMA with grouped-query
heads) projections; chunked alike; never raising into the forward pass; and through the Guard on
a GPT-2 built from its config."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from trainguard import Guard, GuardConfig
from trainguard.probes import attention_logits
from trainguard.probes.attention_logits import AttentionLogitProbe
from trainguard.sinks import Sink


class Fused(nn.Module):
    """A block with a `qkv` Linear whose output is q|k|v, as the scenario suite's."""

    num_heads = 2
    is_causal = True

    def __init__(self, width: int = 4) -> None:
        super().__init__()
        self.qkv = nn.Linear(width, 3 * width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.qkv(x)


def by_hand(q: list[list[float]], k: list[list[float]], heads: int, causal: bool) -> float:
    """max over heads h and positions i, j (j <= i when causal) of q_i.k_j / sqrt(d), in
    plain Python."""
    dim = len(q[0]) // heads
    best = -math.inf
    for h in range(heads):
        for i, qi in enumerate(q):
            for j, kj in enumerate(k):
                if causal and j > i:
                    continue
                dot = sum(qi[h * dim + c] * kj[h * dim + c] for c in range(dim))
                best = max(best, dot / math.sqrt(dim))
    return best


def test_a_fused_block_against_a_hand_computed_value() -> None:
    block = Fused()
    with torch.no_grad():  # q = x, k = 2x (per element), v = 0
        block.qkv.weight.zero_()
        block.qkv.weight[0:4].copy_(torch.eye(4))
        block.qkv.weight[4:8].copy_(2 * torch.eye(4))
    x = torch.tensor([[[1.0, 0.0, 2.0, -1.0], [0.5, 3.0, 0.0, 1.0], [-2.0, 1.0, 1.0, 0.0]],
                      [[9.0, 9.0, 9.0, 9.0]] * 3])  # the second sequence is not sampled
    probe = AttentionLogitProbe(block)
    probe.attach()
    block(x)
    seen = probe.detach()
    assert seen is not None and not probe.attached
    rows = x[0].tolist()
    expected = by_hand(rows, [[2 * v for v in r] for r in rows], heads=2, causal=True)
    # the largest is position 1, head 0 with itself: (0.5*1 + 3*6) / sqrt(2)
    assert expected == pytest.approx(18.5 / math.sqrt(2))
    assert seen[0] == [""] and seen[1].tolist() == pytest.approx([expected])


def test_a_sampling_pass_without_gradients_is_not_read() -> None:
    """Completions sampled in train mode under `no_grad` (GRPO) before the forward that trains:
    their logits are neither computed nor taken into the step's largest."""
    block = Fused()
    with torch.no_grad():  # q = x, k = 2x (per element), v = 0
        block.qkv.weight.zero_()
        block.qkv.weight[0:4].copy_(torch.eye(4))
        block.qkv.weight[4:8].copy_(2 * torch.eye(4))
    probe = AttentionLogitProbe(block)
    probe.attach()
    with torch.no_grad():
        block(torch.full((1, 3, 4), 50.0))  # sampling: huge logits, not the training batch
    x = torch.tensor([[[1.0, 0.0, 2.0, -1.0], [0.5, 3.0, 0.0, 1.0], [-2.0, 1.0, 1.0, 0.0]]])
    block(x).sum().backward()
    seen = probe.detach()
    assert seen is not None
    assert seen[1].tolist() == pytest.approx([18.5 / math.sqrt(2)])


def test_the_causal_mask_leaves_out_later_keys() -> None:
    block = Fused()
    block.is_causal = False  # type: ignore[misc]
    with torch.no_grad():
        block.qkv.weight.zero_()
        block.qkv.weight[0:4].copy_(torch.eye(4))
        block.qkv.weight[4:8].copy_(torch.eye(4))
    x = torch.tensor([[[1.0, 1.0, 0.0, 0.0], [5.0, 5.0, 0.0, 0.0]]])
    probe = AttentionLogitProbe(block)
    probe.attach()
    block(x)
    both = probe.detach()
    block.is_causal = True  # type: ignore[misc]
    probe = AttentionLogitProbe(block)
    probe.attach()
    block(x)
    causal = probe.detach()
    assert both is not None and causal is not None
    assert both[1].tolist() == pytest.approx([50 / math.sqrt(2)])  # position 1 with itself
    assert causal[1].tolist() == pytest.approx([50 / math.sqrt(2)])
    x = x.flip(1)  # now the large key comes after the small query: masked
    probe = AttentionLogitProbe(block)
    probe.attach()
    block(x)
    flipped = probe.detach()
    assert flipped is not None and flipped[1].tolist() == pytest.approx([50 / math.sqrt(2)])


def test_chunks_give_the_same_value(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    q, k = torch.randn(4, 33, 8), torch.randn(2, 33, 8)
    whole = attention_logits.max_logit(q, k, causal=True)
    monkeypatch.setattr(attention_logits, "CHUNK_ELEMENTS", 4 * 33 * 3)  # 3 rows at a time
    # the same value up to the last bits: a matrix product over fewer rows may round otherwise
    # (the BLAS kernel it takes depends on the shape and the processor)
    assert float(attention_logits.max_logit(q, k, causal=True)) == pytest.approx(float(whole),
                                                                                 rel=1e-6)
    heads = k.repeat_interleave(2, dim=0)
    mask = torch.ones(33, 33, dtype=torch.bool).triu(1)
    expected = (q @ heads.transpose(1, 2) / math.sqrt(8)).masked_fill(mask, -math.inf).amax()
    assert whole == pytest.approx(float(expected))


def test_a_short_sequence_masked_by_the_kept_bias_agrees_with_a_long_one_masked_per_chunk(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Up to 512 positions the causal mask is kept and added in the product; past that it is
    built chunk by chunk. Both give the masked maximum; the future keys here hold the largest
    logits, so a mask left out would show."""
    torch.manual_seed(0)
    q, k = torch.randn(2, 40, 8), torch.randn(2, 40, 8)
    k[:, 30:] *= 10  # late keys: their products with early queries are the largest, masked
    mask = torch.ones(40, 40, dtype=torch.bool).triu(1)
    expected = float((q @ k.transpose(1, 2) / math.sqrt(8)).masked_fill(mask, -math.inf).amax())
    unmasked = float((q @ k.transpose(1, 2) / math.sqrt(8)).amax())
    assert unmasked > expected
    assert attention_logits._causal_bias(40, q.device) is not None
    kept = float(attention_logits.max_logit(q, k, causal=True))
    monkeypatch.setattr(attention_logits, "CACHED_BIAS_ELEMENTS", 40 * 40 - 1)
    assert attention_logits._causal_bias(40, q.device) is None
    per_chunk = float(attention_logits.max_logit(q, k, causal=True))
    assert kept == pytest.approx(expected, rel=1e-6)
    assert per_chunk == pytest.approx(expected, rel=1e-6)


def _separate(model: nn.Module, attention: str, q_name: str, k_name: str, heads: int,
              kv_heads: int, causal: bool) -> None:
    seen: dict[str, torch.Tensor] = {}
    module = model.get_submodule(attention)
    getattr(module, q_name).register_forward_hook(lambda m, i, o: seen.setdefault("q", o))
    getattr(module, k_name).register_forward_hook(lambda m, i, o: seen.setdefault("k", o))
    probe = AttentionLogitProbe(model)
    probe.attach()
    model(torch.randint(100, (2, 7)))
    out = probe.detach()
    assert out is not None
    names, values = out
    q, k = seen["q"][0].detach(), seen["k"][0].detach()
    group = heads // kv_heads  # grouped-query attention: each key head serves `group` q heads
    k = k.reshape(7, kv_heads, -1).repeat_interleave(group, dim=1).reshape(7, -1)
    assert values[names.index(attention)].item() == pytest.approx(
        by_hand(q.tolist(), k.tolist(), heads=heads, causal=causal), rel=1e-5)


def test_separate_projections_of_bert_and_llama_with_grouped_heads() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    bert = transformers.BertModel(transformers.BertConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64,
        vocab_size=100))
    _separate(bert.train(), "encoder.layer.1.attention.self", "query", "key", 4, 4, False)
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=64, vocab_size=100))
    _separate(llama.train(), "model.layers.0.self_attn", "q_proj", "k_proj", 4, 2, True)


def tiny_gpt2() -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=16, bos_token_id=0,
        eos_token_id=0))


def test_gpt2_matches_its_own_c_attn_split() -> None:
    model = tiny_gpt2().train()
    seen: list[torch.Tensor] = []
    model.transformer.h[0].attn.c_attn.register_forward_hook(lambda m, i, o: seen.append(o))
    probe = AttentionLogitProbe(model)
    probe.attach()
    model(torch.randint(100, (2, 6)))
    out = probe.detach()
    assert out is not None and out[0] == ["transformer.h.0.attn", "transformer.h.1.attn"]
    q, k, _ = seen[0][0].detach().split(64, dim=-1)
    assert out[1][0].item() == pytest.approx(by_hand(q.tolist(), k.tolist(), 4, True), rel=1e-5)


def test_a_broken_layer_is_skipped_without_raising() -> None:
    block = Fused()
    block.num_heads = 3  # type: ignore[misc]  # 4 does not split into 3 heads: found, not measured
    probe = AttentionLogitProbe(block)
    assert probe.layers == []
    block = Fused()
    probe = AttentionLogitProbe(block)
    probe.attach()
    block(torch.randn(2, 4))  # not (batch, positions, width): left alone
    assert probe.detach() is None and probe.failures == 0


class Signals(Sink):
    def __init__(self) -> None:
        self.seen: list[dict[str, float]] = []

    def on_step(self, report) -> None:  # type: ignore[no-untyped-def]
        self.seen.append(dict(report.signals.attention_logits))


def test_gpt2_through_the_guard_every_step_and_at_a_cadence() -> None:
    # at a cadence: every step for the baseline's first 2 measurements, then every 3rd (the
    # logits of a tiny GPT-2 sit far below the bound)
    for every, expected in ((1, [True] * 6), (3, [True, True, False, True, False, False])):
        model = tiny_gpt2()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        sink = Signals()
        config = GuardConfig(sinks={"console": False}, probes={"sample_every": 1000})
        config.detectors.attention_logits.every = every
        config.detectors.attention_logits.warmup = 2
        guard = Guard(model, optimizer, config=config, sinks=[sink])
        first_hooks: list[int] = []
        for i in range(6):
            tokens = torch.randint(100, (2, 8))
            loss = model(tokens, labels=tokens).loss
            loss.backward()
            guard.step(loss)
            optimizer.zero_grad()
            if i == 0:
                first_hooks = list(model.transformer.h[0].attn.c_attn._forward_hooks)
        # every step: the same hooks stay between steps (no re-registering), and go at the close
        if every == 1:
            hooks = list(model.transformer.h[0].attn.c_attn._forward_hooks)
            assert first_hooks and hooks == first_hooks
        guard.close()
        assert not any(m._forward_hooks for m in model.modules())
        assert [bool(s) for s in sink.seen] == expected
        measured = [s for s in sink.seen if s]
        assert all(list(s) == ["transformer.h.0.attn", "transformer.h.1.attn"] for s in measured)
        assert all(0 < v < 50 and math.isfinite(v) for s in measured for v in s.values())
