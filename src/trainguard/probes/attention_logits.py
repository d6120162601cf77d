"""The largest pre-softmax attention logit of each attention layer, from forward hooks.

Metric key (per attention layer, in the order the layers ran; registered in
`trainguard.registry`, local to each rank): `attn_logit_max`, the maximum over heads and
(query, key) positions of q.k / sqrt(d_head) for the first `SAMPLE_SEQUENCES` sequence(s) of
the batch, causal positions only for a causal layer.

Why: attention logits that keep growing (no QK-norm, an LR too high) make the softmax one-hot
(attention entropy collapse); the loss holds for a while, then spikes (Dehghani et al. 2023,
arXiv 2302.05442; Wortsman et al. 2023, arXiv 2304.13013). The growth shows in this value long
before the loss moves.

Which modules: Hugging Face GPT-2 attention (`c_attn`, its fused q|k|v output), modules with
separate `q_proj`/`k_proj` (LLaMA, Mistral, OPT, ...) or `query`/`key` (BERT, RoBERTa) Linear
layers, and any module with a `qkv` Linear whose output is q|k|v (a hand-written block) that says
its `num_heads`. A module with QK-norm children (`q_norm`/`k_norm`, `q_layernorm`/`k_layernorm`:
Qwen3, OLMo2, Gemma 3) is read from their outputs, the q and k the softmax sees, laid out
(batch, positions, heads, d_head) or (batch, positions, heads x d_head). Otherwise the logits
are taken from the projections' outputs, so for a RoPE model before the rotary embedding (which
rotates pairs of dimensions by the position: the value read is that of the unrotated vectors).
An attention mask (padding) is not applied. Grouped-query attention repeats the key heads.

Cost: hooks are attached only on the steps the probe runs (`AttentionLogitTracker.due`: every
`DetectorConfig.attention_logits.every` steps, 4 by default, while the logits are far from
their bounds; every step while a layer's baseline is young or a layer is near them). The
arithmetic measured on the GPT-2 of `benchmarks/overhead.py` was 0.1-0.3% of its step on a CPU
at every step (`benchmarks/attention_probe_cost.py`); on the small host-bound steps of a tiny
GRPO policy it was the largest part of trainguard's time, hence the cadence.
For one sequence of T tokens and H heads the logits are H x T x T, 1/batch of what an eager
attention layer materialises, computed in chunks of query rows of at most `CHUNK_ELEMENTS`
values, so a layer under SDPA or flash attention (which materialises none) gets a bounded extra
buffer. Nothing is read on the host: the values ride the step's one transfer.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from trainguard.probes.activations import first_float_tensor, training_forward

log = logging.getLogger("trainguard")

SAMPLE_SEQUENCES = 1
"""Sequences of the batch whose logits are measured: a bounded share of the layer's own work."""
CHUNK_ELEMENTS = 1 << 22
"""Most logits held at once per layer (16 MiB in float32), whatever the sequence length."""
_HEAD_ATTRS = ("num_heads", "num_attention_heads", "n_head", "n_heads")
_HEAD_DIM_ATTRS = ("head_dim", "attention_head_size", "head_size")
_QK_NORMS = (("q_norm", "k_norm"), ("q_layernorm", "k_layernorm"))


