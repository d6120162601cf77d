"""The batch inspector flags each data fault, and the Guard reports them as events."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from trainguard import Guard, GuardConfig
from trainguard.diagnose.batch import (
    BatchHistory,
    batch_elements_of,
    check_loss_above_chance,
    describe_batch,
    inspect_batch,
    named_tensors,
)
from trainguard.errors import BatchError
from trainguard.transfer import transfer_count

from ..conftest import make_setup, torch_threads


def checks(findings) -> set[str]:
    return {f.check for f in findings}


def images(scale: float = 1.0, n: int = 8) -> torch.Tensor:
    return torch.rand(n, 3, 8, 8, generator=torch.Generator().manual_seed(0)) * scale


def test_describe_counts_nonfinite_values_explicitly() -> None:
    x = images()
    x[0, 0, 0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    [stats] = describe_batch(x)
    assert (stats.nonfinite, stats.nan) == (3, 1)
    assert 0 <= stats.min and stats.max <= 1, "range of the finite values"
    before = transfer_count()
    describe_batch({"a": x, "b": torch.arange(5)})
    assert transfer_count() - before == 1


def test_nonfinite_inputs() -> None:
    x = images()
    x[2, 1, 3, 3] = float("nan")
    [finding] = inspect_batch({"pixel_values": x, "labels": torch.zeros(8, dtype=torch.long)})
    assert finding.check == "batch_nonfinite" and finding.cause == "nonfinite_input"
    assert finding.severity == "error" and "pixel_values" in finding.message


@pytest.mark.parametrize("scale, low, flagged", [(255.0, 0.0, True), (1.0, 0.0, False),
                                                 (2.0, -1.0, False)])
def test_image_normalisation_range(scale: float, low: float, flagged: bool) -> None:
    findings = inspect_batch((images(scale) + low, torch.zeros(8, dtype=torch.long)))
    assert ("batch_image_range" in checks(findings)) == flagged
    if flagged:
        assert findings[0].cause == "input_scale"


def pictures(n: int = 8, size: int = 16, channels: int = 3) -> torch.Tensor:
    """Channel-last (N, H, W, C) images whose neighbouring pixels agree, as a picture's do:
    smoothed noise, its channels sharing a common brightness."""
    generator = torch.Generator().manual_seed(1)
    shared = torch.rand(n, 1, size + 4, size + 4, generator=generator)
    own = torch.rand(n, channels, size + 4, size + 4, generator=generator)
    smooth = nn.functional.avg_pool2d(shared + 0.5 * own, 5, 1)
    return smooth.permute(0, 2, 3, 1).contiguous()


def sparse_strokes(channels: int) -> torch.Tensor:
    """MNIST-like images: mostly zero, a few bright strokes."""
    x = torch.zeros(8, channels, 28, 28)
    x[:, :, 8:20, 12:15] = 1.0
    x[::2, :, 18:21, 6:22] = 1.0
    return x


@pytest.mark.parametrize("make, flagged", [
    (lambda: pictures().permute(0, 3, 1, 2), False),  # channel-last permuted: right
    (lambda: pictures().view(8, 3, 16, 16), True),  # channel-last viewed: scrambled
    (lambda: pictures().reshape(8, 3, 16, 16) * 255, True),  # reshaped, in 0-255 too
    (lambda: pictures(channels=4).permute(0, 3, 1, 2), False),  # four-channel latents
    (lambda: pictures(channels=4).reshape(8, 4, 16, 16), True),
    (lambda: torch.rand(8, 3, 16, 16, generator=torch.Generator().manual_seed(2)), False),
    (lambda: sparse_strokes(1), False),
    (lambda: sparse_strokes(3), False),
    (lambda: pictures().permute(0, 3, 1, 2)[:, :, :1, :], False),  # one row: no neighbours
], ids=["permuted", "viewed", "reshaped_255", "latents", "latents_reshaped", "noise",
        "strokes_grey", "strokes_rgb", "one_row"])
def test_images_reshaped_instead_of_permuted_are_named(make, flagged: bool) -> None:
    findings = [f for f in inspect_batch({"pixel_values": make()})
                if f.check == "batch_channel_order"]
    assert bool(findings) == flagged, [f.message for f in findings]
    if flagged:
        assert findings[0].cause == "input_scale" and "permute" in findings[0].fix


def test_the_channel_order_rides_the_batch_statistics_transfer() -> None:
    before = transfer_count()
    [stats] = describe_batch(pictures().view(8, 3, 16, 16))
    assert transfer_count() - before == 1
    assert stats.roughness > 2 * stats.roughness_hwc


def test_token_ids_beyond_the_embedding_table() -> None:
    setup = make_setup()  # vocabulary of 32
    ids = setup.batch()
    assert inspect_batch({"input_ids": ids}, model=setup.model) == []
    foreign = ids.clone()
    foreign[0, 0] = 40
    [finding] = inspect_batch({"input_ids": foreign}, model=setup.model)
    assert finding.check == "batch_token_ids" and finding.cause == "tokenizer_mismatch"
    assert "32 rows" in finding.message
    assert checks(inspect_batch(foreign, model=setup.model)) == {"batch_token_ids"}, "bare ids"
    labels = ids.clone()
    labels[:, :3] = -100  # ignored positions are no foreign ids
    assert inspect_batch({"input_ids": ids, "labels": labels}, model=setup.model) == []
    guard = Guard(setup.model, setup.optimizer, config=GuardConfig(sinks={"console": False}))
    with pytest.raises(BatchError, match=r"ids from \d+ to 40, outside the embedding table"):
        guard.check_batch({"input_ids": foreign})
    assert guard.check_batch({"input_ids": ids}) == []


def test_attention_masks() -> None:
    ids = torch.ones(2, 4, dtype=torch.long)
    assert "batch_attention_mask" in checks(
        inspect_batch({"input_ids": ids, "attention_mask": torch.full((2, 4), 2)}))
    [empty] = inspect_batch({"input_ids": ids, "attention_mask": torch.zeros(2, 4)})
    assert empty.severity == "error"
    assert inspect_batch({"input_ids": ids, "attention_mask": torch.ones(2, 4)}) == []


def padded(lengths: list[int], width: int = 12, pad_label: int | None = 0
           ) -> dict[str, torch.Tensor]:
    """A right-padded language-model batch: `labels` a copy of the ids with the padding's
    labels left at `pad_label` (None: -100, as a collator sets them)."""
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.arange(1, n + 1)
        mask[row, :n] = 1
    labels = ids.clone()
    labels[mask == 0] = -100 if pad_label is None else pad_label
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def test_labels_left_on_the_padding_are_named() -> None:
    [found] = [f for f in inspect_batch(padded([3, 5, 12, 7]))
               if f.check == "batch_padding_labels"]
    assert found.severity == "warning" and found.cause == "padding_labels"
    # 21 padding positions, 18 past the first of each sequence (9 + 7 + 0 + 5, less 3)
    assert found.evidence == {"field": "labels", "labelled_padding": 18, "padding": 21}
    assert "labels[attention_mask == 0] = -100" in found.fix


def test_two_labelled_pads_in_half_the_sequences_are_told() -> None:
    """More than one a sequence, counted sequence by sequence (not against the batch size)."""
    batch = padded([10] * 16 + [12] * 16, pad_label=None)
    batch["labels"][:16, 10:] = 0
    assert "batch_padding_labels" in checks(inspect_batch(batch))


@pytest.mark.parametrize("case", ["masked", "no_padding", "first_pad_labelled", "mask_bool",
                                  "classification", "encoder_decoder",
                                  "wrapped_encoder_decoder", "additive_mask"])
def test_labels_that_leave_the_padding_out_are_not(case: str) -> None:
    batch = padded([3, 5, 12, 7], pad_label=None)
    model = None
    if case == "no_padding":
        batch = padded([12, 12], pad_label=0)
    elif case == "first_pad_labelled":  # the end-of-text token doubling as the pad keeps a label
        batch = padded([3, 5, 11, 7], pad_label=None)
        for row, n in enumerate([3, 5, 11, 7]):
            batch["labels"][row, n] = 0
    elif case == "mask_bool":
        batch["attention_mask"] = batch["attention_mask"].bool()
    elif case == "classification":  # one label a sequence: not of the positions
        batch["labels"] = torch.tensor([0, 1, 0, 1])
    elif case in ("encoder_decoder", "wrapped_encoder_decoder"):
        # the mask is the source's, the labels the target's
        batch = padded([3, 5, 12, 7])
        model = nn.Linear(2, 2)
        model.config = type("Config", (), {"is_encoder_decoder": True})()  # type: ignore
        if case == "wrapped_encoder_decoder":  # a user's module (or DDP) around the model
            model = nn.Sequential(model)
    elif case == "additive_mask":  # 0 and -inf: not a 0/1 mask, told apart
        batch = padded([3, 5, 12, 7], pad_label=None)
        batch["attention_mask"] = torch.where(batch["attention_mask"] == 1, 0.0, -math.inf)
    assert "batch_padding_labels" not in checks(inspect_batch(batch, model=model))


def test_a_plain_loop_with_labels_on_the_padding_is_told_once() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 16))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    guard = Guard(model, optimizer, config=GuardConfig(sinks={"console": False},
                                                       probes={"preflight": False}))
    events = []
    for _ in range(6):
        batch = padded([3, 5, 12, 7])
        logits = model(batch["input_ids"])
        loss = nn.functional.cross_entropy(logits.reshape(-1, 16), batch["labels"].reshape(-1))
        loss.backward()
        events += guard.step(loss, batch=batch).events
        optimizer.zero_grad(set_to_none=True)
    assert [e.kind for e in events if e.kind != "batch_repeated"] == ["batch_padding_labels"]
    assert guard.diagnose()[0].code == "padding_labels"
    # told once per run: the inspector does not follow every batch (its cost, the calm lane)
    assert not guard.run.state.batches.following
    assert not [f for f in guard.findings if f.check == "batch_run"]
    guard.close()


def test_outlier_batch_against_running_statistics() -> None:
    history = BatchHistory()
    for seed in range(5):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(seed))
        history.update(describe_batch(x))
    normal = torch.randn(8, 16)
    assert inspect_batch(normal, history=history) == []
    [finding] = inspect_batch(normal * 1000, history=history)
    assert finding.check == "batch_outlier" and finding.cause == "outlier_batch"


def test_images_far_above_their_usual_size_are_not_taken_for_8_bit_pixels() -> None:
    """Once a field has a history, a batch merely 100x its usual [0, 1] (raw values, max ~100) is
    an outlier batch; one reaching the upper half of 0-255 looks like unnormalised pixels. The
    first batch, with nothing to compare against, is judged by its range alone."""
    history = BatchHistory()
    for seed in range(3):
        history.update(describe_batch(images() * (1 + 0.1 * seed)))
    raw = checks(inspect_batch(images() * 100, history=history))
    assert raw == {"batch_outlier"}
    pixels = checks(inspect_batch(images() * 255, history=history))
    assert pixels == {"batch_outlier", "batch_image_range"}
    assert checks(inspect_batch(images() * 100)) == {"batch_image_range"}


def test_labels_that_are_all_ignored_leave_the_loss_nothing_to_average() -> None:
    ids = torch.randint(0, 10, (2, 6))
    [finding] = inspect_batch({"input_ids": ids, "labels": torch.full((2, 6), -100)})
    assert finding.check == "batch_labels" and finding.cause == "empty_loss"
    assert finding.severity == "error" and "12 labels" in finding.message
    some = torch.full((2, 6), -100)
    some[1, 3] = 4  # one target left: a mean over one label
    assert inspect_batch({"input_ids": ids, "labels": some}) == []


@pytest.mark.parametrize("shape", ["y", "target", "tuple"])
def test_labels_all_ignored_are_found_under_any_name(shape: str) -> None:
    x = torch.randn(4, 3)
    y = torch.full((4,), -100)
    batch = (x, y) if shape == "tuple" else {"x": x, shape: y}
    [finding] = inspect_batch(batch)
    assert finding.check == "batch_labels" and finding.cause == "empty_loss"
    assert finding.evidence["field"] == ("[1]" if shape == "tuple" else shape)
    y[2] = 1  # one target left
    assert inspect_batch(batch) == []


@pytest.mark.parametrize("shape", ["dict", "tuple"])
def test_a_plain_loop_whose_labels_are_all_ignored_ranks_empty_loss_first(shape: str) -> None:
    """An MLP classifier in the usual plain-loop shapes, `{"x": x, "y": y}` and `(x, y)`: at
    step 30 a masking bug leaves every label at -100, the mean cross-entropy is 0/0 = NaN."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    guard = Guard(model, optimizer, config=GuardConfig(sinks={"console": False}))
    generator = torch.Generator().manual_seed(0)
    for step in range(40):
        x = torch.randn(16, 8, generator=generator)
        y = (x[:, :4].argmax(1) if step != 30 else torch.full((16,), -100))
        loss = nn.functional.cross_entropy(model(x), y)  # ignore_index=-100
        loss.backward()
        guard.step(loss, batch={"x": x, "y": y} if shape == "dict" else (x, y))
        optimizer.zero_grad(set_to_none=True)
    causes = guard.diagnose()
    guard.close()
    assert causes and causes[0].code == "empty_loss", [(c.code, c.score) for c in causes]


