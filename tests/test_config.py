from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from trainguard import ConfigError, DetectorConfig, GuardConfig
from trainguard.config import (
    DETECTOR_FLAT_NAMES,
    GUARD_FLAT_NAMES,
    ClipConfig,
    RecoveryConfig,
)
from trainguard.detect.settings import GradExplosionConfig, LossSpikeConfig
from trainguard.remedies import (
    AGC,
    AdaptiveClip,
    Chain,
    GlobalNormClip,
    LayerwiseClip,
    agc_spec,
    build_agc,
    build_rule,
    chain,
    rule_spec,
)
from trainguard.remedies.rules import StatelessRule


class HalvingClip(StatelessRule):
    """A rule of the user's own, with a spec: halves every gradient above `above`."""

    def __init__(self, above: float = 1.0, names: Sequence[str] = ()) -> None:
        self.above = above
        self.names = tuple(names)

    def coefficients(self, norms: np.ndarray, global_norm: float,
                     names: Sequence[str]) -> np.ndarray:
        return np.where(np.asarray(norms) > self.above, 0.5, 1.0)

    def describe(self) -> str:
        return f"halve above {self.above:g}"

    def spec(self) -> dict[str, Any]:
        return {"above": self.above, "names": self.names}


class SpeclessClip(StatelessRule):
    """A rule of the user's own that cannot be stored: it has no spec()."""

    def coefficients(self, norms: np.ndarray, global_norm: float,
                     names: Sequence[str]) -> np.ndarray:
        return np.ones(len(names))

    def describe(self) -> str:
        return "nothing"


class TighterLayerwise(LayerwiseClip):
    """A subclass of a trainguard rule that keeps its constructor."""


class NotARule:
    def __init__(self, x: int = 0) -> None:
        self.x = x


def _roundtrip(config: GuardConfig) -> GuardConfig:
    return GuardConfig.from_dict(json.loads(json.dumps(config.to_dict())))


def test_defaults_are_valid_and_round_trip() -> None:
    config = GuardConfig()
    assert config.policy == "protect"
    assert config.clip.max_grad_norm == "auto"
    assert config.detectors.grad_explosion.abs_threshold == 1000.0
    assert GuardConfig.from_dict(config.to_dict()) == config


RULES: dict[str, Any] = {
    "global_norm": GlobalNormClip(0.5),
    "layerwise": LayerwiseClip({"*attn*": 1.0, "*mlp*": 2}, default=0.5),
    "layerwise_per_parameter": LayerwiseClip({"*.weight": 0.1}, per_parameter=True),
    "layerwise_default_only": LayerwiseClip({}, default=0.25),
    "adaptive": AdaptiveClip(z_threshold=3.0, alpha=0.9, warmup_steps=5,
                             fallback_max_norm=None),
    "adaptive_defaults": AdaptiveClip(),
    "chain": chain(LayerwiseClip({"*attn*": 1.0}), AdaptiveClip(), GlobalNormClip(1.0)),
    "nested_chain": chain(chain(GlobalNormClip(2.0), AdaptiveClip(warmup_steps=3)),
                          LayerwiseClip({"*attn*": 1.0}, default=3.0)),
    "custom": HalvingClip(above=2.0, names=("a", "b")),
    "chain_with_custom": chain(HalvingClip(), GlobalNormClip(1.0)),
    "subclass": TighterLayerwise({"*attn*": 0.1}),
    "spec_dict": {"type": "layerwise", "limits": {"*attn*": 1}},
}

