from __future__ import annotations

import pytest

from trainguard import ConfigError, DetectorConfig, GuardConfig


def test_defaults_are_valid_and_round_trip() -> None:
    config = GuardConfig()
    assert config.policy == "protect"
    assert config.max_grad_norm == 1.0
    assert config.detectors.grad_norm_abs_threshold == 1000.0
    assert GuardConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize("kwargs, field", [
    ({"policy": "yolo"}, "GuardConfig.policy"),
    ({"max_grad_norm": -1.0}, "GuardConfig.max_grad_norm"),
    ({"max_grad_norm": float("nan")}, "GuardConfig.max_grad_norm"),
    ({"sample_every": 0}, "GuardConfig.sample_every"),
    ({"halt_severity": "bad"}, "GuardConfig.halt_severity"),
    ({"max_consecutive_skips": 0}, "GuardConfig.max_consecutive_skips"),
])
def test_bad_values_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        GuardConfig(**kwargs)


def test_unknown_policy_lists_the_choices() -> None:
    with pytest.raises(ConfigError, match="observe, protect, halt"):
        GuardConfig(policy="yolo")  # type: ignore[arg-type]


def test_detector_thresholds_are_validated() -> None:
    with pytest.raises(ConfigError, match=r"DetectorConfig\.loss_spike_ratio"):
        DetectorConfig(loss_spike_ratio=1.0)
    with pytest.raises(ConfigError, match=r"DetectorConfig\.warmup_steps"):
        DetectorConfig(warmup_steps=-1)
    assert GuardConfig(detectors={"grad_norm_ratio": 5.0}).detectors.grad_norm_ratio == 5.0


def test_from_dict_rejects_unknown_fields() -> None:
    with pytest.raises(ConfigError, match="unknown field"):
        GuardConfig.from_dict({"polcy": "halt"})
