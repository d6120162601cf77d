"""The one registry of the names trainguard speaks: event kinds and metric keys.

Event kinds. Every kind trainguard can raise is listed here with what the rest of trainguard needs
to know about it: a one-line description, its typical severity, whether it is rank-local (batch
findings differ per rank under torch.distributed and must not drive shared decisions), the
reaction of the `recover` policy, the families (tags) the cause ranking reasons about, and the
cause votes a kind always casts. The cause ranking, the recovery and the step pipeline ask the
registry instead of testing kind names, so a new detector needs its own file and one entry here
(or a `register_event_kind` call from its own file). Kinds nobody registered (a user's own
events) get a safe default: not rank-local, no reaction, no tags, no votes.

Metric keys. Every key the probes and the step measurement produce, with its scope (one value per
step, per watched parameter or per hooked module), whether it is measured every step or only on
sampled steps, and how torch.distributed agrees on it across ranks (`Reduction`).

Only the standard library here: every part of trainguard imports this module.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from trainguard.errors import UsageError
from trainguard.events import SEVERITY_RANK, Severity

# -- event kinds ---------------------------------------------------------------------------------


class Reaction(str, Enum):
    """What the `recover` policy does about an event of warning severity or worse (and about a
    watched kind's event at any severity: a one-step jump is told as an outlier batch, `info`,
    until the next step shows harm, and its update is kept out meanwhile)."""

    ROLL_BACK = "roll_back"
    """The weights or optimizer state are already bad: skipping cannot help, roll back at once."""
    WATCH = "watch"
    """Skip the update (its batch is the suspect) and watch whether the loss settles."""


class Onset(str, Enum):
    """When the trouble behind an event began: a rollback returns to a state from before it."""

    STEP = "step"
    """At the step the event was raised."""
    SMOOTHED_LOSS = "smoothed_loss"
    """Before the divergence detector's window: `detectors.loss_divergence.patience` steps above
    after the level (a median of `detectors.loss_divergence.window`) crossed, and a climb that began
    about half of `detectors.loss_divergence.span` before that."""
    SAMPLED = "sampled"
    """Seen on a sampled step: it went bad at some step since the sampled step before."""
    LAST_AGREED = "last_agreed"
    """At `details["last_agreed_step"]`, the last step at which the replicas were seen equal."""


class Tag:
    """Families of kinds the cause ranking reasons about. Tags are free strings: these are the
    ones trainguard's own rules read."""

    INSTABILITY = "instability"
    """Training itself went unstable (a configuration can explain it, unlike a sudden NaN)."""
    NONFINITE = "nonfinite"
    """The loss or the gradients of a step are NaN/inf."""
    STATE = "state"
    """The weights or optimizer moments themselves are non-finite or extreme."""
    JUMP = "jump"
    """A jump of the loss or gradients, judged by when and where it happened."""
    CLIMB = "climb"
    """A sustained climb of the loss (a slow trend, never a single outlier batch)."""
    START = "start"
    """The first updates went wrong; `details["cause"]` and `details["sustained"]` say how."""
    OVERFLOW = "overflow"
    """float16 values at their limit."""
    COLLAPSE = "collapse"
    """The model stopped responding to its input: dead layers, one predicted class."""
    LR = "lr"
    """The learning rate itself changed; evidence for `lr_too_high` when trouble follows."""
    BATCH = "batch"
    """A finding of the batch inspector about the batch itself; `details["cause"]` names it."""
    LR_CUT = "lr_cut"
    """The recover policy cut the LR (`details["lr_factor"]`): trouble that comes back right
    after, under the cut LR, is not the LR's doing."""
    PROOF = "proof"
    """A replay of a bad step under candidate fixes (`details["confirmed"]` and
    `details["ruled_out"]`: cause code -> the sentence that says why): confirmed causes rank
    above voted ones, ruled-out ones drop out."""
    STALL = "stall"
    """The run did not learn; `details["cause"]` names the cause code of what the run showed
    (the LR at 0, no gradient, labels without signal...), absent when it showed none."""
    CLIP_ALARM = "clip_alarm"
    """Puts the adaptive gradient clip into its alarm (clipping at the typical norm) at the step
    it is raised. Narrower than INSTABILITY: a bad start or an extreme weight is no reason to
    clip harder."""


@dataclass(frozen=True, slots=True)
class CauseVote:
    """A vote for a cause code that an event kind casts whatever the context."""

    cause: str
    weight: float
    why: str
    """The evidence. For a vote of each event, `{step}` and `{message}` are the event's."""
    each_event: bool = False
    """True: every event of the kind votes (a direct measurement, as strong the second time);
    False: the kind votes once when it appears at all."""

    def evidence(self, step: int, message: str) -> str:
        return self.why.format(step=step, message=message) if self.each_event else self.why


