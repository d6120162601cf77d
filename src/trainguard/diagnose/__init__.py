"""Diagnosis: why a run went wrong. The cause catalogue is the vocabulary every part shares."""

from trainguard.diagnose.causes import CAUSES, Cause, cause
from trainguard.diagnose.finding import Finding
from trainguard.diagnose.preflight import preflight
from trainguard.diagnose.replay import ReplayReport, replay

__all__ = ["CAUSES", "Cause", "Finding", "ReplayReport", "cause", "preflight", "replay"]
