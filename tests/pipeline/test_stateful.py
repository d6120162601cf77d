"""Every component with state is a `Stateful` under a key of `RunState.state_dict`, and a
checkpoint written before a component kept state still loads (that component starts fresh)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from trainguard import Guard, GuardConfig, RecoveryConfig
from trainguard.pipeline.state import REWOUND
from trainguard.remedies import AdaptiveClip
from trainguard.stateful import Stateful

from ..conftest import make_setup

CONFIG = GuardConfig(policy="recover", recovery=RecoveryConfig(ring_every=2, confirm_steps=1,
                                                               ring_budget=None),
                     sinks={"console": False}, clip={"rule": AdaptiveClip(warmup_steps=2)})
NEW_KEYS = ("metric_collapse", "batch_watch", "sampling", "output_classes")


def _trained(steps: int = 6) -> Guard:
    setup = make_setup()
    guard = Guard(setup.model, setup.optimizer, config=CONFIG, kl_penalty=SimpleNamespace(beta=0.1))
    for _ in range(steps):
        batch = setup.batch()
        loss = setup.model.loss(batch)
        loss.backward()
        guard.step(loss, batch=batch)
        setup.optimizer.zero_grad(set_to_none=True)
    guard.observe_eval({"eval_accuracy": 0.9, "eval_loss": 0.3})
    return guard


def test_every_component_is_stateful_and_in_the_state_dict() -> None:
    guard = _trained()
    components = guard.run.state.components()
    state = guard.state_dict()
    for key, component in components.items():
        assert component is not None, key  # this configuration has every component
        assert isinstance(component, Stateful), key
        assert key in state, key
    assert set(REWOUND) <= set(components)
    assert state["metric_collapse"]["best"] == {"eval_accuracy": 0.9, "eval_loss": 0.3}
    json.dumps(state)  # plain types
    guard.close()


def test_the_state_round_trips_into_a_fresh_guard() -> None:
    guard = _trained()
    state = guard.state_dict()
    setup = make_setup()
    resumed = Guard(setup.model, setup.optimizer, config=CONFIG,
                    kl_penalty=SimpleNamespace(beta=0.1))
    resumed.load_state_dict(state)
    assert resumed.state_dict() == state
    # the ring starts again from the loaded step, not from the fresh run's step 0
    recovery = resumed.recovery
    assert recovery is not None and recovery.ring.good[-1].step == state["step"]
    guard.close()
    resumed.close()


def test_a_checkpoint_from_before_the_new_components_loads() -> None:
    guard = _trained()
    state = guard.state_dict()
    old = {k: v for k, v in state.items() if k not in NEW_KEYS}
    old["recovery"] = {k: v for k, v in old["recovery"].items() if k != "last_capture"}
    setup = make_setup()
    resumed = Guard(setup.model, setup.optimizer, config=CONFIG)
    fresh = resumed.state_dict()
    resumed.load_state_dict(old)
    loaded = resumed.state_dict()
    assert loaded["step"] == state["step"]
    assert loaded["detectors"] == state["detectors"]
    assert loaded["metric_collapse"] == fresh["metric_collapse"]
    assert loaded["batch_watch"] == fresh["batch_watch"]
    guard.close()
    resumed.close()
