"""Batch inspection: what is in a batch, and what is wrong with it.

`describe_batch` summarises every tensor field (shape, dtype, range, mean/std, non-finite counts)
with one transfer; `inspect_batch` turns that summary into findings: non-finite inputs, images
outside the expected normalisation range, token ids outside the embedding table, attention masks
that are not 0/1 or empty, labels that are all ignored (-100: the loss's mean is 0/0), labels
left on padding (`labels` not -100 where `attention_mask` is 0: the loss trains the model to
predict padding), a batch
smaller than configured (silent truncation), and, given the running statistics of earlier batches
(`BatchHistory`), fields far outside their usual range, and images whose pixels were scrambled by
a `view`/`reshape` from height-width-channel order instead of a `permute`. Meant for the first
batch and for anomalous steps, not for every step.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from trainguard.chance_level import chance_loss
from trainguard.diagnose.loss_bound import beyond
from trainguard.finding import Finding
from trainguard.transfer import to_host

TOKEN_FIELDS = ("input_ids", "tokens", "labels", "decoder_input_ids", "token_type_ids")
IGNORE_INDEX = -100
"""The label cross-entropy (PyTorch's and the Hugging Face models') leaves out of its mean."""
MASK_FIELDS = ("attention_mask",)
PADDED_LABELS = "labels_on_padding"
"""A field derived on the device when a batch holds `labels` and an `attention_mask` of the same
shape: True where a position is padding (mask 0) and its label is not `IGNORE_INDEX`, past the
first such position of each sequence (a pad token that doubles as the end-of-text token may
keep its first label)."""
PADDED_SHARE = 0.5
"""Labels on at least this share of the padding positions past each sequence's first are a
collator that did not mask them."""
OUTLIER_RATIO = 50.0
"""A field whose max |x| is this many times its running typical value is an outlier batch."""
PIXEL_MAX_WITH_HISTORY = 127.0
"""Once a field has a history of earlier batches, only a batch reaching the upper half of the
8-bit range (max above this) looks like unnormalised 0-255 pixels; one merely far above its usual
size (raw values 100x the normal [0, 1]) is the outlier check's matter."""
SMOOTH = 0.5
"""Roughness (neighbour differences against the image's own variance, 1 for white noise) under
which an image's neighbouring pixels are correlated, as a picture's are."""
CHECKSUM_VALUES = 4096
"""Values a field's order-sensitive checksum reads at most (evenly strided)."""
ROUGHNESS_IMAGES, ROUGHNESS_ROWS = 2, 64
"""The roughness is measured on the first images' first rows only: the cost stays that of a
small image whatever the batch."""
SCRAMBLE_RATIO = 2.0
"""An image batch this many times rougher than the same memory read as height-width-channel is
a channel-last image reshaped, not permuted, to channel-first: its neighbours are no longer the
picture's neighbours. Noise is as rough either way, and a right image rougher reread."""


@dataclass(slots=True)
class FieldStats:
    name: str
    shape: tuple[int, ...]
    dtype: str
    numel: int
    min: float
    max: float
    mean: float
    std: float
    maxabs: float
    nonfinite: int
    nan: int
    roughness: float = math.nan
    """Of an image field only: how little its neighbouring pixels agree (`_roughness`)."""
    roughness_hwc: float = math.nan
    """The same, its memory read as height-width-channel and permuted to channel-first."""
    checksum: float = math.nan
    """The sum of at most `CHECKSUM_VALUES` of its values (evenly strided), each times its
    place: what tells two batches of the same values in another order apart
    (`batch_repeat`)."""

    @property
    def is_float(self) -> bool:
        return "float" in self.dtype or "bfloat" in self.dtype


PEEK = 8
"""A list longer than this whose first items are neither tensors nor containers is taken for
data without tensors (strings, token id lists) and not walked."""


def _may_hold_tensors(value: Any) -> bool:
    return isinstance(value, (torch.Tensor, Mapping, list, tuple)) or (
        hasattr(value, "items") and callable(value.items))


