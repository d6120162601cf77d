"""Rule specs: clipping rules and AGC as plain data, and fresh rules built from them; `Chain`,
the rule made of rules, lives here because it is built from specs and stored as one.

A `GuardConfig` holds only plain data, so it stores each rule as its spec, a JSON-able dict with
a "type" key; the runtime builds the live rule (and its state, such as AdaptiveClip's EMA) from
it with `build_rule` / `build_agc`:

    {"type": "global_norm", "max_norm": 1.0}
    {"type": "layerwise", "limits": {"*attn*": 1.0}, "default": 0.5, "per_parameter": False}
    {"type": "adaptive", "z_threshold": 2.5, "alpha": 0.97, "warmup_steps": 25,
     "fallback_max_norm": 1.0}
    {"type": "chain", "rules": [<spec>, <spec>, ...]}
    {"type": "custom", "class": "my_package.rules:MyClip", "args": {...}}
    {"type": "agc", "clipping": 0.01, "eps": 0.001, "unitwise": True, "exclude": [...]}

A spec names the constructor's keyword arguments; omitted ones take the constructor's defaults,
and `rule_spec` / `agc_spec` fill them in, so equal rules have equal specs.

Rules of your own: a class that implements the `ClipRule` protocol can be stored too if it has a
`spec()` method returning the keyword arguments its constructor takes, as plain data (numbers,
strings, booleans, None, lists, dicts). It is stored as a "custom" spec naming the class by
import path and rebuilt as `MyClip(**args)`; the class must be importable (defined at module
level), and it is imported only when the rule is built, so a stored config can be read without
it. A rule without `spec()` is refused with a `ConfigError` rather than kept as an object: a
config holding a live rule would carry that rule's state and could not be stored or compared.
Subclasses of trainguard's rules are custom rules too (so that the subclass is what gets rebuilt);
the `spec()` they inherit fits as long as they keep the constructor's arguments.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from trainguard.errors import ConfigError, UsageError
from trainguard.remedies.adaptive import AdaptiveClip
from trainguard.remedies.agc import AGC
from trainguard.remedies.layerwise import LayerwiseClip
from trainguard.remedies.rules import ClipRule, GlobalNormClip, check_norms

RuleLike = Mapping[str, Any] | ClipRule
AgcLike = Mapping[str, Any] | AGC

_BUILTIN: dict[str, type] = {"global_norm": GlobalNormClip, "layerwise": LayerwiseClip,
                             "adaptive": AdaptiveClip}
RULE_TYPES: tuple[str, ...] = (*_BUILTIN, "chain", "custom")
"""The "type" of every clip rule spec."""

_IMPORT_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def rule_spec(rule: RuleLike, *, where: str = "clip_rule") -> dict[str, Any]:
    """The validated, complete spec of a clip rule given as a rule object or a spec dict.

    Raises `ConfigError` naming the offending field (prefixed by `where`) and its value for an
    unknown type, unknown or missing arguments, bad values, or a wrong nesting.
    """
    if isinstance(rule, Mapping):
        return _canonical_rule(rule, where)
    if not isinstance(rule, ClipRule):
        raise ConfigError(f"{where}: must be a trainguard.remedies clipping rule or its spec "
                          f"dict, got {type(rule).__name__} {rule!r:.80}")
    if type(rule) is Chain:  # its rules are specced here, so an error names their position
        return _canonical_rule({"type": "chain", "rules": list(rule.rules)}, where)
    if type(rule) in _BUILTIN.values():
        return _canonical_rule(rule.spec(), where)  # type: ignore[attr-defined]
    return _custom_from_object(rule, where)


def build_rule(rule: RuleLike, *, where: str = "clip_rule") -> ClipRule:
    """A fresh rule (fresh state: e.g. a cold AdaptiveClip) from a spec dict or a rule's spec.

    A rule object is never returned as is: the result shares no state with it."""
    return _build_rule(rule_spec(rule, where=where), where)


def agc_spec(agc: AgcLike, *, where: str = "agc") -> dict[str, Any]:
    """The validated, complete spec of AGC given as an `AGC` object or a spec dict ("type"
    may be left out: there is one kind)."""
    if isinstance(agc, Mapping):
        spec = dict(agc)
        kind = spec.pop("type", "agc")
        if kind != "agc":
            hint = (" (a clip rule: it goes in clip_rule)" if kind in RULE_TYPES else "")
            raise ConfigError(f"{where}.type: must be 'agc', got {kind!r}{hint}")
        return _construct(AGC, spec, where).spec()
    if type(agc) is AGC:
        return agc_spec(agc.spec(), where=where)
    if isinstance(agc, AGC):  # rebuilding it from a spec would lose what the subclass changes
        raise ConfigError(f"{where}: subclasses of AGC cannot be stored as a spec, got "
                          f"{type(agc).__name__}")
    raise ConfigError(f"{where}: must be a trainguard.remedies.AGC or its spec dict, got "
                      f"{type(agc).__name__} {agc!r:.80}")


def build_agc(agc: AgcLike, *, where: str = "agc") -> AGC:
    """A fresh `AGC` from a spec dict or an AGC's spec."""
    spec = agc_spec(agc, where=where)
    del spec["type"]
    return AGC(**spec)


