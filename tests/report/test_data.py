"""What the report reads of a run's stored configuration."""

from __future__ import annotations

from types import SimpleNamespace

from trainguard.config import GuardConfig
from trainguard.report.data import RunData


def _clip_level(config: dict) -> float | None:
    return RunData.max_grad_norm.fget(SimpleNamespace(config=config))  # type: ignore[attr-defined]


def test_the_clip_level_is_read_from_the_stored_config_of_either_shape() -> None:
    assert _clip_level(GuardConfig(clip={"max_grad_norm": 1.0}).to_dict()) == 1.0
    assert _clip_level(GuardConfig().to_dict()) is None  # "auto": no level of its own
    assert _clip_level({"policy": "protect", "max_grad_norm": 0.5}) == 0.5  # an older store's
    assert _clip_level({}) is None
