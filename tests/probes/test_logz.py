"""The log Z probe against logsumexp computed by hand, on class scores of both shapes."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from trainguard.probes.logz import (
    LOGZ_KEYS,
    MAX_ELEMENTS,
    MAX_ROWS,
    MIN_ROWS,
    LogZProbe,
    _host_scores,
    host_rows,
    logz_rows,
    logz_values,
)


def logz_stats(t: torch.Tensor) -> list[float] | None:
    """`LOGZ_KEYS` of one output, as the pipeline reads them: the probe's values on the device,
    then the host's reductions."""
    rows = logz_rows(t)
    if rows is None:
        return None
    assert rows.dtype == torch.float32 and rows.device == t.device
    values = logz_values(rows.numpy().astype("float64"))
    return [float(values[key][0]) for key in LOGZ_KEYS]


def by_hand(rows: list[list[float]]) -> tuple[float, float]:
    z = [math.log(sum(math.exp(v) for v in row)) for row in rows]
    return sum(z) / len(z), max(z)


def test_a_classifier_output_against_the_hand_computed_log_z() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0], [10.0, -5.0, 2.0]])
    mean, high, _ = logz_stats(logits)  # type: ignore[misc]
    expected = by_hand(logits.tolist())
    assert mean == pytest.approx(expected[0], rel=1e-6)
    assert high == pytest.approx(expected[1], rel=1e-6)


def test_a_language_model_output_counts_every_position() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7) * 4
    mean, high, _ = logz_stats(logits)  # type: ignore[misc]
    expected = by_hand(logits.reshape(-1, 7).tolist())
    assert mean == pytest.approx(expected[0], rel=1e-5)
    assert high == pytest.approx(expected[1], rel=1e-5)


def test_many_positions_are_strided_down_to_the_cap() -> None:
    logits = torch.arange(3 * MAX_ROWS, dtype=torch.float32)[:, None] * torch.ones(1, 4)
    mean, high, _ = logz_stats(logits)  # type: ignore[misc]
    rows = logits[::3]  # every third position: MAX_ROWS of them
    assert mean == pytest.approx(float(torch.logsumexp(rows, -1).mean()), rel=1e-6)
    assert high == pytest.approx(float(torch.logsumexp(rows, -1).max()), rel=1e-6)


