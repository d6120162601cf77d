"""What trainguard tells a tracker: keys MLflow accepts, the trainer's step axis, the alerts'
rate limit."""

from __future__ import annotations

import pytest

from trainguard.events import Event
from trainguard.sinks.tracking import (
    OWN_AXIS,
    AlertGate,
    step_axis,
    tracker_key,
)


@pytest.mark.parametrize("parts, expected", [
    (("grad_norm",), "trainguard/grad_norm"),
    (("layers", "grad_norm", "model.layers.0.attn.weight"),
     "trainguard/layers/grad_norm/model.layers.0.attn.weight"),
    (("layers", "act", "blocks[0]@fc"), "trainguard/layers/act/blocks_0__fc"),
    (("eval", "../x//y"), "trainguard/eval/__/x/_/y"),
    (("cause", "1", "fix"), "trainguard/cause/1/fix"),
])
def test_keys_are_made_of_what_mlflow_accepts(parts: tuple[str, ...], expected: str) -> None:
    from mlflow.utils.validation import _validate_metric_name

    key = tracker_key(*parts)
    assert key == expected
    _validate_metric_name(key)  # raises for a key MLflow refuses


def test_each_trainer_has_its_step_axis() -> None:
    assert step_axis("transformers.Trainer").key == "train/global_step"
    assert step_axis("transformers.Trainer").value(0) == 1  # logged after the update
    assert step_axis("lightning.pytorch.Trainer").value(4) == 4
    assert step_axis("pytorch_lightning.Trainer").key == "trainer/global_step"
    assert step_axis("") is OWN_AXIS and OWN_AXIS.key == "trainguard/step"


def _event(kind: str, severity: str = "error") -> Event:
    return Event(kind=kind, step=0, severity=severity, message="")  # type: ignore[arg-type]


def test_alerts_are_for_warnings_and_worse_once_per_kind_a_while_and_few_in_all() -> None:
    gate = AlertGate(per_kind_s=60, most=3)
    assert not gate.admits(_event("loss_spike", "info"), now=0)
    assert gate.admits(_event("nonfinite_loss"), now=0)
    assert not gate.admits(_event("nonfinite_loss"), now=30)  # the same kind, too soon
    assert gate.admits(_event("nonfinite_grad", "warning"), now=30)
    assert gate.admits(_event("nonfinite_loss"), now=61)
    assert not gate.admits(_event("grad_explosion"), now=200)  # the run's most reached
    assert (gate.sent, gate.held) == (3, 2)
