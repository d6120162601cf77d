"""Diagnosis: why a run went wrong. The cause catalogue is the vocabulary every part shares."""

from trainguard.diagnose.causes import CAUSES, Cause, cause

__all__ = ["CAUSES", "Cause", "cause"]