@dataclass(frozen=True, slots=True)
class EventKind:
    name: str
    description: str
    severity: Severity
    """The severity it is typically raised with (some kinds escalate with the measured value)."""
    rank_local: bool = False
    """True for findings about this rank's own batch, outputs or shard of the weights: under
    torch.distributed they differ between ranks, so they never drive a decision every rank must
    take alike."""
    reaction: Reaction | None = None
    onset: Onset = Onset.STEP
    tags: frozenset[str] = frozenset()
    votes: tuple[CauseVote, ...] = ()
    registered: bool = True
    """False for the default entry of a kind nobody registered."""


_KINDS: dict[str, EventKind] = {}
_cache: dict[tuple[str, str], object] = {}
"""Derived lookups (kinds by tag, by reaction), dropped on every registration."""


def register_event_kind(name: str, description: str, severity: Severity = "warning", *,
                        rank_local: bool = False, reaction: Reaction | None = None,
                        onset: Onset = Onset.STEP, tags: Iterable[str] = (),
                        votes: Iterable[CauseVote] = (), replace: bool = False) -> EventKind:
    """Register an event kind (for example from a new detector's own module). Registering the same
    entry again is harmless; a different entry under a known name needs `replace=True`. Cause
    votes for codes outside the cause catalogue are ignored by the ranking."""
    if not name or not isinstance(name, str):
        raise UsageError(f"an event kind needs a non-empty name, got {name!r}")
    if severity not in SEVERITY_RANK:
        raise UsageError(f"event kind {name!r}: severity must be one of "
                         f"{', '.join(SEVERITY_RANK)}, got {severity!r}")
    if reaction is not None and not isinstance(reaction, Reaction):
        raise UsageError(f"event kind {name!r}: reaction must be a Reaction or None, "
                         f"got {reaction!r}")
    entry = EventKind(name=name, description=description, severity=severity,
                      rank_local=rank_local, reaction=reaction, onset=Onset(onset),
                      tags=frozenset(tags), votes=tuple(votes))
    known = _KINDS.get(name)
    if known is not None and known != entry and not replace:
        raise UsageError(f"event kind {name!r} is already registered differently; pass "
                         "replace=True to change it")
    _KINDS[name] = entry
    _cache.clear()
    return entry


def event_kind(name: str) -> EventKind:
    """The entry of a kind; for a kind nobody registered, a default that changes nothing."""
    known = _KINDS.get(name)
    if known is not None:
        return known
    return EventKind(name=name, description="", severity="warning", registered=False)


def event_kinds() -> tuple[EventKind, ...]:
    """Every registered kind, in registration order."""
    return tuple(_KINDS.values())


def is_registered(kind: str) -> bool:
    return kind in _KINDS


def is_rank_local(kind: str) -> bool:
    known = _KINDS.get(kind)
    return known is not None and known.rank_local


def recovery_reaction(kind: str) -> Reaction | None:
    known = _KINDS.get(kind)
    return None if known is None else known.reaction


def kinds_tagged(tag: str) -> frozenset[str]:
    """The registered kinds of one family."""
    key = ("tag", tag)
    found = _cache.get(key)
    if found is None:
        found = _cache[key] = frozenset(k.name for k in _KINDS.values() if tag in k.tags)
    return found  # type: ignore[return-value]


def is_trouble(kind: str, severity: Severity) -> bool:
    """Whether an event is trouble for the run's judgement (the recover policy, the good states
    kept, the healthy baselines of proofs): one of warning severity or worse, or a jump of any
    severity (`Tag.JUMP`: a one-step jump is told as an outlier batch, `info`, until the steps
    after it show harm, and is acted on at once all the same)."""
    return SEVERITY_RANK[severity] >= SEVERITY_RANK["warning"] or kind in kinds_tagged(Tag.JUMP)


def kinds_reacting(reaction: Reaction) -> tuple[str, ...]:
    """The kinds the `recover` policy meets with `reaction`, in registration order (when several
    arrive at once, the first one names the reason and sets the onset)."""
    key = ("reaction", reaction.value)
    found = _cache.get(key)
    if found is None:
        found = _cache[key] = tuple(k.name for k in _KINDS.values() if k.reaction is reaction)
    return found  # type: ignore[return-value]


