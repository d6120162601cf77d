"""The batch watcher along training: reported once, and the spike batch above chance level."""

from __future__ import annotations

import torch
from torch import nn

from trainguard.diagnose.batch import describe_batch
from trainguard.diagnose.batch_watch import BatchWatch


def _lm_batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids.clone()}


def test_a_spike_far_above_chance_after_a_model_that_understood_the_data() -> None:
    watch = BatchWatch(nn.Embedding(64, 8), expected_batch_size=None)  # ln 64 = 4.16
    kinds = [e.kind for e in watch.events(_lm_batch(), 60, True, None, loss=9.0, level=0.9)]
    assert kinds == ["batch_above_chance"]
    again = watch.events(_lm_batch(), 61, True, None, loss=9.0, level=0.9)
    assert again == [], "an ongoing finding is reported once"


def test_a_fresh_or_damaged_model_above_chance_is_not_the_batch() -> None:
    watch = BatchWatch(nn.Embedding(64, 8), expected_batch_size=None)
    fresh = watch.events(_lm_batch(), 1, True, None, loss=25.0, level=4.16)  # at chance before
    damaged = watch.events(_lm_batch(), 90, True, None, loss=25.0, level=9.0)  # above before
    no_spike = watch.events(_lm_batch(), 5, True, None, loss=25.0, level=None)
    assert fresh == damaged == no_spike == []


def test_nonfinite_input_is_known_while_it_lasts() -> None:
    watch = BatchWatch(nn.Linear(4, 1), expected_batch_size=None)
    bad = {"x": torch.tensor([[float("nan"), 0.0, 0.0, 0.0]])}
    first = watch.look(bad, 3, True, None)
    assert [e.kind for e in first.events] == ["batch_nonfinite"]
    assert first.nonfinite and first.inspected
    again = watch.look(bad, 4, True, None)
    assert again.events == [] and again.nonfinite  # once, still known
    assert not watch.look({"x": torch.zeros(1, 4)}, 5, True, None).nonfinite


def _x(scale: float, seed: int) -> dict[str, torch.Tensor]:
    return {"x": torch.randn(8, 4, generator=torch.Generator().manual_seed(seed)) * scale}


def _inspect(watch: BatchWatch, batch: dict[str, torch.Tensor], step: int, data_ids=None):
    """A step without an event whose statistics rode the step's transfer (the pipeline measures
    them on sampled steps and while `watch.following`)."""
    return watch.events(batch, step, False, describe_batch(batch), data_ids=data_ids)


def test_a_lasting_finding_is_followed_and_its_consecutive_batches_make_a_run() -> None:
    watch = BatchWatch(nn.Linear(4, 1), expected_batch_size=None)
    for step in range(3):  # the field's usual size
        watch.events(_x(1.0, step), step, True, None, data_ids=step)
    assert not watch.following
    kinds = [e.kind for e in watch.events(_x(1e4, 3), 3, True, None, data_ids=[30, 31])]
    assert kinds == ["batch_outlier"] and watch.following, "the next batch is inspected too"
    for step in (4, 5):
        assert _inspect(watch, _x(1e4, step), step, data_ids=[10 * step]) == []
    [ongoing] = watch.run_findings()
    assert ongoing.check == "batch_run" and ongoing.cause == "outlier_batch"
    assert ongoing.evidence["ongoing"] and ongoing.evidence["batches"] == 3
    _inspect(watch, _x(1.0, 6), 6, data_ids=60)  # clean again: the run ends
    assert not watch.following
    [run] = watch.run_findings()
    assert not run.evidence["ongoing"]
    assert (run.evidence["first_step"], run.evidence["last_step"]) == (3, 5)
    assert run.evidence["data_ids"] == [30, 31, 40, 50]
    assert run.message.startswith("3 consecutive batches (steps 3-5, data ids 30, 31, 40, 50) "
                                  "had batch_outlier on 'x'")


def test_two_odd_batches_or_a_gap_are_no_run() -> None:
    watch = BatchWatch(nn.Linear(4, 1), expected_batch_size=None)
    for step in range(3):
        watch.events(_x(1.0, step), step, True, None)
    for step in (3, 4, 6):  # step 5 was not inspected (no batch given)
        watch.events(_x(1e4, step), step, True, None)
    assert watch.run_findings() == []


def test_consecutive_batch_indices_read_as_a_range() -> None:
    watch = BatchWatch(nn.Linear(4, 1), expected_batch_size=None)
    for step in range(3):
        watch.events(_x(1.0, step), step, True, None, data_ids=step)
    for step in range(100, 110):
        _inspect(watch, _x(1e4, step), step, data_ids=step)
    _inspect(watch, _x(1.0, 110), 110, data_ids=110)
    [run] = watch.run_findings()
    assert "(steps 100-109, data ids 100-109)" in run.message


def test_the_guard_follows_a_bad_shard_in_the_step_transfer_and_names_it() -> None:
    from torch.nn import functional as F

    from trainguard import Guard, GuardConfig
    from trainguard.transfer import transfer_count

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    guard = Guard(model, optimizer, config=GuardConfig(sinks={"console": False},
                                                       probes={"preflight": False,
                                                               "sample_every": 10}))
    transfers = {}
    for step in range(60):
        x = torch.randn(16, 4, generator=torch.Generator().manual_seed(step))
        y = x.sum(1, keepdim=True)
        if 40 <= step < 50:  # a shard of raw, unscaled values
            x = x * 1e4
        loss = F.mse_loss(model(x), y)
        loss.backward()
        before = transfer_count()
        report = guard.step(loss, batch={"x": x, "y": y})
        transfers[step] = (transfer_count() - before, bool(report.events))
        optimizer.zero_grad(set_to_none=True)
    # the shard's batches were inspected in the one transfer, those after the first without an
    # event but the first's jump told again at the next step, where the loss has not come back
    assert [s for s in range(40, 50) if transfers[s][0] == 1] == list(range(40, 50))
    assert [s for s in range(40, 50) if transfers[s][1]] == [40, 41]
    assert [(e.step, e.severity) for e in guard.events if e.kind == "loss_spike"] == [
        (40, "info"), (41, "error")]
    [run] = guard.run.batches.run_findings()
    assert (run.evidence["first_step"], run.evidence["last_step"]) == (40, 49)
    ranked = guard.diagnose()
    assert ranked[0].code == "outlier_batch"
    assert "(steps 40-49, data ids 40-49)" in ranked[0].evidence[0]
    guard.close()
    assert any(f.check == "batch_run" for f in guard.findings), "recorded with the findings"


def test_a_spike_beyond_what_the_model_scores_allow_is_not_the_batch() -> None:
    watch = BatchWatch(nn.Embedding(64, 8), expected_batch_size=None)
    scaled = watch.events(_lm_batch(), 60, True, None, loss=9.0e5, level=0.9, ceiling=14.0)
    assert scaled == []
    misread = watch.events(_lm_batch(), 61, True, None, loss=9.0, level=0.9, ceiling=14.0)
    assert [e.kind for e in misread] == ["batch_above_chance"]