# -- specs -----------------------------------------------------------------------------------
def _canonical_rule(spec: Mapping[str, Any], where: str) -> dict[str, Any]:
    kind = _rule_type(spec, where)
    if kind == "chain":
        _check_keys(spec, {"type", "rules"}, {"rules"}, where, kind)
        rules = spec["rules"]
        if isinstance(rules, (str, bytes, Mapping)) or not isinstance(rules, (list, tuple)):
            raise ConfigError(f"{where}.rules: must be a list of clip rule specs, got "
                              f"{type(rules).__name__} {rules!r:.80}")
        if not rules:
            raise ConfigError(f"{where}.rules: give at least one clip rule")
        return {"type": "chain",
                "rules": [rule_spec(r, where=f"{where}.rules[{i}]") for i, r in enumerate(rules)]}
    if kind == "custom":
        _check_keys(spec, {"type", "class", "args"}, {"class"}, where, kind)
        path = spec["class"]
        if not isinstance(path, str) or not _IMPORT_PATH.fullmatch(path):
            raise ConfigError(f"{where}.class: must be an import path 'module:QualName' "
                              f"(e.g. 'my_package.rules:MyClip'), got {path!r}")
        args = spec.get("args", {})
        if not isinstance(args, Mapping):
            raise ConfigError(f"{where}.args: must be a dict of constructor keyword arguments, "
                              f"got {type(args).__name__} {args!r:.80}")
        return {"type": "custom", "class": path, "args": _plain(args, f"{where}.args")}
    args = {k: v for k, v in spec.items() if k != "type"}
    return _construct(_BUILTIN[kind], args, where, kind).spec()


def _rule_type(spec: Mapping[str, Any], where: str) -> str:
    if "type" not in spec:
        raise ConfigError(f"{where}.type: missing; choose one of {', '.join(RULE_TYPES)}")
    kind = spec["type"]
    if kind == "agc":
        raise ConfigError(f"{where}.type: 'agc' is not a clip rule; it goes in the agc field")
    if kind not in RULE_TYPES:
        raise ConfigError(f"{where}.type: unknown rule type {kind!r}; choose one of "
                          f"{', '.join(RULE_TYPES)}")
    return str(kind)


def _check_keys(spec: Mapping[str, Any], allowed: set[str], required: set[str], where: str,
                kind: str) -> None:
    unknown = sorted(str(k) for k in set(spec) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown argument(s) {', '.join(unknown)} for a {kind!r} "
                          f"spec (expected {', '.join(sorted(allowed - {'type'}))})")
    missing = sorted(required - set(spec))
    if missing:
        raise ConfigError(f"{where}.{missing[0]}: required for a {kind!r} spec")


def _construct(cls: type, args: Mapping[str, Any], where: str, kind: str = "agc") -> Any:
    """`cls(**args)` for one of trainguard's rules, with errors that name `where`."""
    params = inspect.signature(cls).parameters
    required = {n for n, p in params.items() if p.default is inspect.Parameter.empty}
    _check_keys({"type": kind, **args}, {"type", *params}, required, where, kind)
    try:
        return cls(**args)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _custom_from_object(rule: ClipRule, where: str) -> dict[str, Any]:
    cls = type(rule)
    name = cls.__name__
    spec_method = getattr(rule, "spec", None)
    if not callable(spec_method):
        raise ConfigError(
            f"{where}: {name} is not one of trainguard's rules and has no spec(); give it a "
            f"spec() method returning its constructor's keyword arguments as plain data, so "
            f"the config can store it and the Guard can build a fresh one")
    if "<locals>" in cls.__qualname__:
        raise ConfigError(f"{where}: {name} is defined inside a function; define it at module "
                          f"level so that it can be imported when the rule is built")
    args = spec_method()
    if not isinstance(args, Mapping):
        raise ConfigError(f"{where}: {name}.spec() must return a dict of constructor keyword "
                          f"arguments, got {type(args).__name__}")
    # what a subclass of trainguard's rules inherits carries the base "type": not an argument
    args = {k: v for k, v in args.items() if k != "type"}
    return _canonical_rule({"type": "custom", "class": f"{cls.__module__}:{cls.__qualname__}",
                            "args": args}, where)