# Trainguard's own kinds. Order matters only among kinds of one reaction (see kinds_reacting).
class Kind:
    """The built-in event kinds by name, for the code that must tell one kind from another (a
    family of kinds is asked of the registry by tag instead). Every name here is registered
    below; `tests/test_registry.py` checks the two lists agree."""

    NONFINITE_LOSS = "nonfinite_loss"
    NONFINITE_GRAD = "nonfinite_grad"
    LOSS_SPIKE = "loss_spike"
    GRAD_EXPLOSION = "grad_explosion"
    LOSS_DIVERGENCE = "loss_divergence"
    NONFINITE_WEIGHT = "nonfinite_weight"
    NONFINITE_OPTIMIZER_STATE = "nonfinite_optimizer_state"
    EXTREME_WEIGHT = "extreme_weight"
    FP16_OVERFLOW = "fp16_overflow"
    BAD_START = "bad_start"
    LR_CHANGE = "lr_change"
    LR_AT_ZERO = "lr_at_zero"
    DEAD_UNITS = "dead_units"
    OUTPUT_COLLAPSE = "output_collapse"
    METRIC_COLLAPSE = "metric_collapse"
    NO_GRADIENTS = "no_gradients"
    NO_PROGRESS = "no_progress"
    LOSS_AT_CHANCE = "loss_at_chance"
    LOSS_ABOVE_CHANCE = "loss_above_chance"
    NONFINITE_VALUE = "nonfinite_value"
    DDP_DESYNC = "ddp_desync"
    SKIP_LIMIT = "skip_limit"
    ROLLBACK = "rollback"
    ROLLBACK_LIMIT = "rollback_limit"
    ROLLBACK_FAILED = "rollback_failed"
    MONITOR_ERROR = "monitor_error"
    SNAPSHOT_FAILED = "snapshot_failed"
    POISONED_CHECKPOINT = "poisoned_checkpoint"
    PROOF = "proof"
    PRECISION_FAULT = "precision_fault"
    PEER_LOST = "peer_lost"
    INSTABILITY_PRECURSOR = "instability_precursor"
    UPDATE_TOO_LARGE = "update_too_large"
    PARAMS_UNFROZEN = "params_unfrozen"
    OPTIMIZER_STEP_OUTSIDE = "optimizer_step_outside"
    GRADS_NOT_CLEARED = "grads_not_cleared"
    SCHEDULER_STEP_OUTSIDE = "scheduler_step_outside"
    MODEL_IN_EVAL_MODE = "model_in_eval_mode"
    KL_BLOWUP = "kl_blowup"
    REWARD_DEAD = "reward_dead"
    PREFERENCE_UNLEARNED = "preference_unlearned"
    NONFINITE_METRIC = "nonfinite_metric"
    ENTROPY_COLLAPSE = "entropy_collapse"
    MARGINS_EXPLODING = "margins_exploding"
    CHOSEN_LIKELIHOOD_FALLING = "chosen_likelihood_falling"
    REWARD_HACKING = "reward_hacking"
    POLICY_OFF_REFERENCE = "policy_off_reference"
    RATIO_FAR_FROM_ONE = "ratio_far_from_one"
    COMPLETION_LENGTH_COLLAPSE = "completion_length_collapse"
    COMPLETIONS_TRUNCATED = "completions_truncated"
    SAMPLES_DEGRADED = "samples_degraded"


_kind = register_event_kind
_I, _N, _S, _A = Tag.INSTABILITY, Tag.NONFINITE, Tag.STATE, Tag.CLIP_ALARM
# detectors (detect/)
_kind("nonfinite_loss", "the loss is NaN or infinite", "error", tags=(_N,))
_kind("nonfinite_grad", "some gradients are NaN or infinite (not a GradScaler's calibration)",
      "error", tags=(_N,))
_kind("loss_spike", "a sudden jump of the loss against a robust recent baseline", "warning",
      reaction=Reaction.WATCH, tags=(_I, Tag.JUMP, _A))
_kind("grad_explosion", "the pre-clip global gradient norm is far above normal", "error",
      reaction=Reaction.WATCH, tags=(_I, Tag.JUMP, _A))
_kind("loss_divergence", "a sustained upward trend of the smoothed loss", "error",
      reaction=Reaction.ROLL_BACK, onset=Onset.SMOOTHED_LOSS,
      tags=(_I, Tag.JUMP, Tag.CLIMB, _A))
_kind("nonfinite_weight", "weights hold NaN or inf (sampled steps)", "error",
      reaction=Reaction.ROLL_BACK, onset=Onset.SAMPLED, tags=(_S,))
_kind("nonfinite_optimizer_state", "optimizer moments hold NaN or inf (sampled steps)", "error",
      reaction=Reaction.ROLL_BACK, onset=Onset.SAMPLED, tags=(_S,))
