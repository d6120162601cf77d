"""The good-state ring keeps only verified, confirmed states, newest last."""

from __future__ import annotations

import numpy as np
import torch

from trainguard.recovery.ring import GoodStateRing
from trainguard.recovery.state import capture

from .helpers import make_workload


def _state(w, step: int):
    return capture(step=step, model=w.model, optimizers=[w.optimizer], scheduler=w.scheduler,
                   scaler=None, guard_state={})


def test_candidate_becomes_good_after_a_finite_flag_and_calm_steps() -> None:
    w = make_workload()
    ring = GoodStateRing(size=2, confirm_steps=3)
    ring.offer(_state(w, 10))
    assert ring.pending_flag() is not None
    assert ring.observe(flag=np.array([1.0]), calm=True) is None
    assert ring.observe(flag=None, calm=True) is None
    promoted = ring.observe(flag=None, calm=True)
    assert promoted is not None and promoted.step == 10 and len(ring) == 1


def test_a_poisoned_candidate_is_never_kept() -> None:
    w = make_workload()
    with torch.no_grad():
        w.model[0].weight[0, 0] = float("nan")
    ring = GoodStateRing(size=2, confirm_steps=0)
    state = _state(w, 10)
    ring.offer(state)
    flag = ring.pending_flag()
    assert flag is not None and flag.item() == 0.0
    assert ring.observe(flag=flag.reshape(1).numpy(), calm=True) is None
    assert len(ring) == 0 and ring.candidate is None
    assert not ring.promote_now(_state(w, 0), finite=False)  # nor as the initial state
    assert len(ring) == 0


def test_an_event_before_confirmation_drops_the_candidate() -> None:
    w = make_workload()
    ring = GoodStateRing(size=2, confirm_steps=3)
    ring.offer(_state(w, 10))
    ring.observe(flag=np.array([1.0]), calm=True)
    ring.observe(flag=None, calm=False)
    assert ring.candidate is None and len(ring) == 0


def test_ring_keeps_the_newest_states_and_finds_the_one_before_a_step() -> None:
    w = make_workload()
    ring = GoodStateRing(size=2, confirm_steps=0)
    for step in (0, 10, 20):
        ring.promote_now(_state(w, step), finite=True)
    assert [s.step for s in ring.good] == [10, 20]
    assert ring.latest_before(25).step == 20
    assert ring.latest_before(19).step == 10
    assert ring.latest_before(3).step == 10  # nothing that old: the oldest kept
    ring.discard_after(10)
    assert [s.step for s in ring.good] == [10]


def test_a_pinned_state_outlives_its_turn_and_its_buffers_are_not_reused() -> None:
    w = make_workload()
    ring = GoodStateRing(size=2, confirm_steps=0)
    for step in (0, 10):
        ring.promote_now(_state(w, step), finite=True)
    pinned = ring.good[0]
    ring.pin(pinned)
    for step in (20, 30, 40):
        ring.promote_now(_state(w, step), finite=True)
        assert ring.take_spare() is not pinned
    # the pin aside, the two newest
    assert [s.step for s in ring.good] == [0, 30, 40]
    assert ring.latest_before(25).step == 0 and ring.latest_before(35).step == 30
    # a new pin (the newest state, which now does not count): the old one takes its turn
    ring.pin(ring.good[-1])
    assert [s.step for s in ring.good] == [0, 30, 40]
    ring.promote_now(_state(w, 50), finite=True)
    assert [s.step for s in ring.good] == [30, 40, 50] and ring.take_spare() is pinned
    # a pinned state abandoned by a rollback is no longer pinned
    ring.discard_after(35)
    assert [s.step for s in ring.good] == [30] and ring.pinned is None


def test_buffers_handed_out_for_reuse_are_never_written_over_again() -> None:
    """After a rollback forgot the newest state, its buffers are reused once: a later capture
    does not overwrite the good state that the first reuse became."""
    w = make_workload()
    ring = GoodStateRing(size=3, confirm_steps=0)

    def take(step: int) -> None:
        with torch.no_grad():
            w.model[0].weight.fill_(float(step))  # each state's weights say its step
        ring.offer(capture(step=step, model=w.model, optimizers=[w.optimizer],
                           scheduler=w.scheduler, scaler=None, guard_state={},
                           reuse=ring.take_spare()))
        ring.observe(flag=np.array([1.0]), calm=True)

    for step in (5, 15, 25):
        take(step)
    ring.discard_after(15)  # a rollback to step 15 forgets the state of step 25
    take(20)
    take(30)
    assert [s.step for s in ring.good] == [15, 20, 30]
    for state in ring.good:
        assert float(state.model["0.weight"][0, 0]) == state.step, state.step