CONFIGS: dict[str, GuardConfig] = {
    "defaults": GuardConfig(),
    **{f"policy_{p}": GuardConfig(policy=p) for p in ("observe", "protect", "halt", "recover")},
    "everything_changed": GuardConfig(
        policy="halt", sync="deferred", clip={"max_grad_norm": None},
        probes={"sample_every": 7, "sample_all_steps": True, "batch_size": 32,
                "inspect_batches": False, "preflight": False, "activations": False},
        prove={"mode": "on", "budget_steps": 5.0},
        recovery={"halt_severity": "critical", "max_consecutive_skips": 3},
        checkpoints={"snapshot_dir": "/tmp/snaps", "block_poisoned": True},
        sinks={"store": False, "console": False}, distributed={"desync_every": 11}),
    "path_snapshot_dir": GuardConfig(checkpoints={"snapshot_dir": pathlib.Path("runs") / "crash"}),
    "int_limit": GuardConfig(clip={"max_grad_norm": 2}),
    "custom_detectors": GuardConfig(detectors=DetectorConfig(
        grad_explosion=GradExplosionConfig(ratio=5.0), loss_spike={"ratio": 3.0},
        loss_divergence={"patience": 40},
        common={"warmup_steps": 0, "baseline_window": 3, "min_log_scale": 0.1})),
    "custom_recovery": GuardConfig(policy="recover", recovery=RecoveryConfig(
        ring_size=5, ring_every=10, confirm_steps=0, lr_backoff=0.5, lr_ramp_steps=0,
        max_grad_norm=0.25, rewind_schedule=True, max_rollbacks=0)),
    "nested_as_dicts": GuardConfig(detectors={"grad_explosion": {"ratio": 4.0}},
                                   recovery={"settle_ratio": 2.0}),
    **{f"rule_{name}": GuardConfig(clip={"rule": rule}) for name, rule in RULES.items()},
    "agc": GuardConfig(clip={"agc": AGC(0.02, 1e-4, unitwise=False, exclude=("lm_head.*",))}),
    "agc_spec_dict": GuardConfig(clip={"agc": {"clipping": 0.05}}),
    "rule_and_agc": GuardConfig(policy="recover",
                                clip={"rule": RULES["nested_chain"], "agc": AGC()}),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_configs_round_trip_exactly(name: str) -> None:
    config = CONFIGS[name]
    plain = config.to_dict()
    text = json.dumps(plain, allow_nan=False)  # strict JSON, not just Python data
    assert json.loads(text) == plain
    assert GuardConfig.from_dict(plain) == config
    assert _roundtrip(config) == config
    assert _roundtrip(_roundtrip(config)).to_dict() == plain


@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_config_holds_only_plain_data(name: str) -> None:
    def plain(value: Any) -> bool:
        if isinstance(value, dict):
            return all(isinstance(k, str) and plain(v) for k, v in value.items())
        if isinstance(value, list):
            return all(plain(v) for v in value)
        return value is None or isinstance(value, (bool, int, float, str))

    config = CONFIGS[name]
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            value = dataclasses.asdict(value)  # type: ignore[arg-type]
        assert plain(value), (f.name, value)


def test_to_dict_is_a_copy() -> None:
    config = GuardConfig(clip={"rule": LayerwiseClip({"*attn*": 1.0}), "agc": AGC()})
    plain = config.to_dict()
    plain["clip"]["rule"]["limits"]["*attn*"] = 9.0
    plain["clip"]["agc"]["exclude"].append("x")
    plain["detectors"]["grad_explosion"]["ratio"] = 99.0
    assert config.clip.rule["limits"] == {"*attn*": 1.0}  # type: ignore[index]
    assert "x" not in config.clip.agc["exclude"]  # type: ignore[index]
    assert config.detectors.grad_explosion.ratio == 10.0


def test_a_rule_object_and_its_spec_give_equal_configs() -> None:
    by_object = GuardConfig(clip={"rule": LayerwiseClip({"*attn*": 1.0}, default=0.5)})
    by_spec = GuardConfig(clip={"rule": {"type": "layerwise", "limits": {"*attn*": 1},
                                     "default": 0.5}})
    assert by_object == by_spec
    assert by_object.clip.rule == {"type": "layerwise", "limits": {"*attn*": 1.0},
                                   "default": 0.5, "per_parameter": False}
    assert GuardConfig(clip={"agc": AGC(0.01)}) == GuardConfig(
        clip={"agc": {"type": "agc", "clipping": 0.01}})


def test_the_config_does_not_keep_the_rule_object() -> None:
    rule = AdaptiveClip(warmup_steps=2)
    config = GuardConfig(clip={"rule": rule})
    for norm in (1.0, 2.0, 3.0):
        rule.observe(norm)
    assert rule.warmed_up
    assert config == GuardConfig(clip={"rule": AdaptiveClip(warmup_steps=2)})  # no state inside
    assert not build_rule(config.clip.rule).warmed_up  # type: ignore[arg-type, attr-defined]


def test_replace_keeps_the_rules_and_revalidates() -> None:
    config = GuardConfig(clip={"rule": RULES["chain"], "agc": AGC()})
    tighter = dataclasses.replace(config, clip=dataclasses.replace(config.clip, max_grad_norm=0.25))
    assert tighter.clip.max_grad_norm == 0.25
    assert tighter.clip.rule == config.clip.rule and tighter.clip.agc == config.clip.agc
    with pytest.raises(ConfigError, match=r"clip\.max_grad_norm"):
        dataclasses.replace(config.clip, max_grad_norm=-1.0)


@pytest.mark.parametrize("kwargs, field", [
    ({"policy": "yolo"}, "policy"),
    ({"sync": "later"}, "sync"),
    ({"clip": {"max_grad_norm": -1.0}}, "clip.max_grad_norm"),
    ({"clip": {"max_grad_norm": float("nan")}}, "clip.max_grad_norm"),
    ({"clip": {"max_grad_norm": True}}, "clip.max_grad_norm"),
    ({"clip": {"auto_ratio": 0.5}}, "clip.auto_ratio"),
    ({"clip": 1.0}, "clip"),
    ({"probes": {"sample_every": 0}}, "probes.sample_every"),
    ({"probes": {"batch_size": 0}}, "probes.batch_size"),
    ({"prove": {"mode": "always"}}, "prove.mode"),
    ({"recovery": {"halt_severity": "bad"}}, "recovery.halt_severity"),
    ({"recovery": {"max_consecutive_skips": 0}}, "recovery.max_consecutive_skips"),
    ({"distributed": {"collective_timeout_s": 0}}, "distributed.collective_timeout_s"),
    ({"sinks": {"console": "false"}}, "sinks.console"),
    ({"sinks": {"store": 1}}, "sinks.store"),
    ({"checkpoints": {"snapshot_dir": 3}}, "checkpoints.snapshot_dir"),
    ({"detectors": 3}, "detectors"),
    ({"detectors": {"loss_spike": {"ratio": 0.5}}}, "detectors.loss_spike.ratio"),
    ({"detectors": {"common": {"baseline_window": 2}}}, "detectors.common.baseline_window"),
    ({"recovery": {"rewind_schedule": "yes"}}, "recovery.rewind_schedule"),
    ({"recovery": {"jump_ratio": 1.0}}, "recovery.jump_ratio"),
    ({"recovery": {"jump_steps": -1}}, "recovery.jump_steps"),
])
def test_bad_values_name_the_full_dotted_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError, match="^" + field.replace(".", r"\.") + ":"):
        GuardConfig(**kwargs)


