"""The value types at the bottom of the imports keep their old import paths."""

from __future__ import annotations

import trainguard
from trainguard.finding import Finding
from trainguard.ranked_cause import RankedCause
from trainguard.run_verdict import RunVerdict


def test_the_old_import_paths_name_the_same_classes() -> None:
    from trainguard.diagnose import Finding as from_package
    from trainguard.diagnose.finding import Finding as from_diagnose
    from trainguard.diagnose.ranking import RankedCause as from_ranking
    from trainguard.verdict import RunVerdict as from_verdict
    assert from_diagnose is from_package is trainguard.Finding is Finding
    assert from_ranking is RankedCause
    assert from_verdict is RunVerdict


def test_a_finding_reads_as_before() -> None:
    finding = Finding("lr_range", "warning", "the LR is high", "lower it", cause="lr_too_high")
    assert finding.to_dict()["cause"] == "lr_too_high"
    assert str(finding) == "WARNING lr_range: the LR is high Fix: lower it"
    cause = RankedCause("lr_too_high", 0.8, 3.0, ["the loss rose."], "lower the LR")
    assert str(cause) == "lr_too_high (80%): the loss rose. Fix: lower the LR"
    assert "proof" not in cause.to_dict()
