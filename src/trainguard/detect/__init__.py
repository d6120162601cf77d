"""Detectors turn a step's signals into events. One detector per module, one stable `kind` each."""

from __future__ import annotations

from trainguard.detect.bad_start import BadStart
from trainguard.detect.base import Detector
from trainguard.detect.chosen_likelihood_falling import ChosenLikelihoodFalling
from trainguard.detect.completion_length_collapse import CompletionLengthCollapse
from trainguard.detect.completions_truncated import CompletionsTruncated
from trainguard.detect.dead_units import DeadUnits
from trainguard.detect.entropy_collapse import EntropyCollapse
from trainguard.detect.extreme_weight import ExtremeWeight
from trainguard.detect.fp16_overflow import Fp16Overflow
from trainguard.detect.grad_explosion import GradExplosion
from trainguard.detect.instability_precursor import InstabilityPrecursor
from trainguard.detect.kl_blowup import KLBlowup
from trainguard.detect.loss_divergence import LossDivergence
from trainguard.detect.loss_spike import LossSpike
from trainguard.detect.lr_at_zero import LRAtZero
from trainguard.detect.lr_change import LRChange
from trainguard.detect.margins_exploding import MarginsExploding
from trainguard.detect.no_gradients import NoGradients
from trainguard.detect.no_progress import NoProgress
from trainguard.detect.nonfinite_grad import NonFiniteGrad
from trainguard.detect.nonfinite_loss import NonFiniteLoss
from trainguard.detect.nonfinite_metric import NonFiniteMetric
from trainguard.detect.nonfinite_optimizer_state import NonFiniteOptimizerState
from trainguard.detect.nonfinite_weight import NonFiniteWeight
from trainguard.detect.output_collapse import OutputCollapse
from trainguard.detect.params_unfrozen import ParamsUnfrozen
from trainguard.detect.policy_off_reference import PolicyOffReference
from trainguard.detect.preference_unlearned import PreferenceUnlearned
from trainguard.detect.ratio_far_from_one import RatioFarFromOne
from trainguard.detect.reward_dead import RewardDead
from trainguard.detect.reward_hacking import RewardHacking
from trainguard.detect.settings import DetectorConfig
from trainguard.detect.update_too_large import UpdateTooLarge

DETECTOR_TYPES: tuple[type[Detector], ...] = (
    NonFiniteLoss, NonFiniteGrad, NonFiniteWeight, NonFiniteOptimizerState, GradExplosion,
    LossSpike, LossDivergence, ExtremeWeight, Fp16Overflow, BadStart, NoGradients,
    LRChange, LRAtZero, DeadUnits, OutputCollapse, NoProgress, InstabilityPrecursor,
    UpdateTooLarge, ParamsUnfrozen, KLBlowup, RewardDead, PreferenceUnlearned, NonFiniteMetric,
    EntropyCollapse, MarginsExploding, ChosenLikelihoodFalling,
    RewardHacking, PolicyOffReference, RatioFarFromOne, CompletionLengthCollapse,
    CompletionsTruncated,
)
KINDS: tuple[str, ...] = tuple(t.kind for t in DETECTOR_TYPES)


def default_detectors(config: DetectorConfig) -> list[Detector]:
    return [t(config) for t in DETECTOR_TYPES]


__all__ = ["DETECTOR_TYPES", "KINDS", "Detector", "default_detectors"] + [
    t.__name__ for t in DETECTOR_TYPES]