_kind("extreme_weight", "some weight's magnitude exceeds extreme_weight_abs (sampled steps)",
      "error", reaction=Reaction.ROLL_BACK, onset=Onset.SAMPLED, tags=(_I, _S))
_kind("fp16_overflow", "float16 values at their limit, or a GradScaler that keeps overflowing "
      "(an info note: the skips of the scaler's calibration at the start, while its scale fell)",
      "warning", tags=(Tag.OVERFLOW,),
      votes=(CauseVote("fp16_overflow", 2.0, "float16 overflow reported"),))
_kind("bad_start", "the first steps went wrong: an over-scaled new layer or a blown-up start",
      "warning", tags=(_I, Tag.START))
_kind("update_too_large", "the first update measured moved the typical weight by a large share "
      "of its norm: an LR too high for the weights (or no warm-up)", "warning",
      rank_local=True, tags=(_I, Tag.START))
_kind("lr_change", "a parameter group's LR rose far above anything it had used, in one step",
      "info", tags=(Tag.LR,))
_kind("lr_at_zero", "every parameter group's LR held at exactly 0 after it was positive: the "
      "optimizer steps change nothing (a scheduler shorter than the run, or code that sets the LR)",
      "warning", votes=(CauseVote("lr_at_zero", 3.0, "{message}", each_event=True),))
_kind("params_unfrozen", "parameters without a gradient for a while get one again: a layer "
      "unfrozen, or a branch now used, trains from here at its group's LR", "info")
_kind("dead_units", "a layer that was alive has gone dead, or gives every sample the same "
      "output (sampled steps)", "warning", rank_local=True, tags=(Tag.COLLAPSE,),
      votes=(CauseVote("dead_units", 3.0, "a layer's units died"),
             CauseVote("lr_too_high", 1.0, "units die after updates too large for them"),
             CauseVote("bad_init", 0.3, "units can start dead from a bad initialisation")))
_kind("output_collapse", "the model predicts the same class (or a collapsed output) for every "
      "input, when it did not before (sampled steps)", "warning", rank_local=True,
      tags=(Tag.COLLAPSE,),
      votes=(CauseVote("lr_too_high", 1.5, "the model's output collapsed (one class, or a "
                                           "spread that shrank or blew up)"),
             CauseVote("dead_units", 1.0, "a collapsed output often follows dead layers"),
             CauseVote("label_problem", 0.5, "one class everywhere can be the labels' doing")))
_kind("metric_collapse", "evaluation metrics say training went wrong: accuracy at chance, an "
      "eval loss rising while the train loss falls, a metric off a cliff", "warning",
      votes=(CauseVote("label_problem", 3.0, "evaluation collapsed ({message})", each_event=True),
             CauseVote("lr_too_high", 1.0, "evaluation metrics collapsed")))
_kind("no_gradients", "no watched parameter has a gradient while the loss is finite",
      "warning", votes=(CauseVote("no_gradients", 3.0, "no gradients at all at step {step}: "
                                  "{message}", each_event=True),))
_kind("no_progress", "the loss has not come down after enough steps to tell (a stall), with what "
      "the run showed of why: a collapsed gradient, no gradient, the LR at 0 or too low to move "
      "the weights, frozen weights, a loss at chance while the weights move", "warning",
      tags=(Tag.STALL,))
_kind("instability_precursor", "a signal that tends to move before the loss spikes (Adam's second "
      "moment lagging the gradient) rose far above its own level and stayed there: a warning "
      "before the spike", "warning", tags=(_I, _A),
      votes=(CauseVote("lr_too_high", 1.5, "Adam's second moment lagged a growing gradient "
                                           "(an LR past what the weights can take)"),
             CauseVote("missing_warmup", 0.5, "a lagging second moment early in a run is what a "
                                              "warmup prevents"),
             CauseVote("optimizer_eps", 0.5, "g^2/v far above 1: a v near 0 against a small eps")))
# a trainer's own metrics (TRL's GRPO, RLOO, DPO, KTO: detect/trainer_metrics.py)
_kind("kl_blowup", "the policy's KL to its reference model is non-finite, or many times its own "
      "level: the policy left its reference in a few updates", "warning", tags=(_I,),
      votes=(CauseVote("lr_too_high", 2.0, "the policy's KL to its reference blew up: updates "
                                           "too large for it"),
             CauseVote("beta_too_low", 1.0, "a KL penalty (beta) too weak to hold the policy "
                                            "near its reference")))
_kind("entropy_collapse", "the policy's entropy fell under a tenth of where the run started: "
      "it became deterministic and stops exploring", "warning",
      votes=(CauseVote("lr_too_high", 1.5, "the policy's entropy collapsed: updates too large "
                                           "for it"),
             CauseVote("beta_too_low", 1.0, "a KL penalty too weak to keep the policy near its "
                                            "reference let its entropy collapse")))