def test_silently_truncated_batches() -> None:
    [finding] = inspect_batch(torch.zeros(4, 3), expected_batch_size=16)
    assert finding.check == "batch_size" and finding.cause == "batch_truncated"
    assert inspect_batch(torch.zeros(16, 3), expected_batch_size=16) == []


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.head = nn.Linear(4 * 6 * 6, 2)

    def forward(self, x):
        return self.head(self.conv(x).flatten(1))


def step(guard: Guard, model: nn.Module, x: torch.Tensor):
    loss = (model(x) * 0.0).sum()  # gradients of zero: only the batch can raise events
    loss.backward()
    report = guard.step(loss, batch={"pixel_values": x})
    guard.optimizer.zero_grad(set_to_none=True)
    return report


def test_the_guard_reports_batch_faults_as_events() -> None:
    model = Tiny()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    guard = Guard(model, optimizer, config=GuardConfig(sinks={"console": False},
                                                       probes={"preflight": False}))
    report = step(guard, model, images(255.0))
    assert [e.kind for e in report.events] == ["batch_image_range"], "first batch inspected"
    assert report.events[0].details["cause"] == "input_scale"
    assert step(guard, model, images(255.0)).events == [], "reported once"
    for _ in range(3):  # an epoch's last short batch is normal ...
        step(guard, model, images(255.0))
    assert step(guard, model, images(255.0, n=3)).events == []
    assert step(guard, model, images(255.0)).events == []
    step(guard, model, images(255.0, n=3))  # ... but two in a row are truncation
    [event] = step(guard, model, images(255.0, n=3)).events
    assert event.kind == "batch_size" and event.details["cause"] == "batch_truncated"


