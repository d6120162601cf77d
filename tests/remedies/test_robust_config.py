"""The adaptive clip's knobs are reachable from GuardConfig and reach the clip the run builds."""

from __future__ import annotations

import pytest
import torch

import trainguard
from trainguard.config import GuardConfig
from trainguard.errors import ConfigError
from trainguard.remedies.robust import RobustClipLimit


def _clip(config: GuardConfig) -> RobustClipLimit:
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = trainguard.Guard(model, optimizer, config=config)
    try:
        clip = guard.run.state.auto_clip
        assert clip is not None
        return clip
    finally:
        guard.close()


def test_defaults_are_the_clips_own() -> None:
    clip, plain = _clip(GuardConfig(console=False, preflight=False)), RobustClipLimit()
    for name in ("ratio", "zscore", "warmup_ratio", "alarm_steps"):
        assert getattr(clip, name) == getattr(plain, name), name


def test_the_knobs_reach_the_clip() -> None:
    config = GuardConfig(console=False, preflight=False, auto_clip_ratio=30.0,
                         auto_clip_zscore=4.0, auto_clip_warmup_ratio=5.0,
                         auto_clip_alarm_steps=7)
    clip = _clip(config)
    assert (clip.ratio, clip.zscore, clip.warmup_ratio, clip.alarm_steps) == (30.0, 4.0, 5.0, 7)
    assert GuardConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize("field,value", [("auto_clip_ratio", 0.5), ("auto_clip_zscore", 0),
                                         ("auto_clip_warmup_ratio", float("nan")),
                                         ("auto_clip_alarm_steps", 0)])
def test_bad_knobs_are_a_config_error(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=field):
        GuardConfig(**{field: value})