_kind("margins_exploding", "a preference run's reward margin grew far past where its loss "
      "saturates: the pairs are told apart and the policy is pushed off its reference "
      "(overfitting the preferences)", "info",
      votes=(CauseVote("lr_too_high", 1.0, "the reward margins grew far past what the loss "
                                           "asks: updates too large for the policy"),))
_kind("chosen_likelihood_falling", "a preference run's chosen completions became far less "
      "likely than at its start while the margin grew (likelihood displacement)", "warning")
_kind("reward_hacking", "of several reward functions, one climbed while another fell or never "
      "paid: the policy learns to please one reward, not the task", "warning")
_kind("policy_off_reference", "before any update the policy's implicit rewards or KL are not 0: "
      "its forward is not its reference's (dropout on in the policy)", "warning",
      votes=(CauseVote("policy_dropout", 2.0, "the policy differed from its reference before "
                                              "its first update"),))
_kind("ratio_far_from_one", "the policy's mean probability ratio to the policy that sampled its "
      "data (PPO's `val/ratio`, GRPO's importance-sampling ratio) stayed far from 1: it moved "
      "outside its trust region between sampling and training", "warning",
      votes=(CauseVote("lr_too_high", 2.0, "the policy moved far from the one that sampled its "
                                           "data: updates too large for it"),))
_kind("completion_length_collapse", "the completions' mean length fell under a quarter of where "
      "the run started: the policy collapsed to short or empty answers", "warning",
      votes=(CauseVote("lr_too_high", 1.5, "the policy collapsed to short answers: updates "
                                           "too large for it"),
             CauseVote("beta_too_low", 1.0, "a KL penalty too weak to keep the policy near its "
                                            "reference let its answers collapse")))
_kind("completions_truncated", "most completions came to be cut at max_completion_length "
      "mid-run; what the reward did says whether they need more room or the policy stopped "
      "ending them", "warning",
      votes=(CauseVote("beta_too_low", 0.5, "a KL penalty too weak to keep the policy near its "
                                            "reference let its answers run on"),))
_kind("samples_degraded", "the samples a generative model makes (`Guard(sample_fn=...)`) turned "
      "into colour noise, flat or blown-out images, or copies of one image, against the run's "
      "first samples; it names no cause: the samples show what, not why", "warning")
_kind("reward_dead", "every group of completions got the same reward for several steps: zero "
      "advantages, zero policy gradient", "warning", tags=(Tag.STALL,))
_kind("preference_unlearned", "a preference run's chosen and rejected rewards stayed exactly 0: "
      "the policy never left its reference (the DPO loss pinned at ln 2)", "warning",
      tags=(Tag.STALL,))
_kind("nonfinite_metric", "a trainer's metric of the step (rewards, log-probabilities, KL) is "
      "NaN or inf while its loss is finite", "error", tags=(_N,),
      votes=(CauseVote("fp16_overflow", 1.0, "log-probabilities and rewards overflow first in "
                                             "float16"),
             CauseVote("numerical_op", 1.0, "a log of 0 or an exp that overflows in the "
                                            "trainer's objective ({message})", each_event=True)))
# the loss against chance level, read from a training log (trainguard analyze: analyze/chance.py)
_kind("loss_at_chance", "the logged loss went back to chance level, ln(num_classes), after the "
      "run had learned, and stayed there: a collapse to a constant prediction", "error",
      votes=(CauseVote("lr_too_high", 2.0, "the loss went back to chance level and stayed"),
             CauseVote("label_problem", 0.5, "a loss at chance can be labels that say nothing")))
_kind("loss_above_chance", "a cross-entropy above the chance level of any vocabulary from the "
      "first logged step: the weights blew up before it", "error",
      votes=(CauseVote("lr_too_high", 2.0, "the loss was worse than a uniform guess from the "
                                           "first logged step"),
             CauseVote("bad_init", 0.5, "a first loss above chance can be an initialisation")))
_kind("nonfinite_value", "a logged value other than the loss, in a log that holds no loss, is "
      "NaN or infinite from a row on to the end of the log, after it was finite on every row "
      "before", "error", tags=(_N,))
# the cross-rank desync check (distributed.py): measured directly, so every event votes
_kind("ddp_desync", "the replicas' weights differ across ranks", "error",
      reaction=Reaction.ROLL_BACK, onset=Onset.LAST_AGREED,
      votes=(CauseVote("ddp_desync", 4.0, "step {step}: {message}", each_event=True),))