def test_a_language_model_loss_above_chance_points_at_the_tokenizer() -> None:
    model = nn.Embedding(64, 8)  # the vocabulary the model was trained with: 64 tokens
    ids = torch.randint(0, 64, (4, 16))
    lm = {"input_ids": ids, "labels": ids.clone()}
    finding = check_loss_above_chance(8.0, lm, model)  # ln 64 = 4.16: 1.9x chance
    assert finding is not None and finding.cause == "tokenizer_mismatch"
    assert finding.evidence["vocab"] == 64
    assert check_loss_above_chance(3.0, lm, model) is None  # below chance: understood
    classifier = {"input_ids": ids, "labels": torch.zeros(4, dtype=torch.long)}
    assert check_loss_above_chance(8.0, classifier, model) is None  # class labels: other chance
    assert check_loss_above_chance(float("nan"), lm, model) is None


def test_the_first_loss_above_chance_is_a_finding_not_an_event() -> None:
    """A model that starts worse than guessing is noted for the diagnosis; it is not an alarm
    (a fine-tune on a new domain can start there too)."""
    setup = make_setup(warmup=0)  # vocabulary of 32
    with torch_threads(1):
        for _ in range(150):  # trained on its language before the guarded fine-tune
            setup.model.loss(setup.batch()).backward()
            setup.optimizer.step()
            setup.optimizer.zero_grad(set_to_none=True)
        guard = Guard(setup.model, setup.optimizer, config=GuardConfig(sinks={"console": False}))
        # the fine-tune's data were encoded with another vocabulary: the ids mean something else
        wrong = torch.randperm(32, generator=torch.Generator().manual_seed(1))
        batch = wrong[setup.batch()]
        loss = setup.model.loss(batch)
        loss.backward()
        report = guard.step(loss, batch=batch)
    assert report.events == []
    [finding] = [f for f in guard.findings if f.check == "batch_above_chance"]
    assert finding.cause == "tokenizer_mismatch" and finding.evidence["vocab"] == 32
    assert guard.diagnose()[0].code == "tokenizer_mismatch"