def test_unknown_policy_lists_the_choices() -> None:
    with pytest.raises(ConfigError, match="observe, protect, halt"):
        GuardConfig(policy="yolo")  # type: ignore[arg-type]


def test_detector_thresholds_are_validated() -> None:
    with pytest.raises(ConfigError, match=r"detectors\.loss_spike\.ratio"):
        DetectorConfig(loss_spike={"ratio": 1.0})
    with pytest.raises(ConfigError, match=r"detectors\.loss_spike\.ratio"):
        LossSpikeConfig(ratio=1.0)  # a section built alone names its place too
    with pytest.raises(ConfigError, match=r"detectors\.common\.warmup_steps"):
        DetectorConfig(common={"warmup_steps": -1})
    config = GuardConfig(detectors={"grad_explosion": {"ratio": 5.0}})
    assert config.detectors.grad_explosion.ratio == 5.0


def test_from_dict_rejects_unknown_fields() -> None:
    with pytest.raises(ConfigError, match="unknown field"):
        GuardConfig.from_dict({"polcy": "halt"})


@pytest.mark.parametrize("data, message", [
    ({"polcy": "halt", "policy": "halt"}, r"GuardConfig: unknown field\(s\) polcy"),
    ({"detectors": {"grad_explosion": {"ratoi": 3.0}}},
     r"detectors\.grad_explosion: unknown field\(s\) ratoi"),
    ({"detectors": {"grad_norm_ratoi": 3.0}}, r"detectors: unknown field\(s\) grad_norm_ratoi"),
    ({"recovery": {"ring_size": 2, "ringsize": 3}}, r"recovery: unknown field\(s\) ringsize"),
    ({"clip": {"rule": {"type": "layerwise", "limits": {}, "default": 1.0, "per_param": True}}},
     r"clip\.rule: unknown argument\(s\) per_param"),
    ({"clip": {"rule": {"type": "chain", "rules": [{"type": "global_norm", "max_norm": 1,
                                                     "norm_type": 2}]}}},
     r"clip\.rule\.rules\[0\]: unknown argument\(s\) norm_type"),
    ({"clip": {"agc": {"clipping": 0.01, "clip": 0.1}}}, r"clip\.agc: unknown argument\(s\) clip"),
])
def test_unknown_fields_are_named_at_every_level(data: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        GuardConfig.from_dict(data)


def test_from_dict_needs_a_mapping() -> None:
    with pytest.raises(ConfigError, match="expected a dict"):
        GuardConfig.from_dict([("policy", "halt")])  # type: ignore[arg-type]


def test_missing_fields_take_their_defaults() -> None:
    assert GuardConfig.from_dict({"policy": "halt",
                                  "detectors": {"common": {"warmup_steps": 3}}}) == (
        GuardConfig(policy="halt", detectors=DetectorConfig(common={"warmup_steps": 3})))


def test_an_older_config_with_rules_in_words_loads_without_them() -> None:
    stored = GuardConfig(policy="recover").to_dict()
    stored["clip_rule"] = "layer-wise (per group): '*attn*' <= 1, others <= 0.5"
    stored["agc"] = "AGC (unit-wise, clipping 0.01, eps 0.001)"
    config = GuardConfig.from_dict(stored)
    assert config.clip.rule is None and config.clip.agc is None
    assert config == GuardConfig(policy="recover")
    with pytest.raises(ConfigError, match=r"clip\.rule"):
        GuardConfig(clip={"rule": "layer-wise"})  # only stored configs get this leniency


# -- rule specs ------------------------------------------------------------------------------
@pytest.mark.parametrize("rule, spec", [
    (GlobalNormClip(2), {"type": "global_norm", "max_norm": 2.0}),
    (LayerwiseClip({"*attn*": 1.0}, default=0.5),
     {"type": "layerwise", "limits": {"*attn*": 1.0}, "default": 0.5, "per_parameter": False}),
    (LayerwiseClip({"a*": 1, "b*": 2}, per_parameter=True),
     {"type": "layerwise", "limits": {"a*": 1.0, "b*": 2.0}, "default": None,
      "per_parameter": True}),
    (AdaptiveClip(), {"type": "adaptive", "z_threshold": 2.5, "alpha": 0.97, "warmup_steps": 25,
                      "fallback_max_norm": 1.0}),
    (AdaptiveClip(3, 0.5, 4, None), {"type": "adaptive", "z_threshold": 3.0, "alpha": 0.5,
                                     "warmup_steps": 4, "fallback_max_norm": None}),
    (chain(GlobalNormClip(1.0), chain(AdaptiveClip(warmup_steps=2))),
     {"type": "chain", "rules": [
         {"type": "global_norm", "max_norm": 1.0},
         {"type": "chain", "rules": [{"type": "adaptive", "z_threshold": 2.5, "alpha": 0.97,
                                      "warmup_steps": 2, "fallback_max_norm": 1.0}]}]}),
    (HalvingClip(3.0, ["w"]), {"type": "custom", "class": "tests.test_config:HalvingClip",
                               "args": {"above": 3.0, "names": ["w"]}}),
    (TighterLayerwise({"x": 1.0}), {"type": "custom", "class": "tests.test_config:TighterLayerwise",
                                    "args": {"limits": {"x": 1.0}, "default": None,
                                             "per_parameter": False}}),
])
def test_every_rule_type_has_a_spec(rule: Any, spec: dict) -> None:
    assert rule_spec(rule) == spec
    assert rule_spec(spec) == spec
    if not isinstance(rule, (HalvingClip, TighterLayerwise)):
        assert rule.spec() == spec
    rebuilt = build_rule(spec)
    assert type(rebuilt) is type(rule)
    assert rule_spec(rebuilt) == spec
    json.dumps(spec)


def test_agc_spec_lists_every_argument() -> None:
    agc = AGC(0.02, 1e-4, unitwise=False, exclude=("lm_head.*",))
    spec = {"type": "agc", "clipping": 0.02, "eps": 1e-4, "unitwise": False,
            "exclude": ["lm_head.*"]}
    assert agc.spec() == spec == agc_spec(agc) == agc_spec(spec)
    rebuilt = build_agc(spec)
    assert rebuilt is not agc and rebuilt.exclude == ("lm_head.*",) and not rebuilt.unitwise
    assert agc_spec({})["exclude"] == ["*bias", "*norm*", "*Norm*", "*ln_*"]


def test_omitted_arguments_take_the_constructor_defaults() -> None:
    assert rule_spec({"type": "adaptive"}) == AdaptiveClip().spec()
    assert rule_spec({"type": "custom", "class": "tests.test_config:HalvingClip"}) == {
        "type": "custom", "class": "tests.test_config:HalvingClip", "args": {}}


def test_build_rule_returns_fresh_state() -> None:
    spec = rule_spec(AdaptiveClip(warmup_steps=3, fallback_max_norm=None))
    first, second = build_rule(spec), build_rule(spec)
    assert first is not second
    for norm in (1.0, 1.1, 0.9, 1.0):
        first.coefficients(np.array([norm]), norm, ["w"])
    assert first.warmed_up and first.state_dict()["mean"] is not None  # type: ignore[attr-defined]
    assert not second.warmed_up  # type: ignore[attr-defined]
    assert second.state_dict() == {"buffer": [], "mean": None, "var": None}
    # from a warm rule object too: its spec carries no statistics
    assert not build_rule(first).warmed_up  # type: ignore[attr-defined]


def test_a_chain_built_twice_shares_no_rule() -> None:
    spec = rule_spec(chain(GlobalNormClip(1.0), AdaptiveClip(warmup_steps=2)))
    first, second = build_rule(spec), build_rule(spec)
    assert isinstance(first, Chain) and isinstance(second, Chain)
    assert all(a is not b for a, b in zip(first.rules, second.rules, strict=True))
    for norm in (1.0, 2.0, 3.0):
        first.coefficients(np.array([norm]), norm, ["w"])
    assert first.state_dict() != second.state_dict()
    assert second.state_dict() == {"rules": [{}, {"buffer": [], "mean": None, "var": None}]}


def test_build_agc_returns_a_new_agc() -> None:
    agc = AGC(0.05)
    agc.included(["a.bias", "a.weight"])  # fills its name cache
    rebuilt = build_agc(agc)
    assert rebuilt is not agc and rebuilt._names_key is None
    assert rebuilt.spec() == agc.spec()


@pytest.mark.parametrize("spec, message", [
    ({"type": "zclip"}, r"clip_rule\.type: unknown rule type 'zclip'; choose one of "
                        r"global_norm, layerwise, adaptive, chain, custom"),
    ({"max_norm": 1.0}, r"clip_rule\.type: missing"),
    ({"type": "agc", "clipping": 0.1}, r"clip_rule\.type: 'agc' is not a clip rule"),
    ({"type": "global_norm"}, r"clip_rule\.max_norm: required"),
    ({"type": "global_norm", "max_norm": -2}, r"clip_rule: GlobalNormClip\.max_norm: must be a "
                                              r"finite number > 0, got -2"),
    ({"type": "layerwise", "limits": {"*attn*": "big"}},
     r"clip_rule: LayerwiseClip\.limits\['\*attn\*'\]: must be a finite number > 0, got 'big'"),
    ({"type": "layerwise", "limits": [["*attn*", 1.0]]}, r"clip_rule: LayerwiseClip\.limits"),
    ({"type": "adaptive", "warmup_steps": 2.5},
     r"clip_rule: AdaptiveClip\.warmup_steps: .* got 2\.5"),
    ({"type": "adaptive", "alpha": 1.5}, r"clip_rule: AdaptiveClip\.alpha: .* got 1\.5"),
    ({"type": "chain"}, r"clip_rule\.rules: required"),
    ({"type": "chain", "rules": []}, r"clip_rule\.rules: give at least one clip rule"),
    ({"type": "chain", "rules": {"type": "global_norm", "max_norm": 1}},
     r"clip_rule\.rules: must be a list of clip rule specs, got dict"),
    ({"type": "chain", "rules": [{"type": "global_norm", "max_norm": 1}, 0.5]},
     r"clip_rule\.rules\[1\]: must be a trainguard\.remedies clipping rule or its spec dict, "
     r"got float 0\.5"),
    ({"type": "chain", "rules": [{"type": "chain", "rules": [{"type": "adaptive",
                                                                "alpha": 0}]}]},
     r"clip_rule\.rules\[0\]\.rules\[0\]: AdaptiveClip\.alpha: .* got 0"),
    ({"type": "chain", "rules": [{"type": "agc"}]}, r"clip_rule\.rules\[0\]\.type: 'agc'"),
    ({"type": "custom"}, r"clip_rule\.class: required"),
    ({"type": "custom", "class": "HalvingClip"}, r"clip_rule\.class: must be an import path "
                                                 r"'module:QualName'.*got 'HalvingClip'"),
    ({"type": "custom", "class": "tests.test_config:HalvingClip", "args": [1.0]},
     r"clip_rule\.args: must be a dict"),
    ({"type": "custom", "class": "tests.test_config:HalvingClip", "args": {"above": {1, 2}}},
     r"clip_rule\.args\.above: set .* is not plain data"),
    ({"type": "custom", "class": "tests.test_config:HalvingClip", "kwargs": {}},
     r"clip_rule: unknown argument\(s\) kwargs"),
    ("layerwise", r"clip_rule: must be a trainguard\.remedies clipping rule or its spec dict, "
                  r"got str 'layerwise'"),
    (NotARule(), r"clip_rule: must be a trainguard\.remedies clipping rule"),
])
def test_bad_rule_specs_name_the_field_and_value(spec: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        rule_spec(spec)
    with pytest.raises(ConfigError, match=r"clip\.rule" + message.removeprefix("clip_rule")):
        GuardConfig(clip={"rule": spec})


@pytest.mark.parametrize("spec, message", [
    ({"type": "layerwise", "limits": {}, "default": 1.0}, r"agc\.type: must be 'agc', got "
                                                          r"'layerwise' \(a clip rule"),
    ({"clipping": 0}, r"agc: AGC\.clipping: must be a finite number > 0, got 0"),
    ({"exclude": "*bias"}, r"agc: AGC\.exclude: must be a sequence"),
    ({"unitwise": "yes"}, r"agc: AGC\.unitwise: must be True or False, got 'yes'"),
    ({"clip": 0.1}, r"agc: unknown argument\(s\) clip"),
    (0.01, r"agc: must be a trainguard\.remedies\.AGC or its spec dict, got float 0\.01"),
    (GlobalNormClip(1.0), r"agc: must be a trainguard\.remedies\.AGC"),
])
def test_bad_agc_specs_name_the_field_and_value(spec: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        agc_spec(spec)
    with pytest.raises(ConfigError, match=r"clip\." + message):
        GuardConfig(clip={"agc": spec})


def test_a_rule_object_in_a_chain_spec_is_specced() -> None:
    spec = {"type": "chain", "rules": [GlobalNormClip(1.0), {"type": "adaptive"}]}
    assert rule_spec(spec) == rule_spec(chain(GlobalNormClip(1.0), AdaptiveClip()))
    built = Chain([{"type": "global_norm", "max_norm": 1.0}, AdaptiveClip()])
    assert rule_spec(built) == rule_spec(spec)
    with pytest.raises(ConfigError, match=r"chain\.rules\[0\]\.type: unknown rule type"):
        Chain([{"type": "nope"}])


# -- user rules ------------------------------------------------------------------------------
def test_a_user_rule_with_a_spec_is_stored_by_import_path_and_rebuilt() -> None:
    config = GuardConfig(clip={"rule": chain(HalvingClip(above=2.0), GlobalNormClip(1.0))})
    restored = _roundtrip(config)
    assert restored == config
    rule = build_rule(restored.clip.rule)  # type: ignore[arg-type]
    assert isinstance(rule, Chain) and isinstance(rule.rules[0], HalvingClip)
    assert rule.rules[0].above == 2.0
    norms = np.array([3.0, 1.0])
    assert np.array_equal(rule.rules[0].coefficients(norms, 3.2, ["a", "b"]), [0.5, 1.0])


def test_a_subclass_of_a_trainguard_rule_is_rebuilt_as_the_subclass() -> None:
    rule = build_rule(TighterLayerwise({"*attn*": 0.1}, default=1.0))
    assert type(rule) is TighterLayerwise
    assert rule.limits == {"*attn*": 0.1} and rule.default == 1.0


def test_a_user_rule_without_spec_is_refused_with_a_way_out() -> None:
    with pytest.raises(ConfigError, match=r"clip\.rule: SpeclessClip .* has no "
                                          r"spec\(\); give it a spec\(\) method"):
        GuardConfig(clip={"rule": SpeclessClip()})
    with pytest.raises(ConfigError, match=r"clip\.rule\.rules\[1\]: SpeclessClip"):
        GuardConfig(clip={"rule": chain(GlobalNormClip(1.0), SpeclessClip())})


def test_a_user_rule_defined_in_a_function_is_refused() -> None:
    class Local(HalvingClip):
        pass

    with pytest.raises(ConfigError, match="defined inside a function"):
        rule_spec(Local())


def test_a_user_rule_spec_must_be_plain_data() -> None:
    class Holder:
        pass

    with pytest.raises(ConfigError, match=r"clip_rule\.args\.names\[0\]: Holder"):
        rule_spec(HalvingClip(names=[Holder()]))  # type: ignore[list-item]
    # numpy scalars and tuples become plain numbers and lists
    spec = rule_spec(HalvingClip(above=np.float32(2.0), names=("a",)))  # type: ignore[arg-type]
    assert spec["args"] == {"above": 2.0, "names": ["a"]}
    assert type(spec["args"]["above"]) is float


@pytest.mark.parametrize("spec, message", [
    ({"class": "tests.no_such_module:Rule"}, r"clip_rule\.class: cannot import "
                                             r"'tests\.no_such_module:Rule' \(ModuleNotFound"),
    ({"class": "tests.test_config:Nope"}, r"clip_rule\.class: cannot import .*AttributeError"),
    ({"class": "tests.test_config:HalvingClip", "args": {"below": 1.0}},
     r"clip_rule\.args: tests\.test_config:HalvingClip does not accept \{'below': 1\.0\}"),
    ({"class": "tests.test_config:NotARule"}, r"clip_rule\.class: .* did not build a clip rule"),
    ({"class": "math:pi"}, r"clip_rule\.class: 'math:pi' is not a class"),
])
def test_a_custom_rule_that_cannot_be_built_is_a_config_error(spec: dict,
                                                              message: str) -> None:
    spec = {"type": "custom", **spec}
    assert GuardConfig(clip={"rule": spec}).clip.rule is not None  # stored without importing it
    with pytest.raises(ConfigError, match=message):
        build_rule(spec)


def test_a_stored_custom_rule_loads_without_its_code() -> None:
    stored = {"clip": {"rule": {"type": "custom", "class": "someone_elses.package:Rule",
                                "args": {"limit": 1.0}}}}
    config = GuardConfig.from_dict(stored)
    assert config.to_dict()["clip"]["rule"] == stored["clip"]["rule"]


def test_specs_are_not_shared_with_what_was_given() -> None:
    limits = {"*attn*": 1.0}
    given: Mapping[str, Any] = {"type": "layerwise", "limits": limits}
    config = GuardConfig(clip={"rule": given})
    limits["*attn*"] = 5.0
    assert config.clip.rule["limits"] == {"*attn*": 1.0}  # type: ignore[index]
    rule = build_rule(config.clip.rule)  # type: ignore[arg-type]
    assert math.isclose(rule.limits["*attn*"], 1.0)  # type: ignore[attr-defined]


# -- sections and the flat names of the version before them ------------------------------------
def test_a_section_may_be_given_as_its_type_or_as_a_dict() -> None:
    by_dict = GuardConfig(clip={"max_grad_norm": 1.0}, detectors={"loss_spike": {"ratio": 3.0}})
    by_type = GuardConfig(clip=ClipConfig(max_grad_norm=1.0),
                          detectors=DetectorConfig(loss_spike=LossSpikeConfig(ratio=3.0)))
    assert by_dict == by_type
    assert isinstance(by_dict.clip, ClipConfig)
    assert isinstance(by_dict.detectors.loss_spike, LossSpikeConfig)


def test_flat_names_are_accepted_with_a_warning_naming_their_place() -> None:
    with pytest.warns(DeprecationWarning, match=r"max_grad_norm -> clip\.max_grad_norm") as seen:
        config = GuardConfig(max_grad_norm=1.0, console=False, prove="on",
                             recovery=RecoveryConfig(ring_size=5), halt_severity="critical")
    assert len(seen) == 1 and "prove -> prove.mode" in str(seen[0].message)
    assert config == GuardConfig(clip={"max_grad_norm": 1.0}, sinks={"console": False},
                                 prove={"mode": "on"},
                                 recovery={"ring_size": 5, "halt_severity": "critical"})
    with pytest.warns(DeprecationWarning, match=r"loss_spike_ratio -> loss_spike\.ratio"):
        detectors = DetectorConfig(loss_spike_ratio=3.0, warmup_steps=3,
                                   loss_spike={"zscore": 4.0})
    assert detectors == DetectorConfig(loss_spike={"ratio": 3.0, "zscore": 4.0},
                                       common={"warmup_steps": 3})
    with pytest.warns(DeprecationWarning, match=r"grad_norm_ratio -> grad_explosion\.ratio"):
        nested = GuardConfig(detectors={"grad_norm_ratio": 4.0})
    assert nested.detectors.grad_explosion.ratio == 4.0


def test_a_flat_name_keeps_its_validation_under_its_new_name() -> None:
    with pytest.warns(DeprecationWarning), pytest.raises(ConfigError,
                                                         match=r"^clip\.max_grad_norm"):
        GuardConfig(max_grad_norm=-1.0)


def test_every_flat_name_has_a_place_that_exists() -> None:
    for moves, container in ((GUARD_FLAT_NAMES, GuardConfig()),
                             (DETECTOR_FLAT_NAMES, DetectorConfig())):
        for flat, (section, name) in moves.items():
            assert hasattr(getattr(container, section), name), flat


def test_new_configs_give_no_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for config in CONFIGS.values():
            GuardConfig.from_dict(config.to_dict())


def test_a_config_stored_flat_by_an_older_version_still_loads() -> None:
    stored = json.loads((pathlib.Path(__file__).parent / "fixtures"
                         / "guard_config_flat.json").read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # reading a store is not the user's code: no warning
        config = GuardConfig.from_dict(stored)
    assert config == GuardConfig(
        policy="halt", clip={"max_grad_norm": 1.0, "rule": {"type": "layerwise",
                                                            "limits": {"*attn*": 1.0}}},
        probes={"sample_every": 7, "activations": False},
        prove={"mode": "on", "budget_steps": 5.0},
        recovery={"halt_severity": "critical", "ring_size": 5},
        sinks={"console": False, "store": False}, distributed={"desync_every": 11},
        checkpoints={"block_poisoned": True},
        detectors={"grad_explosion": {"ratio": 5.0}, "loss_spike": {"ratio": 3.0},
                   "common": {"warmup_steps": 3}, "instability_precursor": {"warmup": 40},
                   "attention_logits": {"every": 2}, "dead_units": {"spread": 0.01}})
    assert GuardConfig.from_dict(config.to_dict()) == config
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # `trainguard analyze` reads a store's detectors alone
        assert DetectorConfig.from_dict(stored["detectors"]) == config.detectors
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # `trainguard analyze` reads a store's detectors alone
        assert DetectorConfig.from_dict(stored["detectors"]) == config.detectors