# the batch inspector (diagnose/batch.py, diagnose/batch_watch.py): about this rank's batch
for _name, _description, _severity in (
    ("batch_nonfinite", "the batch holds NaN or inf values", "error"),
    ("batch_image_range", "images with unnormalised 0-255 pixel values", "warning"),
    ("batch_channel_order", "images whose pixels were scrambled: channel-last data reshaped, "
     "not permuted, to channel-first", "warning"),
    ("batch_token_ids", "token ids outside the model's embedding table", "error"),
    ("batch_attention_mask", "an attention mask outside 0/1, or one that masks everything",
     "warning"),
    ("batch_outlier", "a field far above its typical magnitude in earlier batches", "warning"),
    ("batch_labels", "every label of the batch is ignored (-100): the loss averages nothing",
     "error"),
    ("batch_repeated", "the first steps' batches are one batch (a loader re-created at each "
     "step, or full-batch training)", "info"),
    ("batch_padding_labels", "labels that are not -100 on the padding positions (attention_mask "
     "0): the loss trains the model to predict padding", "warning"),
    ("batch_label_order", "the batches inspected each hold one label (or a few neighbouring "
     "ones), different ones from stretch to stretch: the data is ordered by label, not "
     "shuffled", "warning"),
    ("batch_size", "batches smaller than configured: silently truncated", "warning"),
    ("batch_above_chance", "a language model's loss far above chance level on this batch",
     "warning"),
):
    _kind(_name, _description, _severity, rank_local=True,  # type: ignore[arg-type]
          tags=(Tag.BATCH,))
# raised by trainguard's own decisions and actions
_kind("skip_limit", "too many consecutive non-finite steps: skipping cannot heal the run",
      "critical")
_kind("rollback", "the run was rolled back to a good state (and its LR cut)", "warning",
      tags=(Tag.LR_CUT,))
_kind("rollback_limit", "recovery gives up: too many rollbacks, or no good state to return to",
      "critical")
_kind("rollback_failed", "restoring a good state failed", "critical")
_kind("proof", "the bad step replayed under candidate fixes: causes confirmed or ruled out",
      "info", tags=(Tag.PROOF,))
_kind("precision_fault", "a replay confirmed a float16 overflow and the faults came back: the "
      "run halts with the advice to switch to bf16", "critical")
_kind("monitor_error", "trainguard could not check a step; it was applied unguarded", "warning")
_kind("optimizer_step_outside", "optimizer.step() ran outside guard.step (a loop that still "
      "calls it updates twice per batch)", "warning")
_kind("scheduler_step_outside", "scheduler.step() ran outside guard.step on the scheduler the "
      "Guard steps: the schedule runs at twice its pace", "warning")
_kind("grads_not_cleared", "a step's backward added to the gradients of the step before: the "
      "loop never calls optimizer.zero_grad(), so each update applies the sum of every gradient "
      "so far", "error",
      votes=(CauseVote("grads_not_cleared", 4.0, "the gradients were never cleared: {message}",
                       each_event=True),))
_kind("model_in_eval_mode", "the model trains in eval mode (a model.eval() for an evaluation "
      "never undone, or never switched to train mode): its dropout is off and its batch norm "
      "normalises with frozen running statistics", "warning",
      votes=(CauseVote("model_in_eval_mode", 3.0, "{message}", each_event=True),))
_kind("snapshot_failed", "the crash snapshot could not be written", "error")
_kind("poisoned_checkpoint", "a checkpoint was saved with non-finite weights or optimizer "
      "moments (marked poisoned in its trainguard.json)", "error")
_kind("peer_lost", "under torch.distributed, a rank is gone (trainguard's collective failed): "
      "the run stopped as failed", "error")
del _kind, _I, _N, _S, _A, _name, _description, _severity


# -- metric keys ---------------------------------------------------------------------------------


class Scope(str, Enum):
    """What one value of a metric is about."""

    STEP = "step"
    """One value per step."""
    PARAM = "param"
    """One value per watched parameter, in the watched order."""
    MODULE = "module"
    """One value per hooked module, in the order the modules ran."""
    GROUP = "group"
    """One value per optimizer parameter group, in the optimizer's order."""
    POSITION = "position"
    """Values per position of the step's output read (a sample, or a token of one), in order."""


class Reduction(str, Enum):
    """How ranks under torch.distributed agree on a metric."""

    SUM_OF_SQUARES = "sum_of_squares"
    """Norms of (possibly sharded) tensors: squared, weighted by each rank's share of the tensor,
    summed over ranks, square-rooted: the norm of the whole tensor."""
    MAX = "max"
    """The maximum over ranks (max |w|, non-finite flags): exact over shards."""
    MEAN = "mean"
    """The mean over the ranks that measured it, non-finite on any rank showing on all."""
    LOCAL = "local"
    """Not agreed: each rank keeps its own (means and spreads of its shard, or values every rank
    already has alike)."""