def named_tensors(batch: Any, prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    """Every tensor in a batch (a tensor, a mapping, a list or tuple, nested) with its place in
    it (`input_ids`, `[0]`, `inputs.pixel_values`): the one walk over a batch's tensors."""
    if isinstance(batch, torch.Tensor):
        return [(prefix or "input", batch)]
    if isinstance(batch, Mapping) or (hasattr(batch, "items") and callable(batch.items)):
        out = []
        for key, value in batch.items():
            out.extend(named_tensors(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(batch, (list, tuple)):
        if len(batch) > PEEK and not any(_may_hold_tensors(v) for v in batch[:PEEK]):
            return []  # raw text or ids beside the tensors: walked every step, it would cost
        out = []
        for i, value in enumerate(batch):
            out.extend(named_tensors(value, f"{prefix}[{i}]" if prefix else f"[{i}]"))
        return out
    return []


def batch_size_of(batch: Any) -> int | None:
    """Leading dimension of the batch's first tensor (host metadata only: no transfer)."""
    for _, tensor in named_tensors(batch):
        if tensor.dim() > 0:
            return int(tensor.shape[0])
    return None


def batch_elements_of(batch: Any) -> int | None:
    """Elements of the batch's largest tensor: samples times positions (a language model's
    tokens, padding included), what a batch's gradient noise falls with. Host metadata only: no
    transfer. None for a batch without a tensor of at least one dimension."""
    sizes = [tensor.numel() for _, tensor in named_tensors(batch) if tensor.dim() > 0]
    return max(sizes) if sizes else None


class BatchStatsOnDevice:
    """The statistics of a batch's fields, computed on the device and not yet transferred, so
    that they can travel with a step's single transfer."""

    WIDTH = 10

    def __init__(self, batch: Any, labels_follow_mask: bool = True) -> None:
        """`labels_follow_mask`: the batch's `labels` and `attention_mask` are of one sequence
        (not an encoder-decoder's target and source), so its labels on padding are read."""
        self.fields = [(n, t) for n, t in named_tensors(batch) if t.numel() > 0]
        if labels_follow_mask:
            self.fields += _labels_on_padding(self.fields)
        self.tensor = _field_stats(self.fields) if self.fields else None

    def read(self, host: Any) -> list[FieldStats]:
        rows = host.reshape(len(self.fields), self.WIDTH)
        return [FieldStats(name=name, shape=tuple(t.shape),
                           dtype=str(t.dtype).replace("torch.", ""), numel=t.numel(),
                           min=float(r[0]), max=float(r[1]), mean=float(r[2]), std=float(r[3]),
                           maxabs=float(r[4]), nonfinite=int(r[5]), nan=int(r[6]),
                           roughness=float(r[7]), roughness_hwc=float(r[8]),
                           checksum=float(r[9]))
                for (name, t), r in zip(self.fields, rows, strict=True)]


def labels_follow_mask(model: nn.Module | None) -> bool:
    """Whether a batch's `labels` and `attention_mask` are of one sequence: not under an
    encoder-decoder (the config of the first module that has one says so, a wrapper's inner
    model's included), whose mask is the source's and labels the target's."""
    for module in model.modules() if model is not None else ():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "is_encoder_decoder"):
            return not config.is_encoder_decoder
    return True


def _labels_on_padding(fields: list[tuple[str, torch.Tensor]]
                       ) -> list[tuple[str, torch.Tensor]]:
    """`PADDED_LABELS` for each `labels` field beside an `attention_mask` of its shape."""
    tensors = dict(fields)
    derived = []
    for name, labels in fields:
        prefix = name[:-len("labels")]
        mask = tensors.get(prefix + "attention_mask")
        if (name.rsplit(".", 1)[-1] == "labels" and mask is not None and labels.dim() > 0
                and mask.shape == labels.shape and not labels.is_floating_point()):
            try:  # (a loss moves the labels to the logits' device itself: they may differ)
                with torch.no_grad():
                    padded = (labels.detach() != IGNORE_INDEX) & (
                        mask.detach().to(labels.device) == 0)
                    derived.append((prefix + PADDED_LABELS,
                                    padded & (padded.cumsum(-1) > 1)))
            except RuntimeError:
                continue
    return derived


def describe_batch(batch: Any, labels_follow_mask: bool = True) -> list[FieldStats]:
    """Statistics of every tensor in a batch (dict, tuple, list or tensor), one transfer."""
    on_device = BatchStatsOnDevice(batch, labels_follow_mask)
    if on_device.tensor is None:
        return []
    return on_device.read(to_host(on_device.tensor))


def _field_stats(fields: list[tuple[str, torch.Tensor]]) -> torch.Tensor:
    device = fields[0][1].device
    rows = []
    with torch.no_grad():
        for _, tensor in fields:
            t = tensor.detach()
            values = t.double() if not t.is_floating_point() else t.float()
            finite = torch.isfinite(values)
            clean = torch.where(finite, values, torch.zeros((), dtype=values.dtype,
                                                             device=values.device))
            count = finite.sum().clamp_min(1)
            mean = clean.sum() / count
            var = (torch.where(finite, (values - mean) ** 2, 0.0).sum() / count)
            big = torch.finfo(values.dtype).max
            nan = torch.full((), math.nan, dtype=values.dtype, device=values.device)
            if _image_shaped(t):
                # a few images' top rows: a reshape scrambles every image alike, everywhere
                sample = clean[:ROUGHNESS_IMAGES]
                b, c, h, w = sample.shape
                top = min(h, ROUGHNESS_ROWS)
                rough = _roughness(sample[:, :, :top])
                rough_hwc = _roughness(sample.reshape(b, h, w, c).permute(0, 3, 1, 2)[:, :, :top])
            else:
                rough, rough_hwc = nan, nan
            flat = clean.reshape(-1)
            if flat.numel() > CHECKSUM_VALUES:
                flat = flat[::-(-flat.numel() // CHECKSUM_VALUES)]
            places = torch.arange(1, flat.numel() + 1, dtype=flat.dtype, device=flat.device)
            rows.append(torch.stack([
                torch.where(finite, values, big).min(), torch.where(finite, values, -big).max(),
                mean, var.sqrt(), clean.abs().max(), (~finite).sum(), torch.isnan(values).sum(),
                rough.to(values.dtype), rough_hwc.to(values.dtype), (flat * places).sum(),
            ]).double().to(device))
    return torch.stack(rows).reshape(-1)


def _image_shaped(t: torch.Tensor) -> bool:
    """A float batch of colour images, channel-first (N, 3 or 4, H, W), at least 2x2."""
    return (t.is_floating_point() and t.dim() == 4 and t.shape[1] in (3, 4)
            and t.shape[2] >= 2 and t.shape[3] >= 2)


def _roughness(images: torch.Tensor) -> torch.Tensor:
    """Mean squared difference of neighbouring pixels (down and across) over twice each image
    channel's variance: near 0 for a picture, whose neighbours agree, near 1 for noise."""
    variance = images.var(dim=(2, 3), keepdim=True).clamp_min(1e-12)
    down = ((images[:, :, 1:] - images[:, :, :-1]) ** 2 / variance).mean()
    across = ((images[:, :, :, 1:] - images[:, :, :, :-1]) ** 2 / variance).mean()
    return (down + across) / 4


def embedding_size(model: nn.Module | None) -> int | None:
    """Rows of the model's input embedding table, when it has one."""
    if model is None:
        return None
    getter = getattr(model, "get_input_embeddings", None)
    if callable(getter):
        try:
            embedding = getter()
            if isinstance(embedding, nn.Embedding):
                return embedding.num_embeddings
        except (NotImplementedError, AttributeError):
            pass
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            return module.num_embeddings
    return None


@dataclass
class BatchHistory:
    """Running typical max |x| per float field, to recognise an outlier batch."""

    typical: dict[str, float] = field(default_factory=dict)
    seen: dict[str, int] = field(default_factory=dict)

    def update(self, stats: list[FieldStats]) -> None:
        for s in stats:
            if not s.is_float or not math.isfinite(s.maxabs) or s.nonfinite:
                continue
            n = self.seen.get(s.name, 0)
            old = self.typical.get(s.name, s.maxabs)
            # geometric running mean: robust to the scale of the field
            value = math.exp((math.log(max(old, 1e-30)) * n + math.log(max(s.maxabs, 1e-30)))
                             / (n + 1))
            self.typical[s.name] = value
            self.seen[s.name] = n + 1


def _looks_like_images(s: FieldStats) -> bool:
    return s.is_float and len(s.shape) == 4 and s.shape[1] in (1, 3, 4)


def inspect_batch(batch: Any, *, model: nn.Module | None = None,
                  expected_batch_size: int | None = None,
                  history: BatchHistory | None = None,
                  stats: list[FieldStats] | None = None) -> list[Finding]:
    """Findings about one batch; `stats` may be passed when already described."""
    stats = describe_batch(batch, labels_follow_mask(model)) if stats is None else stats
    findings: list[Finding] = []
    vocab = embedding_size(model)
    for s in stats:
        base = s.name.rsplit(".", 1)[-1]
        findings += _value_findings(s, history)
        findings += _id_findings(s, base, vocab)
        findings += _label_mask_findings(s, base)
        findings += _outlier_findings(s, history)
    findings += _padding_label_findings(stats)
    findings += _size_findings(stats, expected_batch_size)
    return findings


def _value_findings(s: FieldStats, history: BatchHistory | None) -> list[Finding]:
    """A field's non-finite values, images left in 0-255, and images with scrambled pixels."""
    findings: list[Finding] = []
    if s.nonfinite:
        findings.append(Finding(
            "batch_nonfinite", "error",
            f"field '{s.name}' holds {s.nonfinite} non-finite value(s) ({s.nan} NaN) of "
            f"{s.numel}.", "find the sample (a corrupt file, a division by zero in "
            "preprocessing) and clean or drop it.", cause="nonfinite_input",
            evidence={"field": s.name, "nonfinite": s.nonfinite, "nan": s.nan}))
    pixel_floor = (PIXEL_MAX_WITH_HISTORY if history is not None
                   and s.name in history.typical else 2.0)
    if _looks_like_images(s) and s.max > pixel_floor and s.max <= 255.0 and s.min >= 0:
        findings.append(Finding(
            "batch_image_range", "warning",
            f"field '{s.name}' looks like images with values in [{s.min:.3g}, {s.max:.3g}]: "
            "unnormalised 0-255 pixels where models expect [0, 1] or [-1, 1].",
            "divide by 255 (and normalise with the pre-training mean/std).",
            cause="input_scale", evidence={"field": s.name, "min": s.min, "max": s.max}))
    if (s.roughness_hwc <= SMOOTH and s.roughness >= SCRAMBLE_RATIO * s.roughness_hwc
            and s.roughness > SMOOTH):
        findings.append(Finding(
            "batch_channel_order", "warning",
            f"field '{s.name}' looks like images whose pixels were scrambled: neighbouring "
            f"values agree little (roughness {s.roughness:.2f}, 1 is noise), while the same "
            f"memory read as height x width x channel is a picture ({s.roughness_hwc:.2f}): "
            "channel-last images reshaped to channel-first instead of permuted.",
            "turn (H, W, C) images into (C, H, W) with `.permute(2, 0, 1)` (or "
            "`torchvision.transforms.ToTensor()`), not `.view`/`.reshape`.",
            cause="input_scale", evidence={"field": s.name, "roughness": s.roughness,
                                           "roughness_hwc": s.roughness_hwc}))
    return findings


def _id_findings(s: FieldStats, base: str, vocab: int | None) -> list[Finding]:
    """Token ids outside the model's embedding table."""
    findings: list[Finding] = []
    # a bare integer tensor fed to a model with an embedding table is token ids too
    token_field = base in TOKEN_FIELDS or s.name == "input"
    if token_field and not s.is_float and vocab is not None:
        limit = vocab
        bad_high = s.max >= limit
        bad_low = s.min < 0 and base != "labels"  # labels use -100 for ignored positions
        if bad_high or bad_low:
            findings.append(Finding(
                "batch_token_ids", "error",
                f"field '{s.name}' holds ids from {s.min:.0f} to {s.max:.0f}, outside the "
                f"embedding table of {vocab} rows: the data were tokenised with another "
                "vocabulary.", "use the tokenizer the model was trained with; resize the "
                "embeddings only if tokens were really added.", cause="tokenizer_mismatch",
                evidence={"field": s.name, "min": s.min, "max": s.max, "vocab": vocab}))
    return findings


def _label_mask_findings(s: FieldStats, base: str) -> list[Finding]:
    """Labels that are all ignored, attention masks outside 0/1 or masking everything."""
    findings: list[Finding] = []
    # judged by the values, not the name: labels travel as `labels`, `y`, `target` or the
    # second element of an (x, y) tuple, and no input or target field holds nothing but the
    # loss's ignore index
    if not s.is_float and s.dtype != "bool" and s.numel and s.min == s.max == IGNORE_INDEX:
        findings.append(Finding(
            "batch_labels", "error",
            f"every one of the {s.numel} labels in '{s.name}' is {IGNORE_INDEX} (ignored): "
            "the loss has nothing to average, and a mean over nothing is NaN.",
            "check the label masking (a prompt mask or a truncation that left no answer "
            "token); drop batches without a single target.", cause="empty_loss",
            evidence={"field": s.name, "labels": s.numel}))
    if base in MASK_FIELDS:
        if s.min < 0 or s.max > 1:
            findings.append(Finding(
                "batch_attention_mask", "warning",
                f"'{s.name}' has values outside 0/1 ([{s.min:g}, {s.max:g}]).",
                "build the mask from the tokenizer (1 = token, 0 = padding).",
                evidence={"field": s.name}))
        elif s.max == 0:
            findings.append(Finding(
                "batch_attention_mask", "error",
                f"'{s.name}' masks every position: the batch has no tokens to attend to.",
                "check padding and truncation.", evidence={"field": s.name}))
    return findings


def _padding_label_findings(stats: list[FieldStats]) -> list[Finding]:
    """Labels on the padding positions: a collator (or `labels = input_ids.clone()`) that did
    not set them to `IGNORE_INDEX`, so the loss trains the model to predict padding."""
    named = {s.name: s for s in stats}
    findings: list[Finding] = []
    for s in stats:
        if s.name.rsplit(".", 1)[-1] != PADDED_LABELS or not s.shape:
            continue
        prefix = s.name[:-len(PADDED_LABELS)]
        mask = named.get(prefix + "attention_mask")
        if mask is None or mask.nonfinite or mask.min < 0 or mask.max > 1:  # not 0/1: told apart
            continue
        labelled = round(s.mean * s.numel)  # past each sequence's first
        sequences = s.numel // s.shape[-1]
        padding = round((1.0 - mask.mean) * mask.numel)
        if labelled == 0 or labelled < PADDED_SHARE * (padding - sequences):
            continue
        labels = prefix + "labels"
        findings.append(Finding(
            "batch_padding_labels", "warning",
            f"{labelled} of the {padding} padding positions of the batch (attention_mask 0), "
            f"past the first of each sequence, have a label in '{labels}' that is not "
            f"{IGNORE_INDEX}: the loss trains the model "
            "to predict the padding, which is easy, so the loss falls faster than the model "
            "learns the text, and the model learns to emit padding.",
            f"set the labels of padding to {IGNORE_INDEX} (labels[attention_mask == 0] = "
            f"{IGNORE_INDEX}); DataCollatorForLanguageModeling(tokenizer, mlm=False), "
            "DataCollatorForSeq2Seq and DataCollatorForTokenClassification do it.",
            cause="padding_labels",
            evidence={"field": labels, "labelled_padding": labelled, "padding": padding}))
    return findings


def _outlier_findings(s: FieldStats, history: BatchHistory | None) -> list[Finding]:
    """A float field far beyond its typical magnitude in earlier batches."""
    findings: list[Finding] = []
    if history is not None and s.is_float and not s.nonfinite:
        typical = history.typical.get(s.name)
        if (typical and history.seen.get(s.name, 0) >= 2
                and s.maxabs > OUTLIER_RATIO * typical):
            findings.append(Finding(
                "batch_outlier", "warning",
                f"field '{s.name}' reaches |x| = {s.maxabs:.3g}, {s.maxabs / typical:.3g}x "
                f"its typical {typical:.3g} in earlier batches.",
                "check this batch's samples; clip or drop outliers, or skip the batch.",
                cause="outlier_batch",
                evidence={"field": s.name, "maxabs": s.maxabs, "typical": typical}))
    return findings


def _size_findings(stats: list[FieldStats], expected_batch_size: int | None) -> list[Finding]:
    """A batch smaller than the configured size."""
    findings: list[Finding] = []
    if expected_batch_size is not None and stats:
        sizes = {s.shape[0] for s in stats if s.shape}
        actual = max(sizes) if sizes else None
        if actual is not None and actual < expected_batch_size:
            findings.append(Finding(
                "batch_size", "warning",
                f"the batch holds {actual} samples where {expected_batch_size} were configured: "
                "the loader or a memory fallback is silently truncating batches.",
                "assert len(batch) == batch_size in the loader; fix the source of truncation.",
                cause="batch_truncated",
                evidence={"actual": actual, "expected": expected_batch_size}))
    return findings


CHANCE_FACTOR = 1.5
"""A language model whose first loss is this many times ln(vocabulary) predicts worse than
uniform guessing: it is confidently wrong about what the tokens mean."""


def check_loss_above_chance(loss: float | None, batch: Any, model: nn.Module | None,
                            *, when: str = "first",
                            ceiling: float | None = None) -> Finding | None:
    """The loss of a language-model batch against chance level (ln of the vocabulary).

    A pre-trained model scores far below chance on text it understands, and a freshly initialised
    one near it; far above means the ids do not mean what the model learned: a tokenizer or
    vocabulary mismatch (or a domain the model has never seen). Only for batches of token ids
    whose labels, if any, are tokens too (not class labels, whose chance level is another).
    `ceiling`: the most a cross-entropy of the model's scores could cost at this step, when
    measured. Ids the model misreads give a cross-entropy of the scores it made, under it; a loss
    beyond it (`loss_bound.beyond`) was raised outside the model, and says nothing of the ids."""
    vocab = embedding_size(model)
    if (loss is None or not math.isfinite(loss) or vocab is None or vocab < 2
            or beyond(loss, ceiling)):
        return None
    fields = [(name.rsplit(".", 1)[-1], name, t) for name, t in named_tensors(batch)]
    tokens = [t for base, name, t in fields
              if ((base in TOKEN_FIELDS and base != "labels") or name == "input")
              and not t.is_floating_point()]
    labels = [t for base, _, t in fields if base == "labels"]
    if not tokens or any(label.shape != tokens[0].shape for label in labels):
        return None
    chance = chance_loss(vocab)
    if loss < CHANCE_FACTOR * chance:
        return None
    return Finding(
        "batch_above_chance", "warning",
        f"the {when} loss {loss:.3g} is {loss / chance:.3g}x chance level (ln {vocab} = "
        f"{chance:.3g}): the model predicts these tokens worse than uniform guessing.",
        "check that the data were tokenised with the model's own tokenizer and vocabulary "
        "(and that labels are aligned with inputs).", cause="tokenizer_mismatch",
        evidence={"loss": loss, "chance": chance, "vocab": vocab})
