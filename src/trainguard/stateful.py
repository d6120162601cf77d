"""`Stateful`: what every piece of a run's state implements, so that none is forgotten.

Each component that keeps state across steps (the detectors' baselines, the adaptive clip, the
clip rule, metric collapse, the batch watch, the sampling schedule, recovery's judgement and LR
backoff) is registered under a stable key in `RunState.components()`; `gather` and `restore`
walk that one list for checkpoints, resumed jobs and rollbacks alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def gather(components: Mapping[str, Stateful | None]) -> dict[str, Any]:
    """Every present component's state under its key."""
    return {key: c.state_dict() for key, c in components.items() if c is not None}


def restore(components: Mapping[str, Stateful | None], state: Mapping[str, Any]) -> None:
    """Load each component's entry; a key the state lacks (a checkpoint written before the
    component kept state) leaves the component as it is, fresh on a resumed job."""
    for key, component in components.items():
        if component is not None and isinstance(state.get(key), Mapping):
            component.load_state_dict(dict(state[key]))