@dataclass(frozen=True, slots=True)
class MetricKey:
    name: str
    """The key, or a pattern with one `{placeholder}` (e.g. `optstate_{state}_norm`)."""
    scope: Scope
    description: str
    reduction: Reduction
    sampled: bool
    """Measured by the heavy probes on sampled steps only, rather than on every step."""

    @property
    def is_pattern(self) -> bool:
        return "{" in self.name

    def key(self, **parts: str) -> str:
        """The concrete key of a pattern, e.g. `key(state="exp_avg")`."""
        return self.name.format(**parts)


_METRICS: dict[str, MetricKey] = {}
_PATTERNS: list[tuple[re.Pattern[str], MetricKey]] = []
_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def _add_metric(entry: MetricKey) -> MetricKey:
    known = _METRICS.get(entry.name)
    if known is not None and known != entry:
        raise UsageError(f"metric key {entry.name!r} is already registered differently")
    if known is None:
        if entry.is_pattern:
            pieces = _PLACEHOLDER.split(entry.name)
            regex = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>.+)"
                            for i, p in enumerate(pieces))
            _PATTERNS.append((re.compile(f"^{regex}$"), entry))
        _METRICS[entry.name] = entry
    return entry


def register_metric_key(name: str, scope: Scope, description: str,
                        reduction: Reduction = Reduction.LOCAL, *,
                        sampled: bool = True) -> MetricKey:
    """Register the key of a new probe metric (a name, or a pattern with one `{placeholder}`).

    Sampled per-parameter keys may be agreed by MAX or SUM_OF_SQUARES (two small all-reduces on
    sampled steps do it for any such key). Per-module statistics stay local (ranks need not hook
    the same modules), and every-step keys stay local unless the step's one all-reduce
    (`distributed.RankAgreement`) carries them, which trainguard's own step signals only do.
    """
    scope, reduction = Scope(scope), Reduction(reduction)
    if reduction is not Reduction.LOCAL:
        if not sampled:
            raise UsageError(f"metric key {name!r}: every-step keys are agreed only by the "
                             "step's one all-reduce, which carries trainguard's own signals; "
                             "use Reduction.LOCAL")
        if scope is not Scope.PARAM or reduction is Reduction.MEAN:
            raise UsageError(f"metric key {name!r}: only per-parameter sampled keys are agreed "
                             "across ranks, by MAX or SUM_OF_SQUARES; use Reduction.LOCAL")
    return _add_metric(MetricKey(name, scope, description, reduction, sampled))


def metric_key(key: str) -> MetricKey | None:
    """The entry of a concrete key (matching patterns too); None for an unknown key."""
    known = _METRICS.get(key)
    if known is not None and not known.is_pattern:
        return known
    for regex, entry in _PATTERNS:
        if regex.match(key):
            return entry
    return None


def metric_keys() -> tuple[MetricKey, ...]:
    """Every registered key, in registration order."""
    return tuple(_METRICS.values())


def metric_reduction(key: str) -> Reduction:
    """How ranks agree on `key`; LOCAL for a key nobody registered."""
    entry = metric_key(key)
    return Reduction.LOCAL if entry is None else entry.reduction


