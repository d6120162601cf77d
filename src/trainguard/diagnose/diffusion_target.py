"""Whether a diffusion loss scores the target its noise scheduler samples with.

The probe (`probes/diffusion_target.py`) hands the first steps' mean squared errors of the
denoiser's prediction against the noise, the velocity and the clean sample. A loss equal to one of
them and clearly apart from the other two says which target the loop trains for; when that is not
the scheduler's `prediction_type`, the model learns to predict one thing and will be sampled as if
it predicted another (the loss falls smoothly; the samples are wrong). A loss equal to none of them
(weighted by SNR, summed, divided over accumulated micro-batches, with extra terms) says nothing:
no finding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from trainguard.finding import Finding
from trainguard.probes.diffusion_target import TARGETS

SAME = 2e-3
"""A loss within this share of an error is that error (float16 losses round at about 1e-3)."""
APART = 0.05
"""The other targets' errors at least this share away: the match is not a coincidence of
targets that agree (at timesteps near 0 the velocity is nearly the noise)."""

SHORT = {"epsilon": "noise", "v_prediction": "velocity", "sample": "clean sample"}
WORDS = {"epsilon": "the noise (epsilon)", "v_prediction": "the velocity (v-prediction)",
         "sample": "the clean sample"}
TARGET_CODE = {"epsilon": "noise",
               "v_prediction": "noise_scheduler.get_velocity(latents, noise, timesteps)",
               "sample": "latents"}


@dataclass(frozen=True)
class TargetRead:
    trained: str | None
    """The target the loss scores (None: the loss is none of the plain errors)."""
    finding: Finding | None
    """Set when that target is not the scheduler's."""


def read_target(loss: float | None, errors: Sequence[float], prediction_type: str
                ) -> TargetRead:
    """Which of `TARGETS` the step's `loss` is the mean squared error against (`errors`, in
    their order), and a finding when it is not `prediction_type`."""
    if loss is None or not math.isfinite(loss) or len(errors) != len(TARGETS):
        return TargetRead(None, None)
    same = [t for t, e in zip(TARGETS, errors, strict=True)
            if math.isfinite(e) and abs(loss - e) <= SAME * max(abs(e), 1e-12)]
    if len(same) != 1:
        return TargetRead(None, None)
    trained = same[0]
    apart = all(abs(loss - e) > APART * abs(loss)
                for t, e in zip(TARGETS, errors, strict=True) if t != trained)
    if not apart:
        return TargetRead(None, None)
    if trained == prediction_type:
        return TargetRead(trained, None)
    scores = ", ".join(f"{SHORT[t]} {e:.4g}" for t, e in zip(TARGETS, errors, strict=True))
    return TargetRead(trained, Finding(
        "diffusion_target", "warning",
        f"the loss ({loss:.4g}) is the denoiser's error against {WORDS[trained]}, while the "
        f"noise scheduler's prediction_type is '{prediction_type}' ({WORDS[prediction_type]}; "
        f"errors against each target: {scores}): the model learns to predict one target and "
        "will be sampled as if it predicted the other.",
        f"score the prediction against the target prediction_type names "
        f"(target = {TARGET_CODE[prediction_type]}), or, if {WORDS[trained]} is the target "
        f"meant, set it on the scheduler before training and sampling: "
        f"noise_scheduler.register_to_config(prediction_type='{trained}').",
        cause="prediction_type_mismatch",
        evidence={"loss": loss, "trained_for": trained, "prediction_type": prediction_type,
                  "errors": dict(zip(TARGETS, map(float, errors), strict=True))}))
