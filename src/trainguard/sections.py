"""The machinery of typed configuration sections.

A section is a small dataclass (`ClipConfig`, `LossSpikeConfig`). Its class variable `PATH` is
where it sits in a `GuardConfig` ("detectors.loss_spike"), so that a bad value is named by its full
dotted field ("detectors.loss_spike.ratio: must be a finite number > 1, got 0.5") wherever the
section was built. A section may
be given as its type or as a plain dict (`section`), and a container of sections accepts the flat
names of the version before them with a DeprecationWarning (`accept_flat_names`).

Imports nothing of trainguard but its errors, so that every section's module can use it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from trainguard.errors import ConfigError

T = TypeVar("T")


def where(config: Any, name: str) -> str:
    """The full dotted name of a section's field."""
    path = getattr(config, "PATH", "")
    return f"{path}.{name}" if path else name


def require(condition: bool, name: str, message: str) -> None:
    if not condition:
        raise ConfigError(f"{name}: {message}")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def positive(config: Any, *names: str) -> None:
    """Each field a finite number > 0."""
    for name in names:
        value = getattr(config, name)
        require(_number(value) and value > 0, where(config, name),
                f"must be a finite number > 0, got {value!r}")


def above_one(config: Any, *names: str) -> None:
    """Each field a finite number > 1 (a ratio that must exceed the level it compares with)."""
    for name in names:
        value = getattr(config, name)
        require(_number(value) and value > 1, where(config, name),
                f"must be a finite number > 1, got {value!r}")


def share(config: Any, *names: str) -> None:
    """Each field a share: a finite number in (0, 1]."""
    for name in names:
        value = getattr(config, name)
        require(_number(value) and 0 < value <= 1, where(config, name),
                f"must be a finite number > 0 and <= 1, got {value!r}")


def at_least(config: Any, minimum: int, *names: str) -> None:
    """Each field an integer >= minimum."""
    for name in names:
        value = getattr(config, name)
        require(isinstance(value, int) and not isinstance(value, bool) and value >= minimum,
                where(config, name), f"must be an integer >= {minimum}, got {value!r}")


def flag(config: Any, *names: str) -> None:
    """Each field True or False: a hand-edited "false" would otherwise be truthy."""
    for name in names:
        value = getattr(config, name)
        require(isinstance(value, bool), where(config, name),
                f"must be True or False, got {value!r}")


def section(cls: type[T], value: Any, name: str) -> T:
    """A section given as its type, or as a dict of its fields (unknown ones named)."""
    if isinstance(value, cls):
        return value
    if not isinstance(value, Mapping):
        raise ConfigError(f"{name}: must be a {cls.__name__} or a dict of its fields, got "
                          f"{type(value).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    known |= set(getattr(cls, "FLAT_NAMES", ()))  # taken, with a warning, by the class
    unknown = sorted(str(k) for k in set(value) - known)
    if unknown:
        raise ConfigError(f"{name}: unknown field(s) {', '.join(unknown)}")
    return cls(**value)


def move_flat_names(values: Mapping[str, Any], moves: Mapping[str, tuple[str, str]],
                    fields: set[str]) -> dict[str, Any]:
    """`values` with each flat name of `moves` put in its section (`name -> (section, field)`).

    A name that is also a field keeps its value unless that value is no section (the flat
    `prove="on"` of `prove`, now a section). A section already given keeps what it holds
    besides the moved fields."""
    out: dict[str, Any] = {}
    moved: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        if is_flat(key, value, moves, fields):
            target, leaf = moves[key]
            moved.setdefault(target, {})[leaf] = value
        else:
            out[key] = value
    for target, overrides in moved.items():
        given = out.get(target)
        if dataclasses.is_dataclass(given) and not isinstance(given, type):
            out[target] = dataclasses.replace(given, **overrides)
        elif isinstance(given, Mapping):
            out[target] = {**given, **overrides}
        else:
            out[target] = overrides
    return out


def is_flat(key: str, value: Any, moves: Mapping[str, tuple[str, str]], fields: set[str]) -> bool:
    if key not in moves:
        return False
    return key not in fields or not (isinstance(value, Mapping) or dataclasses.is_dataclass(value))


def accept_flat_names(moves: Mapping[str, tuple[str, str]]) -> Callable[[type[T]], type[T]]:
    """A class decorator: the dataclass's keywords also take the flat names of `moves`, with a
    DeprecationWarning naming each one's new place. They are kept for one release, so that code
    written against the flat configuration runs unchanged meanwhile."""

    def decorate(cls: type[T]) -> type[T]:
        init = cls.__init__
        fields = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]

        def __init__(self: Any, **kwargs: Any) -> None:
            flat = [k for k, v in kwargs.items() if is_flat(k, v, moves, fields)]
            if flat:
                renamed = ", ".join(f"{k} -> {'.'.join(moves[k])}" for k in flat)
                warnings.warn(f"{cls.__name__}: flat field names are deprecated and will be "
                              f"removed in the next release; use the sections ({renamed})",
                              DeprecationWarning, stacklevel=2)
                kwargs = move_flat_names(kwargs, moves, fields)
            init(self, **kwargs)

        functools.update_wrapper(__init__, init)  # its signature stays the dataclass's
        cls.FLAT_NAMES = dict(moves)  # type: ignore[attr-defined]
        cls.__init__ = __init__  # type: ignore[method-assign]
        return cls

    return decorate


def build_sections(config: Any) -> None:
    """Each section field of `config` built from a dict if given as one, and checked to be of
    its type (a wrong type is named by its dotted field)."""
    for f in dataclasses.fields(config):
        kind = section_type(f)
        if kind is None:
            continue
        name = where(config, f.name)
        setattr(config, f.name, section(kind, getattr(config, f.name), name))


def section_type(f: dataclasses.Field[Any]) -> type | None:
    factory = f.default_factory
    if factory is dataclasses.MISSING or not isinstance(factory, type):
        return None
    return factory if dataclasses.is_dataclass(factory) else None
