"""The samples seen, judged against the run's own first samples (`probes/samples.py`).

A run's first samples are the reference: whatever the model made before training moved it far
(a pre-trained model's pictures, or a fresh model's blur). Against it, each later batch of samples
is judged on what the guide calls the failure of a diffusion fine-tune ("images full of noise or
colour blotches", §2.2), each relative to the reference so that a model whose first samples are
already rough, or flat, is not blamed for them:

    colour noise   neighbouring pixels unrelated: roughness at least `NOISE_RATIO` times the
                   reference's and at least `NOISE_FLOOR` (white noise is 1)
    flat           every image a flat field: the pixels' spread under `FLAT_SHARE` of the
                   reference's
    blown out      pixels piled at the extremes: the saturated share `SATURATED_RISE` above the
                   reference's
    all alike      every sample the same picture: the spread across the batch under `ALIKE_SHARE`
                   of the reference's
    non-finite     any NaN or inf in the samples

A failure is reported once, on the check that first shows it, as a `samples_degraded` event;
it lasts until its measure is back `EXIT` inside its bound on `REARM` checks in a row, and only
then can it be reported again (a value hovering at a bound is one failure, not many). The
event votes for no cause: bad samples say what the model makes, not why (an LR far too high,
a prediction target the sampler does not expect, a drifting VAE).
"""

from __future__ import annotations

from dataclasses import asdict

from trainguard.events import Event
from trainguard.probes.samples import ImageStats

NOISE_RATIO = 3.0
NOISE_FLOOR = 0.5
FLAT_SHARE = 0.1
SATURATED_RISE = 0.3
ALIKE_SHARE = 0.1
EXIT = 1.5
"""A failure once seen lasts until its measure is back this much further inside its bound (a
roughness under 2x the reference's, not 3x; a spread above 0.15 of it, not 0.1; ...): a value
hovering at a bound is one failure, not one that comes and goes."""
REARM = 3


def sample_faults(reference: ImageStats, now: ImageStats, *, lasting: bool = False
                  ) -> list[str]:
    """What `now` shows that `reference` did not, in words (empty: the samples look as well).
    `lasting`: a failure is already being reported, judged at the bounds moved `EXIT` inside."""
    k = EXIT if lasting else 1.0
    faults = []
    if now.nonfinite > 0:
        faults.append(f"{now.nonfinite:.0%} of the values non-finite")
    if now.roughness >= max(NOISE_FLOOR, NOISE_RATIO * reference.roughness) / k:
        faults.append(f"colour noise (neighbouring pixels unrelated: roughness {now.roughness:.2f}"
                      f" against {reference.roughness:.2f} at first; white noise is 1)")
    if reference.spread > 0 and now.spread < FLAT_SHARE * k * reference.spread:
        faults.append(f"flat images (pixel spread {now.spread:.3g} against "
                      f"{reference.spread:.3g} at first)")
    if now.saturated >= reference.saturated + SATURATED_RISE / k:
        faults.append(f"blown-out colours ({now.saturated:.0%} of the pixels at the extremes "
                      f"against {reference.saturated:.0%} at first)")
    if reference.diversity > 0 and now.diversity < ALIKE_SHARE * k * reference.diversity:
        faults.append(f"every sample alike (spread across samples {now.diversity:.3g} against "
                      f"{reference.diversity:.3g} at first)")
    return faults


class SampleJudge:
    """The reference (the first check's samples) and whether a failure is being reported."""

    def __init__(self) -> None:
        self.reference: ImageStats | None = None
        self.reference_step: int | None = None
        self.reported = False
        self.clean = 0
        """Checks in a row without a fault since the last report."""
        self.broken: tuple[int, str] | None = None
        """From the check that first shows a failure until `REARM` clean checks in a row: the
        step it was first seen and what it was (the verdict's: samples still broken at the end
        degrade it)."""

    def judge(self, step: int, now: ImageStats) -> list[Event]:
        if self.reference is None:
            if now.nonfinite == 0:
                self.reference, self.reference_step = now, step
            return []
        faults = sample_faults(self.reference, now, lasting=self.broken is not None)
        if faults and self.broken is None:
            self.broken = (step, "; ".join(faults))
        if not faults:
            self.clean += 1
            self.reported = self.reported and self.clean < REARM
            if not self.reported:  # gone for `REARM` checks in a row
                self.broken = None
            return []
        self.clean = 0
        if self.reported:
            return []
        self.reported = True
        return [Event(kind="samples_degraded", step=step, severity="warning",
                      message=(f"the samples turned bad after step {step}: "
                               f"{'; '.join(faults)}, against the run's own samples "
                               f"{self._when()}: what the model makes has broken down, "
                               f"whatever its loss says"),
                      details={"signal": "samples", "faults": faults, "samples": asdict(now),
                               "reference": asdict(self.reference),
                               "reference_step": self.reference_step})]

    def _when(self) -> str:
        step = self.reference_step
        return "before its first update" if step is None or step < 0 else f"after step {step}"
