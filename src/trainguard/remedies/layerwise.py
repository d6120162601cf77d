"""Layer-wise clipping: a norm limit per group of parameters, chosen by name pattern.

    LayerwiseClip({"*attn*": 1.0}, default=0.5)

clips the joint gradient norm of the attention parameters to 1.0 and that of all other
parameters to 0.5. A parameter belongs to the first pattern (fnmatch-style, case-sensitive) that
matches its name; unmatched parameters use `default`, or are left alone when it is None. With
`per_parameter=True` each parameter is clipped on its own to its pattern's limit.

Group norms come from the norms the Guard already measured (sqrt of the sum of the squared
member norms): no second pass over the gradients.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any

import numpy as np

from trainguard.errors import ConfigError
from trainguard.remedies.rules import (
    StatelessRule,
    check_limit,
    check_norms,
    clip_factors,
    group_norms,
)

log = logging.getLogger("trainguard")

UNTOUCHED = -1


class LayerwiseClip(StatelessRule):
    def __init__(self, limits: Mapping[str, float], default: float | None = None, *,
                 per_parameter: bool = False) -> None:
        if not isinstance(limits, Mapping):
            raise ConfigError(f"LayerwiseClip.limits: must be a mapping of name pattern to norm "
                              f"limit (e.g. {{'*attn*': 1.0}}), got {type(limits).__name__}")
        patterns: list[str] = []
        values: list[float] = []
        for pattern, limit in limits.items():
            if not isinstance(pattern, str) or not pattern:
                raise ConfigError(f"LayerwiseClip.limits: each pattern must be a non-empty "
                                  f"string, got {pattern!r}")
            patterns.append(pattern)
            values.append(check_limit(limit, f"LayerwiseClip.limits[{pattern!r}]"))
        if default is not None:
            default = check_limit(default, "LayerwiseClip.default")
        elif not patterns:
            raise ConfigError("LayerwiseClip: no pattern and default=None would clip nothing; "
                              "give limits such as {'*attn*': 1.0} or a default limit")
        if not isinstance(per_parameter, bool):
            raise ConfigError(f"LayerwiseClip.per_parameter: must be True or False, got "
                              f"{per_parameter!r}")
        self.patterns = tuple(patterns)
        self.default = default
        self.per_parameter = per_parameter
        # group k < len(patterns) is pattern k; group len(patterns) holds the unmatched ones
        self._group_limits = np.array([*values, default if default is not None else np.inf])
        self._names_key: tuple[str, ...] | None = None
        self._groups = np.zeros(0, dtype=np.int64)

    @property
    def limits(self) -> dict[str, float]:
        return dict(zip(self.patterns, self._group_limits.tolist(), strict=False))

    def groups(self, names: Sequence[str]) -> np.ndarray:
        """Group index of each parameter (-1: left alone); cached for the last names list."""
        key = tuple(names)  # compared by content: a list edited in place is not served stale
        if key != self._names_key:
            self._groups = self._assign(key)
            self._names_key = key
        return self._groups

    def _assign(self, names: tuple[str, ...]) -> np.ndarray:
        unmatched = UNTOUCHED if self.default is None else len(self.patterns)
        groups = np.full(len(names), unmatched, dtype=np.int64)
        for i, name in enumerate(names):
            for k, pattern in enumerate(self.patterns):
                if fnmatchcase(name, pattern):
                    groups[i] = k
                    break
        unused = [p for k, p in enumerate(self.patterns) if not np.any(groups == k)]
        if unused:  # most often a typo in the pattern: say so once per parameter list
            log.warning("trainguard: layer-wise clip patterns %s match no parameter name "
                        "(e.g. %r)", unused, names[0] if names else "")
        return groups

    def coefficients(self, norms: np.ndarray, global_norm: float,
                     names: Sequence[str]) -> np.ndarray:
        norms = check_norms(norms, names)
        groups = self.groups(names)
        coefs = np.ones(norms.shape[0])
        touched = groups != UNTOUCHED
        if not touched.any():
            return coefs
        member_groups = groups[touched]
        if self.per_parameter:
            coefs[touched] = clip_factors(norms[touched], self._group_limits[member_groups])
        else:
            joint = group_norms(norms[touched], member_groups, len(self._group_limits))
            coefs[touched] = clip_factors(joint, self._group_limits)[member_groups]
        return coefs

    def spec(self) -> dict[str, Any]:
        return {"type": "layerwise", "limits": self.limits, "default": self.default,
                "per_parameter": self.per_parameter}

    def describe(self) -> str:
        parts = [f"{p!r} <= {limit:g}" for p, limit in self.limits.items()]
        parts.append("others untouched" if self.default is None else
                     f"others <= {self.default:g}")
        scope = "each parameter" if self.per_parameter else "per group"
        return f"layer-wise ({scope}): " + ", ".join(parts)

    def __repr__(self) -> str:
        return (f"LayerwiseClip({self.limits!r}, default={self.default!r}, "
                f"per_parameter={self.per_parameter})")