_SS, _MAX, _LOCAL = Reduction.SUM_OF_SQUARES, Reduction.MAX, Reduction.LOCAL
for _metric in (
    # every step: the step measurement and the gradient probe (probes/gradients.py)
    MetricKey("loss", Scope.STEP, "the scalar loss (NaN/inf kept)", Reduction.MEAN, False),
    MetricKey("grad_norm", Scope.STEP, "global L2 norm of all gradients, before clipping", _SS,
              False),
    MetricKey("param_grad_norm", Scope.PARAM,
              "L2 norm of each watched parameter's gradient (0 when it has none)", _SS, False),
    MetricKey("fp16_grad_maxabs", Scope.STEP,
              "max |g| over float16 gradients (only when some gradient is float16); agreed as "
              "the mean of the ranks' maxima, exact for replicated gradients", Reduction.MEAN,
              False),
    MetricKey("lr", Scope.GROUP, "the learning rate each parameter group used at the step "
              "(carried by the transfer only when some group's LR is a tensor)", _LOCAL, False),
    MetricKey("adam_ratio_rms", Scope.PARAM, "sqrt(sum g^2 / sum v_hat) over each watched "
              "parameter, with Adam's bias-corrected second moment from before the step (0: no "
              "gradient or no Adam state; probes/adam_ratio.py)", _LOCAL, False),
    MetricKey("loss_scale", Scope.STEP, "the GradScaler's loss scale", _LOCAL, False),
    MetricKey("attn_logit_max", Scope.MODULE, "largest pre-softmax attention logit q.k/sqrt(d) "
              "of each attention layer, over heads and positions of the batch's first sequence "
              "(every `detectors.attention_logits.every` steps far from its bounds, every step "
              "near them; probes/attention_logits.py)",
              _LOCAL, False),
    MetricKey("adam_update_rms", Scope.PARAM, "sqrt(sum m_hat^2 / sum v_hat) over each watched "
              "parameter: the RMS of the previous step's Adam update over the LR, with the "
              "moments' RMS standing for the element-wise ratio (0: no Adam state; "
              "probes/adam_ratio.py)", _LOCAL, False),
    MetricKey("logz_mean", Scope.STEP, "mean over positions of logsumexp of the class scores "
              "(at most 256 positions, strided; probes/logz.py)", _LOCAL, False),
    MetricKey("logz_max", Scope.STEP, "max over positions of logsumexp of the class scores",
              _LOCAL, False),
    MetricKey("ce_ceiling", Scope.STEP, "max over positions of logsumexp minus the smallest "
              "class score: the most a cross-entropy of these scores can cost, whatever the "
              "target (probes/logz.py)", _LOCAL, False),
    MetricKey("logz_rows", Scope.POSITION, "logsumexp of the class scores at each position read, "
              "then each one minus the position's smallest score (or, for at most 4096 scores, "
              "the scores themselves): what the step's transfer carries, from which the host "
              "takes logz_mean, logz_max and ce_ceiling (probes/logz.py)", _LOCAL, False),
    # sampled steps: weights (probes/weights.py)
    MetricKey("weight_mean", Scope.PARAM, "mean of the weights after the step", _LOCAL, True),
    MetricKey("weight_std", Scope.PARAM, "standard deviation of the weights after the step",
              _LOCAL, True),
    MetricKey("weight_maxabs", Scope.PARAM, "max |w| after the step", _MAX, True),
    MetricKey("weight_nonfinite", Scope.PARAM, "1 when the parameter holds any NaN/inf, else 0",
              _MAX, True),
    MetricKey("weight_norm", Scope.PARAM, "L2 norm of the weights after the step", _SS, True),
    MetricKey("update_ratio", Scope.PARAM,
              "||W_after - W_before|| / max(||W_before||, ||W_after||) of the step", _LOCAL,
              True),
    # sampled steps: optimizer state (probes/optimizer_state.py)
    MetricKey("optstate_{state}_norm", Scope.PARAM,
              "L2 norm of each tensor-valued optimizer state entry shaped like the parameter "
              "(for Adam: exp_avg, exp_avg_sq)", _SS, True),
    # sampled steps: activations (probes/activations.py)
    MetricKey("act_maxabs", Scope.MODULE, "max |output|", _LOCAL, True),
    MetricKey("act_zero_frac", Scope.MODULE, "share of exact zeros (dead ReLUs show here)",
              _LOCAL, True),
    MetricKey("act_nonfinite", Scope.MODULE, "share of NaN/inf values", _LOCAL, True),
    MetricKey("act_fp16", Scope.MODULE, "1 when the output was float16, else 0", _LOCAL, True),
    # sampled steps: the model's output (probes/outputs.py)
    MetricKey("out_kind", Scope.STEP, "1 for class scores, 0 for a continuous output", _LOCAL,
              True),
    MetricKey("out_classes", Scope.STEP, "width of the class scores (0: continuous)", _LOCAL,
              True),
    MetricKey("out_mode_share", Scope.STEP, "share of predictions that are the most common class",
              _LOCAL, True),
    MetricKey("out_mode_class", Scope.STEP, "the most common predicted class", _LOCAL, True),
    MetricKey("out_std", Scope.STEP, "standard deviation of the output's values", _LOCAL, True),
    MetricKey("out_count", Scope.STEP, "predictions (samples x positions) or values measured",
              _LOCAL, True),
    MetricKey("act_dead_frac", Scope.MODULE,
              "share of units zero for every sample of the batch (dead units)", _LOCAL, True),
    MetricKey("act_batch_spread", Scope.MODULE,
              "spread of each unit across the batch relative to the mean |output| (0: every "
              "sample gets the same output)", _LOCAL, True),
):
    _add_metric(_metric)
del _metric, _SS, _MAX, _LOCAL
