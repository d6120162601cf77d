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
        clip = guard.run.state.clip.adaptive
        assert clip is not None
        return clip
    finally:
        guard.close()


def test_defaults_are_the_clips_own() -> None:
    clip, plain = _clip(GuardConfig(sinks={"console": False},
                                    probes={"preflight": False})), RobustClipLimit()
    for name in ("ratio", "zscore", "warmup_ratio", "alarm_steps"):
        assert getattr(clip, name) == getattr(plain, name), name


def test_the_knobs_reach_the_clip() -> None:
    config = GuardConfig(sinks={"console": False}, probes={"preflight": False},
                         clip={"auto_ratio": 30.0, "auto_zscore": 4.0, "auto_warmup_ratio": 5.0,
                               "auto_alarm_steps": 7})
    clip = _clip(config)
    assert (clip.ratio, clip.zscore, clip.warmup_ratio, clip.alarm_steps) == (30.0, 4.0, 5.0, 7)
    assert GuardConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize("field,value", [("auto_ratio", 0.5), ("auto_zscore", 0),
                                         ("auto_warmup_ratio", float("nan")),
                                         ("auto_alarm_steps", 0)])
def test_bad_knobs_are_a_config_error(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=rf"^clip\.{field}"):
        GuardConfig(clip={field: value})


def test_the_clip_reads_its_config_rather_than_defaults_of_its_own() -> None:
    """The limit's knobs, baseline window, warm-up, noise floor and ceiling are the config's:
    the clip keeps no copy of their defaults."""
    config = GuardConfig(clip={"auto_ratio": 30.0, "auto_alarm_steps": 7},
                         detectors={"common": {"baseline_window": 20, "warmup_steps": 4,
                                               "min_log_scale": 0.1},
                                    "grad_explosion": {"abs_threshold": 500.0}})
    clip = RobustClipLimit(config)
    assert (clip.ratio, clip.alarm_steps, clip.window, clip.warmup_steps) == (30.0, 7, 20, 4)
    assert (clip.min_log_scale, clip.ceiling) == (0.1, 500.0)
    default, plain = GuardConfig(), RobustClipLimit()
    assert (plain.ratio, plain.zscore, plain.warmup_ratio, plain.alarm_steps) == (
        default.clip.auto_ratio, default.clip.auto_zscore, default.clip.auto_warmup_ratio,
        default.clip.auto_alarm_steps)
    assert (plain.window, plain.ceiling) == (default.detectors.common.baseline_window,
                                             default.detectors.grad_explosion.abs_threshold)