def _plain(value: Any, where: str) -> Any:
    """A copy of `value` as JSON-able data (tuples become lists), or a ConfigError."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (np.bool_, np.integer, np.floating)):
        return value.item()
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ConfigError(f"{where}: keys must be strings, got {key!r}")
            out[key] = _plain(item, f"{where}.{key}")
        return out
    if isinstance(value, (list, tuple)):
        return [_plain(item, f"{where}[{i}]") for i, item in enumerate(value)]
    raise ConfigError(f"{where}: {type(value).__name__} {value!r:.80} is not plain data (use "
                      f"numbers, strings, booleans, None, lists and dicts)")


# -- building --------------------------------------------------------------------------------
def _build_rule(spec: dict[str, Any], where: str) -> ClipRule:
    """A rule from a spec already made canonical by `rule_spec`."""
    kind = spec["type"]
    if kind == "chain":
        return Chain([_build_rule(r, f"{where}.rules[{i}]") for i, r in enumerate(spec["rules"])])
    if kind == "custom":
        return _build_custom(spec, where)
    args = {k: v for k, v in spec.items() if k != "type"}
    return _BUILTIN[kind](**args)


def _build_custom(spec: dict[str, Any], where: str) -> ClipRule:
    path = spec["class"]
    factory = _import(path, where)
    try:
        rule = factory(**spec["args"])
    except (TypeError, ValueError, ConfigError) as exc:
        raise ConfigError(f"{where}.args: {path} does not accept {spec['args']!r:.200} "
                          f"({type(exc).__name__}: {exc})") from None
    if not isinstance(rule, ClipRule):
        raise ConfigError(f"{where}.class: {path} did not build a clip rule (coefficients, "
                          f"state_dict, load_state_dict, describe), got {type(rule).__name__}")
    return rule


def _import(path: str, where: str) -> Callable[..., Any]:
    module_name, _, qualname = path.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{where}.class: cannot import {path!r} ({type(exc).__name__}: "
                          f"{exc})") from None
    if not callable(target):
        raise ConfigError(f"{where}.class: {path!r} is not a class")
    return target


class Chain:
    """Rules applied in order; each sees the norms already scaled by the ones before it.

    A rule may also be given as its spec dict (`build_rule` makes it)."""

    def __init__(self, rules: Sequence[ClipRule | Mapping[str, Any]]) -> None:
        if not rules:
            raise ConfigError("chain: give at least one clip rule")
        if any(isinstance(rule, Mapping) for rule in rules):
            rules = [build_rule(rule, where=f"chain.rules[{i}]") if isinstance(rule, Mapping)
                     else rule for i, rule in enumerate(rules)]
        for i, rule in enumerate(rules):
            if not isinstance(rule, ClipRule):
                raise ConfigError(f"chain: rule {i} must be a clip rule (with coefficients, "
                                  f"state_dict, load_state_dict, describe), got "
                                  f"{type(rule).__name__}")
        self.rules: tuple[ClipRule, ...] = tuple(rules)  # type: ignore[arg-type]

    def coefficients(self, norms: np.ndarray, global_norm: float,
                     names: Sequence[str]) -> np.ndarray:
        norms = check_norms(norms, names)
        total = np.ones(norms.shape[0])
        for i, rule in enumerate(self.rules):
            if i > 0:
                # the next rule sees the gradients as the previous rules left them
                with np.errstate(invalid="ignore", over="ignore"):
                    scaled = norms.astype(np.float64) * total
                    global_norm = float(np.sqrt(np.sum(np.square(scaled))))
                norms = scaled
            total = total * rule.coefficients(norms, global_norm, names)
        return total

    def state_dict(self) -> dict[str, Any]:
        return {"rules": [rule.state_dict() for rule in self.rules]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        states = state.get("rules") if isinstance(state, Mapping) else None
        if not isinstance(states, list) or len(states) != len(self.rules):
            raise UsageError(f"chain.load_state_dict: expected {{'rules': [...]}} with "
                             f"{len(self.rules)} entries, got {state!r:.200}")
        for rule, rule_state in zip(self.rules, states, strict=True):
            rule.load_state_dict(rule_state)

    def spec(self) -> dict[str, Any]:
        return {"type": "chain", "rules": [rule_spec(rule, where=f"chain.rules[{i}]")
                                           for i, rule in enumerate(self.rules)]}

    def describe(self) -> str:
        return " -> ".join(rule.describe() for rule in self.rules)


def chain(*rules: ClipRule) -> Chain:
    """Compose clip rules: `chain(LayerwiseClip(...), GlobalNormClip(1.0))`."""
    return Chain(rules)