def test_a_batch_size_in_elements_is_its_largest_tensors_from_its_shape_alone() -> None:
    ids = torch.zeros(8, 24, dtype=torch.long)
    batch = {"labels": torch.zeros(8), "input_ids": ids, "attention_mask": torch.ones(8, 24)}
    before = transfer_count()
    assert batch_elements_of(batch) == 8 * 24
    assert batch_elements_of((images(n=4), torch.zeros(4))) == 4 * 3 * 8 * 8
    assert batch_elements_of(ids) == 8 * 24
    assert batch_elements_of({"meta": "a string", "step": torch.tensor(3)}) is None
    assert batch_elements_of(None) is None
    assert transfer_count() == before


def test_a_loss_beyond_what_the_model_scores_allow_says_nothing_of_the_ids() -> None:
    model = nn.Embedding(64, 8)
    ids = torch.randint(0, 64, (4, 16))
    lm = {"input_ids": ids, "labels": ids.clone()}
    within = check_loss_above_chance(8.0, lm, model, ceiling=12.0)  # misread ids can cost that
    assert within is not None and within.cause == "tokenizer_mismatch"
    assert check_loss_above_chance(8.0e6, lm, model, ceiling=12.0) is None


def test_the_batch_walk_passes_over_raw_text_and_id_lists() -> None:
    """The Guard reads the batch's size every step: a list of strings or of token id lists
    beside the tensors is not walked item by item (20,000 strings took 78 ms a step), while
    lists of tensors and short mixed tuples still are."""
    class Watched(list):  # counts the items a walk takes from it
        taken = 0

        def __iter__(self):  # type: ignore[no-untyped-def]
            for item in super().__iter__():
                Watched.taken += 1
                yield item

    x = torch.zeros(8, 16)
    batch = {"x": x, "text": Watched(["a sentence"] * 20_000), "ids": [list(range(64))] * 64,
             "pair": ("name", torch.ones(3)), "views": [torch.zeros(2)] * 20}
    names = [name for name, _ in named_tensors(batch)]
    assert names[:2] == ["x", "pair[1]"]
    assert len(names) == 2 + 20
    assert batch_elements_of(batch) == 128
    assert Watched.taken == 0
