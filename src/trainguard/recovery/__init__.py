"""The `recover` policy: keep verified-good states, roll back to them when a run takes off, back
the learning rate off, tighten clipping and keep the suspect data out."""

from trainguard.recovery.controller import RecoveryController, Verdict
from trainguard.recovery.data import SkippingSampler
from trainguard.recovery.lr import LRBackoff
from trainguard.recovery.manager import Recovery, Rollback
from trainguard.recovery.ring import GoodStateRing
from trainguard.recovery.state import SavedState

__all__ = ["GoodStateRing", "LRBackoff", "Recovery", "RecoveryController", "Rollback", "SavedState",
           "SkippingSampler", "Verdict"]