def max_logit(q: torch.Tensor, k: torch.Tensor, causal: bool) -> torch.Tensor:
    """max of q.k / sqrt(d) over heads and positions; q is (H, Tq, d), k (Hk, Tk, d) with
    Hk dividing H (grouped-query attention). Float32, on q's device; NaN and inf show through."""
    heads, length, dim = q.shape
    if k.shape[0] != heads:
        k = k.repeat_interleave(heads // k.shape[0], dim=0)
    q, k = q.float() / math.sqrt(dim), k.float()
    keys = k.shape[1]
    causal = causal and keys == length
    rows = max(1, CHUNK_ELEMENTS // max(1, heads * keys))
    best: torch.Tensor | None = None
    bias = _causal_bias(length, q.device) if causal else None
    for start in range(0, length, rows):
        if bias is not None:  # the mask added in the matmul itself: one op, no mask built
            part = bias[start:start + rows].expand(heads, -1, -1)
            logits = torch.baddbmm(part, q[:, start:start + rows], k.transpose(1, 2))
        else:
            logits = q[:, start:start + rows] @ k.transpose(1, 2)  # (H, rows, Tk)
            if causal:
                query = torch.arange(start, start + logits.shape[1], device=q.device)
                future = torch.arange(keys, device=q.device)[None, :] > query[:, None]
                logits = logits.masked_fill(future, -math.inf)
        top = logits.amax()
        best = top if best is None else torch.maximum(best, top)
    assert best is not None
    return best


CACHED_BIAS_ELEMENTS = 1 << 18
"""The largest causal mask kept from step to step (1 MiB in float32: sequences up to 512): past
it the mask costs little beside the logits it masks, and is built per chunk."""


@functools.lru_cache(maxsize=8)
def _causal_cached(length: int, device: torch.device) -> torch.Tensor:
    return torch.full((length, length), -math.inf, device=device).triu(1)


def _causal_bias(length: int, device: torch.device) -> torch.Tensor | None:
    """0 on and below the diagonal, -inf above it, for a short sequence; None for a long one."""
    if length * length > CACHED_BIAS_ELEMENTS:
        return None
    return _causal_cached(length, device)


def _split_heads(t: torch.Tensor, head_dim: int) -> torch.Tensor:
    """(B, T, H * d) or (B, T, H, d) -> (H, T, d) of the sampled sequences, batched as extra
    heads."""
    t = t[:SAMPLE_SEQUENCES].detach()
    sample, length = t.shape[0], t.shape[1]
    heads = t.shape[-1] // head_dim if t.dim() == 3 else t.shape[2]
    return (t.reshape(sample, length, heads, head_dim).permute(0, 2, 1, 3)
            .reshape(sample * heads, length, head_dim))


def _attr(module: nn.Module, names: tuple[str, ...]) -> int | None:
    config = getattr(module, "config", None)
    for owner in (module, config):
        for name in names:
            value = getattr(owner, name, None) if owner is not None else None
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def _head_dim(module: nn.Module, width: int) -> int | None:
    """d_head: said by the module, or its width over its head count."""
    dim = _attr(module, _HEAD_DIM_ATTRS)
    if dim is not None:
        return dim
    heads = _attr(module, _HEAD_ATTRS)
    return width // heads if heads and width % heads == 0 else None


def _is_linear(module: Any) -> bool:
    return isinstance(module, nn.Module) and type(module).__name__ in ("Linear", "Conv1D")


class _Layer:
    """One attention module: which child gives q and k, and how they are split."""

    def __init__(self, name: str, module: nn.Module, fused: str | None,
                 pair: tuple[str, str] | None, head_dim: int) -> None:
        self.name, self.module, self.fused, self.pair = name, module, fused, pair
        self.head_dim = head_dim
        self.causal = bool(getattr(module, "is_causal", False))
        self.q: torch.Tensor | None = None
        self.k: torch.Tensor | None = None


def attention_layers(model: nn.Module) -> list[_Layer]:
    """The attention modules of `model` the probe can read (see the module docstring)."""
    found: list[_Layer] = []
    for name, module in model.named_modules():
        if getattr(module, "is_cross_attention", False):
            continue  # q and k of different sequences: not what grows in self-attention
        children = dict(module.named_children())
        norms = next((pair for pair in _QK_NORMS if isinstance(children.get(pair[0]), nn.Module)
                      and isinstance(children.get(pair[1]), nn.Module)), None)
        if _is_linear(children.get("c_attn")) and "q_attn" not in children:  # GPT-2
            width = int(getattr(module, "embed_dim", 0) or 0)
            dim = _head_dim(module, width) if width else None
            if dim:
                found.append(_Layer(name, module, "c_attn", None, dim))
            continue
        if _is_linear(children.get("qkv")) and _attr(module, _HEAD_ATTRS):
            width = getattr(children["qkv"], "out_features", 0) // 3
            dim = _head_dim(module, width) if width else None
            if dim:
                found.append(_Layer(name, module, None, norms, dim) if norms
                             else _Layer(name, module, "qkv", None, dim))
            continue
        for q_name, k_name in (("q_proj", "k_proj"), ("query", "key")):
            if _is_linear(children.get(q_name)) and _is_linear(children.get(k_name)):
                width = int(getattr(children[q_name], "out_features", 0) or 0)
                dim = _head_dim(module, width) if width else None
                if dim:
                    found.append(_Layer(name, module, None, norms or (q_name, k_name), dim))
                break
    return found


class AttentionLogitProbe:
    """Hooks the q/k projections of every attention layer while attached."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._layers: list[_Layer] | None = None
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._names: list[str] = []
        self._values: list[torch.Tensor] = []
        self.failures = 0

    @property
    def attached(self) -> bool:
        return bool(self._handles)

    @property
    def layers(self) -> list[_Layer]:
        if self._layers is None:  # found once: the model's modules do not change in a run
            try:
                self._layers = attention_layers(self.model)
            except Exception as exc:  # an odd model: no attention signal, training goes on
                log.debug("trainguard: no attention layers found (%s)", exc)
                self._layers = []
        return self._layers

    def attach(self) -> None:
        """Hook the layers for the next forward pass. Already attached (kept from the step
        before): only what the hooks saw since (a replay's forward) is forgotten."""
        self._names, self._values = [], []
        for layer in self.layers:
            layer.q = layer.k = None
        if self._handles:
            return
        try:
            for layer in self.layers:
                children = dict(layer.module.named_children())
                if layer.fused is not None:
                    self._handles.append(children[layer.fused].register_forward_hook(
                        self._guarded(layer, self._fused)))
                elif layer.pair is not None:
                    for role, child in zip(("q", "k"), layer.pair, strict=True):
                        self._handles.append(children[child].register_forward_hook(
                            self._guarded(layer, self._separate(role))))
        except Exception as exc:  # a module changed under us: no attention signal this step
            self.failures += 1
            log.debug("trainguard: attention probe not attached (%s)", exc)

    def _guarded(self, layer: _Layer,
                 measure: Callable[[_Layer, torch.Tensor], None]) -> Callable[..., None]:
        def hook(module: nn.Module, inputs: Any, output: Any) -> None:
            if not training_forward(layer.module):
                return  # an evaluation or a sampling pass says nothing of training
            try:
                tensor = first_float_tensor(output)
                if tensor is None or tensor.dim() not in (3, 4) or tensor.numel() == 0:
                    return
                with torch.no_grad():
                    measure(layer, tensor)
            except Exception as exc:  # never break the user's forward pass
                self.failures += 1
                layer.q = layer.k = None
                log.debug("trainguard: attention probe skipped %s (%s)", layer.name, exc)
        return hook

    def _fused(self, layer: _Layer, out: torch.Tensor) -> None:
        if out.dim() != 3:
            return
        width = out.shape[-1] // 3
        q, k = out[..., :width], out[..., width:2 * width]
        self._record(layer, _split_heads(q, layer.head_dim), _split_heads(k, layer.head_dim))

    def _separate(self, role: str) -> Callable[[_Layer, torch.Tensor], None]:
        def measure(layer: _Layer, out: torch.Tensor) -> None:
            heads = _split_heads(out, layer.head_dim)
            if role == "q":
                layer.q = heads
            else:
                layer.k = heads
            if layer.q is not None and layer.k is not None:  # whichever ran second
                q, k, layer.q, layer.k = layer.q, layer.k, None, None
                self._record(layer, q, k)
        return measure

    def _record(self, layer: _Layer, q: torch.Tensor, k: torch.Tensor) -> None:
        if q.shape[-1] != k.shape[-1] or k.shape[0] == 0 or q.shape[0] % k.shape[0]:
            return
        value = max_logit(q, k, layer.causal)
        if layer.name in self._names:  # a second forward in the step (accumulation): the max
            i = self._names.index(layer.name)
            self._values[i] = torch.maximum(self._values[i], value)
        else:
            self._names.append(layer.name)
            self._values.append(value)

    def detach(self) -> tuple[list[str], torch.Tensor] | None:
        """Remove the hooks; return the layer names and their largest logits (float32, one
        device tensor), or None when no layer was measured."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        return self.collect()

    def collect(self) -> tuple[list[str], torch.Tensor] | None:
        """What `detach` returns, the hooks left in place: at a cadence of every step they stay
        (hooks added and removed every step would make a compiled model recompile)."""
        for layer in self.layers:
            layer.q = layer.k = None
        if not self._values:
            return None
        device = self._values[0].device
        values = torch.stack([v.to(device) for v in self._values])
        names, self._names, self._values = self._names, [], []
        return names, values