@pytest.mark.parametrize("classes", [MAX_ELEMENTS // 64, MAX_ELEMENTS])
def test_a_large_vocabulary_is_read_at_fewer_positions(classes: int) -> None:
    """The budget is in class scores: 64 positions of a vocabulary of 8192, and `MIN_ROWS` of
    one so large that the budget would leave fewer."""
    positions = 4 * MAX_ROWS
    # one value per position, expanded over the classes: no memory of that size is taken
    logits = torch.arange(positions, dtype=torch.float32)[:, None].expand(-1, classes)
    mean, high, _ = logz_stats(logits)  # type: ignore[misc]
    kept = max(MIN_ROWS, MAX_ELEMENTS // classes)
    rows = logits[::positions // kept]
    assert rows.shape[0] == kept < MAX_ROWS
    assert mean == pytest.approx(float(torch.logsumexp(rows, -1).mean()), rel=1e-6)
    assert high == pytest.approx(float(torch.logsumexp(rows, -1).max()), rel=1e-6)


def test_half_precision_scores_are_summed_in_float32() -> None:
    logits = torch.full((4, 1000), 60.0, dtype=torch.bfloat16)
    mean, _, _ = logz_stats(logits)  # type: ignore[misc]
    assert mean == pytest.approx(60 + math.log(1000), rel=1e-5)


@pytest.mark.parametrize("shape", [(8, 1), (2, 3, 8, 8), (5,)])
def test_outputs_that_are_not_class_scores_are_left_alone(shape: tuple[int, ...]) -> None:
    assert logz_stats(torch.randn(*shape)) is None


def test_the_hook_keeps_the_last_training_forward_and_skips_evaluation() -> None:
    model = nn.Linear(3, 4, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.eye(4, 3))
    probe = LogZProbe(model)
    model(torch.zeros(2, 3))
    x = torch.tensor([[1.0, 2.0, 3.0]])
    model(x)
    model.eval()
    model(torch.full((2, 3), 100.0))  # an evaluation does not count
    seen = probe.values(probe.take().numpy())  # type: ignore[union-attr]
    assert set(seen) == set(LOGZ_KEYS)
    expected = math.log(math.exp(1) + math.exp(2) + math.exp(3) + 1)
    assert float(seen["logz_mean"][0]) == pytest.approx(expected, rel=1e-6)
    probe.close()
    model.train()
    model(x)
    assert probe.take() is None


def test_a_failing_measurement_never_reaches_the_forward_pass(monkeypatch) -> None:
    model = nn.Linear(3, 4)
    probe = LogZProbe(model)

    def broken(t: torch.Tensor) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr("trainguard.probes.logz.logz_rows", broken)
    monkeypatch.setattr("trainguard.probes.logz._host_scores", broken)
    assert model(torch.zeros(2, 3)).shape == (2, 4)
    assert probe.take() is None


def test_the_ceiling_is_what_the_costliest_target_could_cost() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7) * 4
    _, _, ceiling = logz_stats(logits)  # type: ignore[misc]
    rows = logits.reshape(-1, 7)
    costs = -torch.log_softmax(rows, -1)  # every target at every position
    assert ceiling == pytest.approx(float(costs.max()), rel=1e-5)


def test_a_sampling_pass_without_gradients_is_not_read() -> None:
    """A loop that samples completions (GRPO) runs the model in train mode under `no_grad`
    before the forward it trains on: that pass is neither measured nor kept."""
    model = nn.Linear(3, 4, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.eye(4, 3))
    probe = LogZProbe(model)
    x = torch.tensor([[1.0, 2.0, 3.0]])
    model(x).sum().backward()
    with torch.no_grad():
        model(torch.full((2, 3), 100.0))  # sampling after the training forward
    seen = probe.values(probe.take().numpy())  # type: ignore[union-attr]
    expected = math.log(math.exp(1) + math.exp(2) + math.exp(3) + 1)
    assert float(seen["logz_mean"][0]) == pytest.approx(expected, rel=1e-6)
    probe.close()


def test_a_training_forward_records_no_graph_for_the_probe() -> None:
    """The hook runs with gradients recorded (a training forward) and no `no_grad` of its
    own: its values come from the detached scores and hold no graph."""
    model = nn.Linear(3, 4)
    probe = LogZProbe(model)
    model(torch.randn(2, 3)).sum().backward()
    rows = probe.take()
    assert rows is not None and not rows.requires_grad and rows.grad_fn is None
    probe.close()


def test_a_nan_score_is_a_nan_log_z() -> None:
    logits = torch.tensor([[1.0, float("nan"), 3.0], [0.0, 0.0, 0.0]])
    mean, high, ceiling = logz_stats(logits)  # type: ignore[misc]
    assert math.isnan(mean) and math.isnan(high) and math.isnan(ceiling)


def test_float64_scores_keep_their_ceiling_and_a_masked_row_warns_nothing() -> None:
    """The ceiling's subtraction is made in the scores' precision (float64 scores of 1e8 differ
    by units), and a position whose scores are all -inf (masked) gives NaN, not a warning."""
    import warnings

    _, _, ceiling = logz_stats(torch.tensor([[1e8, 1e8 + 3, 1e8 + 1]],  # type: ignore[misc]
                                            dtype=torch.float64))
    assert ceiling == pytest.approx(3.0 + math.log(1 + math.exp(-2) + math.exp(-3)), rel=1e-6)
    masked = torch.tensor([[float("-inf")] * 3, [1.0, 2.0, 3.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mean, _, ceiling = logz_stats(masked)  # type: ignore[misc]
    assert mean == -math.inf and math.isnan(ceiling)


INF = float("inf")


@pytest.mark.parametrize("scores", [
    [[1.0, 2.0, 3.0], [0.0, 0.0, 0.0], [10.0, -5.0, 2.0]],
    [[1.0, float("nan"), 3.0], [0.0, 0.0, 0.0]],
    [[INF, 1.0], [-INF, -INF], [-INF, 2.0], [INF, -INF]],
    [[3e38, 3e38], [-3e38, 1.0]],
])
def test_the_hosts_log_z_is_the_devices(scores: list[list[float]]) -> None:
    """Small outputs ride the transfer as they are and log Z is taken of them on the host: the
    same values as the device's logsumexp, NaN, inf and -inf included."""
    t = torch.tensor(scores)
    device = logz_rows(t)
    assert device is not None
    host = host_rows(t.numpy().reshape(-1), t.shape[-1])
    assert host == pytest.approx(device.numpy().astype("float64"), rel=1e-6, nan_ok=True)


def _probe_reads(model: nn.Module, x: torch.Tensor) -> tuple[LogZProbe, torch.Tensor]:
    probe = LogZProbe(model)
    model(x)
    taken = probe.take()
    assert taken is not None
    return probe, taken


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_small_output_is_read_on_the_host_with_the_same_values(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    model = nn.Linear(8, 10).to(dtype)
    x = torch.randn(64, 8, dtype=dtype)
    probe, taken = _probe_reads(model, x)
    assert probe.taken_classes == 10 and taken.numel() == 640  # the scores, not two reductions
    seen = probe.values(taken.float().numpy())
    expected = logz_values(logz_rows(model(x)).numpy().astype("float64"))  # type: ignore[union-attr]
    for key in LOGZ_KEYS:
        assert float(seen[key][0]) == pytest.approx(float(expected[key][0]), rel=1e-3)
    probe.close()


def test_large_and_float64_outputs_keep_the_devices_reductions() -> None:
    model = nn.Linear(8, 512)
    probe, taken = _probe_reads(model, torch.randn(64, 8))  # 32768 scores
    assert probe.taken_classes is None and taken.numel() == 2 * 64
    probe.close()
    model64 = nn.Linear(8, 10).double()
    probe, taken = _probe_reads(model64, torch.randn(4, 8, dtype=torch.float64))
    assert probe.taken_classes is None and taken.numel() == 2 * 4
    probe.close()


def test_the_scores_are_copied_as_the_forward_made_them() -> None:
    """The hook copies the scores it reads (strided or whole): the output's storage is not held
    until the step is measured, and a loop that writes its logits in place afterwards (a mask,
    a temperature) does not change what is read."""
    class Double(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2.0

    model = Double()
    probe = LogZProbe(model)
    out = model(torch.randn(1, 1024, 3))  # 1024 positions: strided to MAX_ROWS
    taken = probe.take()
    assert taken is not None and taken.numel() == MAX_ROWS * 3
    assert taken.untyped_storage().data_ptr() != out.untyped_storage().data_ptr()
    x = torch.randn(4, 3)
    out = model(x)
    out.mul_(1e6)  # after the forward, in place
    taken = probe.take()
    assert taken is not None
    assert taken.untyped_storage().data_ptr() != out.untyped_storage().data_ptr()
    expected = logz_values(logz_rows(x * 2.0).numpy().astype("float64"))  # type: ignore[union-attr]
    seen = probe.values(taken.numpy())
    assert float(seen["logz_max"][0]) == pytest.approx(float(expected["logz_max"][0]), rel=1e-6)
    probe.close()


def test_a_large_output_laid_out_otherwise_is_left_to_the_device_without_a_copy() -> None:
    """A transposed B x T x V output too large for the host is not copied before it is found
    too large (the device's reductions read it as they always did)."""
    t = torch.randn(8, 128, 2048).transpose(0, 1)
    assert _host_scores(t) is None
