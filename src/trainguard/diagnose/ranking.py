"""Cause ranking: combine events, preflight and batch findings, and replay into ranked causes.

Every piece of evidence votes for cause codes with a weight that says how specific it is: a batch
holding NaN points at `nonfinite_input` almost alone, while a loss spike early in the run could be
several configuration causes, which the preflight findings then separate. Confidence is a cause's
share of all votes. The rules are generic (no scenario names, no model names); the weights are in
one table below. The rules test families of event kinds (`registry.Tag`), never kind names, and a
kind's unconditional votes come from its registry entry.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from trainguard.diagnose.causes import CAUSES
from trainguard.diagnose.loss_bound import CEILING_KEY, beyond, describe
from trainguard.events import Event, at_least
from trainguard.finding import Finding
from trainguard.ranked_cause import RankedCause as RankedCause  # its old import path
from trainguard.registry import Kind, Tag, event_kind, event_kinds, kinds_tagged

FINDING_WEIGHT = {"critical": 3.0, "error": 2.0, "warning": 1.0, "info": 0.2}
BATCH_FINDING_WEIGHT = 4.0
"""A data fault seen in the very batch of a bad step is the most specific evidence there is."""
CONFIG_CAUSES = {"lr_too_high", "missing_warmup", "lora_scaling", "bad_init"}
STANDING_FAULTS = frozenset({"double_activation", "nll_input", "loss_broadcast",
                             "weight_decay_too_high", "weight_decay_coupled"})
STANDING_FAULT_WEIGHT = 6.0
"""A loss whose own autograd graph is wrong (an activation applied twice, `nll_loss` handed
scores, predictions broadcast against targets of another shape), or a weight decay that takes
1% of every weight a step or weighs on the gradient it is added to, is no risk but a fault in
every step: as strong as an LR change, the trouble that follows is its doing (`nll_loss` on raw
scores drives them up until they explode)."""
EARLY_STEPS = 20
"""Trouble within this many steps of the start points at the configuration."""
LR_CHANGE_WINDOW = 100
"""Trouble within this many steps after the LR rose far above its history is that rise's doing
(a divergence takes tens of steps to be confirmed)."""
RAISE_SHOWS = 5
"""A single jump within this many steps after the LR rose far above its history is likelier
the rise's doing (the update at the raised LR shows in the next steps' loss and gradients, and
the rise's own vote counts it) than one odd batch..."""
RAISED_BATCH_WEIGHT = 0.5
"""...which stays a candidate at this weight (a replay of the previous batch can rule it out)."""
LR_CHANGE_WEIGHT = 6.0
"""Stronger than one batch finding: the LR itself was changed just before the trouble, which
no data fault explains."""
PERSISTENT_DATA_CAUSE = "label_problem"
"""What trouble that comes back on other batches, after the LR was cut and the blamed batch
skipped, says of the data when no finding names it: something in every batch, the targets."""
GENERIC_BATCH_CAUSE = "outlier_batch"
"""The generic explanation of a single late jump, or of a batch field far above its usual size.
A batch finding of the same step naming a cause of its own (images in [0, 255]: `input_scale`;
NaN: `nonfinite_input`...) says what was wrong with that batch, and takes the generic
explanation's weight: the same symptom is explained once, by the more specific finding."""
NONFINITE_BATCH_CAUSES = frozenset({"nonfinite_input", "empty_loss"})
"""Batch causes that explain a non-finite loss by themselves (NaN in the batch, nothing to
average): with one of them found, no unsafe operation is needed to explain it."""
RUN_CHECK = "batch_run"
"""The finding of consecutive batches with the same fault (`diagnose.batch_watch`)."""
RUN_WEIGHT = 6.0
"""As strong as an LR change: the data were seen wrong batch after batch while the trouble went
on, which no learning rate explains."""
RUN_GRACE = 20
"""Trouble up to this many steps after a run of bad batches ended is still that run's doing (a
divergence is confirmed tens of steps later)."""
LASTING_RUN = 20
"""An outlier field that stays far above its earlier size for this many batches, up to the last
one inspected, is no outlier: the data's scale changed (`input_scale`)."""
LR_CUT = 0.1
"""Trouble that comes back while the recover policy holds the LR at this share or less..."""
RECUR_WINDOW = 10
"""...within this many steps of the cut (the LR still near its cut value) is not the LR's."""
DATA_DISCOUNT = 0.25
"""What is left of the LR's votes when the data explain the trouble: a bad run of batches from
the start of the trouble on, or trouble that outlasted a cut LR."""
WARMUP_SUFFICES = 2.0
"""A run without warmup whose LR is at most this many times what the model takes behind a warmup
(the preflight's estimate, `lr_share` of its `warmup` finding: an order-of-magnitude range scaled
by the model's size, so a factor of 2 is within its error) was hurt by the missing warmup, not by
its LR: a warmup is the fix, and the LR it runs at afterwards is one the model takes."""
WARMUP_SHIFT = 0.5
"""The share of the LR's votes that then goes to the missing warmup."""
LR_ROSE = 2.0
"""A precursor warning that came at more than this many times the LR of the run's first steps
(the preflight's `lr_head`) came from an LR that rose since (a warmup that never stops, a loop that
keeps raising it): that LR, not the missing warmup, is what the warning is about."""


CONFIRMED_SHARE = 0.9
"""The confidence that causes confirmed by a replay (`diagnose.counterfactual`) share among
themselves; the voted causes left share the rest."""


WINDOW_VOTE = 1.0
"""The score of a cause only a window replay named (a plain vote's order), so that it ranks after
the confirmed causes symptoms voted for."""


class _Votes:
    def __init__(self) -> None:
        self.score: dict[str, float] = defaultdict(float)
        self.evidence: dict[str, list[str]] = defaultdict(list)
        self.fixes: dict[str, str] = {}

    def add(self, code: str | None, weight: float, why: str, fix: str | None = None) -> None:
        if code is None or code not in CAUSES or weight <= 0:
            return
        self.score[code] += weight
        if why not in self.evidence[code]:
            self.evidence[code].append(why)
        if fix and code not in self.fixes:
            self.fixes[code] = fix


NO_SYMPTOM_SHARE = 0.5
"""Without any symptom, a cause found only in the configuration is at most this confident."""


def rank_causes(events: list[Event], findings: list[Finding] | None = None,
                *, top: int = 5, batches: bool = True,
                fixes: Mapping[str, str] | None = None) -> list[RankedCause]:
    """Ranked causes for a run's events. Without an event of warning severity, the risks the
    preflight (and runtime) findings of warning severity or worse point at, flagged as such; empty
    when there are none either. `batches`: whether the run could see its batches at all (a
    training log cannot: its evidence then says nothing of batches). `fixes`: the fixes made
    concrete for the run (the LR's, sized to its model), over the catalogue's; a finding's own
    fix comes first."""
    serious = [e for e in events if at_least(e.severity, "warning")]
    findings = findings or []
    fixes = fixes or {}
    if not serious:
        return _configuration_risks(findings, top, fixes)
    votes = _Votes()
    kinds = {e.kind for e in serious}
    lr_changed = _vote_lr_changes(votes, events, serious)

    batch_kinds = kinds_tagged(Tag.BATCH)
    runs = [f for f in findings if f.check == RUN_CHECK]
    findings = [f for f in findings if f.check != RUN_CHECK]
    # a stall is judged over a hundred steps, not at a step a batch could explain
    symptoms = [e for e in serious if e.kind not in batch_kinds and event_kind(e.kind).tags
                and e.kind not in kinds_tagged(Tag.LR_CUT) | kinds_tagged(Tag.STALL)]
    data_runs = _bad_runs(votes, runs, symptoms)
    against_lr = _against_lr(data_runs, symptoms, serious)

    _vote_findings(votes, findings, kinds)
    # a missing warmup inflates the first steps of an adaptive optimizer (its moment estimates
    # are still poor); SGD steps in proportion to the gradient from the first step on
    no_warmup = any(f.cause == "missing_warmup" and f.evidence.get("adaptive") is not False
                    for f in findings)
    specific = _specific_batch_findings(serious, batch_kinds)
    batch_causes = _vote_batch_events(votes, serious, data_runs, specific)
    _vote_nonfinite(votes, serious, findings, batch_causes, batches=batches)
    _vote_event_kinds(votes, serious, no_warmup)
    _vote_climb(votes, events, serious)
    scaled = _vote_loss_scale(votes, serious, events, batch_kinds)
    raises = [e.step for e in events if e.kind in kinds_tagged(Tag.LR)]
    _vote_jumps(votes, serious, findings, specific, no_warmup, _first_lr_cut(events), scaled,
                raises)
    _weigh_down_lr(votes, events, symptoms, data_runs, batch_causes, against_lr,
                   lr_changed=lr_changed)
    shifted = _shift_to_warmup(votes, findings, serious, raises)
    confirmed, ruled_out = proven(events)
    if shifted and "lr_too_high" in confirmed and "missing_warmup" not in ruled_out:
        # a lower LR healing the first steps is what a warmup does: the replay proves both,
        # and the votes (the run's timing and its LR against the warmup estimate) order them
        confirmed.setdefault("missing_warmup", confirmed["lr_too_high"]
                             + "; a warmup lowers the first steps' LR the same way")
    for code in window_proven(events):
        if not votes.score.get(code):  # proved where no symptom could vote (see there)
            votes.score[code] = WINDOW_VOTE
    return _ranked(votes, top, fixes, confirmed, ruled_out)


def likely_causes(ranked: list[RankedCause]) -> list[dict[str, Any]]:
    """The causes an event carries (`details["likely_causes"]`): code and confidence, and the
    fix of the first, which the console prints."""
    likely: list[dict[str, Any]] = [{"code": c.code, "confidence": round(c.confidence, 3)}
                                    for c in ranked]
    if likely:
        likely[0]["fix"] = ranked[0].fix
    return likely


def warmup_would_do(findings: list[Finding]) -> str:
    """Why a warmup alone would have done, when the run has none and its LR is one the model
    takes behind a warmup (`WARMUP_SUFFICES`); empty otherwise (a warmup found, an LR far above
    that, an optimizer the estimate does not cover)."""
    for f in findings:
        share = f.evidence.get("lr_share") if f.cause == "missing_warmup" else None
        if isinstance(share, (int, float)) and share <= WARMUP_SUFFICES:
            tolerated = f.evidence.get("tolerated_lr")
            return (f"the LR is {share:.2g}x the most this model takes behind a warmup"
                    + (f" ({tolerated:.3g})" if isinstance(tolerated, (int, float)) else ""))
    return ""


def _shift_to_warmup(votes: _Votes, findings: list[Finding], serious: list[Event],
                     raises: list[int]) -> bool:
    """Trouble from the first steps of a run without warmup, at an LR the model takes behind a
    warmup: the LR's votes speak for the missing warmup (lowering the LR would heal it too, but
    so would a warmup at the same LR, which is the cause named by the symptoms' timing). Not
    when the loop raised the LR far (`raises`) before the trouble: the steps at the first LR
    went well. Returns whether they did."""
    why = warmup_would_do(findings)
    # a precursor warning is not trouble yet: with nothing else, both findings are risks
    trouble = [e.step for e in serious if e.kind != Kind.INSTABILITY_PRECURSOR]
    if trouble and any(r < min(trouble) for r in raises):
        return False
    if not why or (trouble and min(trouble) >= EARLY_STEPS) or not votes.score.get(
            "lr_too_high") or (not trouble and _lr_rose(serious, findings)):
        return False
    moved = WARMUP_SHIFT * votes.score["lr_too_high"]
    votes.score["lr_too_high"] -= moved
    votes.add("missing_warmup", moved, (
        f"no warmup, trouble from step {min(trouble)} on" if trouble
        else "no warmup, nothing but a precursor warning so far")
        + f", and {why}: the first updates, not the LR")
    return True


def _lr_rose(serious: list[Event], findings: list[Finding]) -> bool:
    """Whether the first precursor warning came at more than `LR_ROSE` x the LR of the run's
    first steps (as the preflight saw them): the LR that rose since is the warning's matter."""
    warned = min((e for e in serious if e.kind == Kind.INSTABILITY_PRECURSOR),
                 key=lambda e: e.step, default=None)
    lr = warned.details.get("lr") if warned is not None else None
    head = next((f.evidence.get("lr_head") for f in findings if f.cause == "missing_warmup"
                 and isinstance(f.evidence.get("lr_head"), list)), None)
    first = [v for v in head or [] if isinstance(v, (int, float)) and v > 0]
    return isinstance(lr, (int, float)) and bool(first) and lr > LR_ROSE * max(first)


def proven(events: list[Event]) -> tuple[dict[str, str], set[str]]:
    """From the replays of bad steps that reproduced their fault: the confirmed causes (code ->
    the sentence that proves it) and the causes ruled out (and confirmed by no replay of that
    step or a later one). A cause confirmed at one bad step and ruled out at a later one is
    ruled out: the fault outlived what healed it (a batch fault that comes back on other
    batches is not that batch's)."""
    confirmed: dict[str, tuple[int, str]] = {}
    ruled_out: dict[str, int] = {}
    for e in _proofs(events):
        for code, why in (e.details.get("confirmed") or {}).items():
            confirmed.setdefault(str(code), (e.step, str(why)))
        for code in e.details.get("ruled_out") or {}:
            ruled_out[str(code)] = max(e.step, ruled_out.get(str(code), e.step))
    kept = {code: why for code, (step, why) in confirmed.items()
            if ruled_out.get(code, step) <= step}
    return kept, set(ruled_out) - set(kept)


def window_proven(events: list[Event]) -> set[str]:
    """Causes a window replay confirmed (the LR lowered on every step from a good state healed
    the divergence): ranked even without a vote, since the steps of an LR that built the damage
    up looked normal one by one. A single-step proof's cause without votes is not: a fix such
    as a smaller LoRA scaling can heal a step whatever broke it; nor is the cause a warning's
    proof confirmed (its window was of healthy steps, where a lower LR calms any growth)."""
    return {str(code) for e in _proofs(events)
            if e.details.get("window") and not e.details.get("warned")
            for code in e.details.get("confirmed") or {}}


def _proofs(events: list[Event]) -> list[Event]:
    return [e for e in events
            if Tag.PROOF in event_kind(e.kind).tags and e.details.get("reproduced")]


def _vote_lr_changes(votes: _Votes, events: list[Event], serious: list[Event]) -> bool:
    """Votes for an LR change followed by trouble; whether there was one."""
    lr_kinds = kinds_tagged(Tag.LR)
    lr_changed = False
    for change in (e for e in events if e.kind in lr_kinds):
        after = [e for e in serious if change.step <= e.step <= change.step + LR_CHANGE_WINDOW]
        if after:
            lr_changed = True
            votes.add("lr_too_high", LR_CHANGE_WEIGHT,
                      f"{change.message}; then {after[0].kind} at step {after[0].step}")
    return lr_changed


def _vote_findings(votes: _Votes, findings: list[Finding], kinds: set[str]) -> None:
    """The preflight's and runtime's findings (runs of bad batches aside)."""
    instability = kinds & kinds_tagged(Tag.INSTABILITY)
    for f in findings:
        weight = STANDING_FAULT_WEIGHT if f.cause in STANDING_FAULTS else FINDING_WEIGHT[f.severity]
        if f.cause in CONFIG_CAUSES and not instability:
            weight *= 0.25  # a bad setting explains instability, not a sudden NaN mid-run
        votes.add(f.cause, weight, f.message, f.fix)


def _against_lr(data_runs: list[tuple[Finding, str]], symptoms: list[Event],
                serious: list[Event]) -> str:
    """Why the trouble is the data's rather than the LR's, where the run shows it: it began
    with a run of bad batches, or the data comes ordered by label (`batch_label_order`: the
    loss's jumps at each change of class, and a model that predicts the class of the moment,
    are that order's; not trouble at the first step, which has seen one batch, nor a
    non-finite value, which no order makes); "" otherwise."""
    if data_runs and symptoms and min(e.step for e in symptoms) >= min(
            r.evidence["first_step"] for r, _ in data_runs):
        return "the trouble began with a run of bad batches"
    nonfinite = kinds_tagged(Tag.NONFINITE)
    if (any(e.details.get("cause") == "unshuffled_data" for e in serious) and symptoms
            and min(e.step for e in symptoms) >= 1
            and not any(e.kind in nonfinite for e in serious)):
        return ORDERED
    return ""


ORDERED = "the data comes ordered by label: the model is trained one class at a time"
"""Why trouble is the data order's: a first loss that collapses on the first class (read as a
bad start), jumps at each change of class (read as an LR too high) are what it does."""


def _vote_batch_events(votes: _Votes, serious: list[Event],
                       data_runs: list[tuple[Finding, str]],
                       specific: dict[int, list[Event]]) -> set[str]:
    """Votes of the batch inspector's events; the causes they named."""
    batch_kinds = kinds_tagged(Tag.BATCH)
    batch_causes = set()
    for e in serious:
        cause = e.details.get("cause") if e.kind in batch_kinds else None
        if cause:
            batch_causes.add(cause)
            if any(_in_run(e, r) for r, _ in data_runs):
                continue  # the first batch of a run: the run votes for it
            # a normalisation mismatch shows from the first batch; later it is one odd batch
            weight = (BATCH_FINDING_WEIGHT if cause != "input_scale" or e.step == 0 else 1.0)
            why = f"step {e.step}: {_message(e)}"
            explained = ([o for o in specific.get(e.step, []) if _same_field(o, e)]
                         if cause == GENERIC_BATCH_CAUSE else [])
            if explained:  # the field is extreme for a reason another finding names
                _explain(votes, explained, weight, f"step {e.step}: {e.kind} on "
                         f"{e.param or 'a field'}")
            else:
                votes.add(cause, weight, why)
    return batch_causes


def _vote_nonfinite(votes: _Votes, serious: list[Event], findings: list[Finding],
                    batch_causes: set[str], *, batches: bool) -> None:
    """Non-finite values that no batch explains, in training or only in an evaluation."""
    kinds = {e.kind for e in serious}
    nonfinite = kinds & kinds_tagged(Tag.NONFINITE)
    overflow = kinds & kinds_tagged(Tag.OVERFLOW)
    if nonfinite and not batch_causes & NONFINITE_BATCH_CAUSES:
        replayed = next((e.details.get("replay") for e in serious if e.details.get("replay")),
                        None)
        if overflow:
            votes.add("fp16_overflow", 3.0, "non-finite values with float16 values at the limit")
        elif any(f.check == "precision" for f in findings):
            votes.add("optimizer_eps", 1.5, "non-finite values while float16 weights are trained")
        else:
            where = (f" (replay: first non-finite output in {replayed['first_nonfinite_module']})"
                     if replayed and replayed.get("first_nonfinite_module") else "")
            bad = [e for e in serious if e.kind in nonfinite]
            what = _went_nonfinite(serious, bad[0].step)
            votes.add("numerical_op", 2.0, (_nonfinite_batch_evidence(bad, serious) if batches
                                            else f"{what} turned non-finite at step "
                                                 f"{bad[0].step}") + where)
            short = "loss" if what == "the loss" else "values"
            votes.add("nonfinite_input", 0.5, f"non-finite {short} (check the batch)" if batches
                      else f"non-finite {short} (the inputs can be the cause)")
    evals = [e for e in serious if _nonfinite_eval(e)]
    if evals and not nonfinite:  # only an evaluation went non-finite: say which metric
        votes.add("numerical_op", 1.0, f"{_went_nonfinite(serious, evals[0].step)} turned "
                  f"non-finite at step {evals[0].step} while the training loss stayed finite")


def _vote_event_kinds(votes: _Votes, serious: list[Event], no_warmup: bool) -> None:
    """The votes each kind casts (registry), a collapsed gradient, a bad start, bad state."""
    kinds = {e.kind for e in serious}
    if not _precursor_came_first(serious):
        kinds.discard(Kind.INSTABILITY_PRECURSOR)
    _vote_stalls(votes, serious)
    for entry in event_kinds():  # votes a kind casts once whenever it appears
        if entry.name in kinds:
            for vote in entry.votes:
                if not vote.each_event:
                    votes.add(vote.cause, vote.weight, vote.why)
    start = kinds_tagged(Tag.START)
    for e in serious:
        if e.kind in start and e.details.get("cause") == "bad_init":
            # the loss profile of an over-scaled new layer
            votes.add("bad_init", 3.0, f"step {e.step}: {e.message}")
            votes.add("input_scale", 0.5, f"step {e.step}: the first losses were far too high")
        elif e.kind in start and e.details.get("sustained"):  # and it did not fade
            votes.add("lr_too_high", 2.0, f"step {e.step}: {e.message}")
        elif e.kind in start:  # blown up by the first updates, and stayed up
            votes.add("lr_too_high", 1.5, f"step {e.step}: {e.message}")
            votes.add("missing_warmup", 1.5 if no_warmup else 0.3,
                      f"step {e.step}: the first updates blew the run up"
                      + (" on a schedule without warmup" if no_warmup else ""))
        for vote in event_kind(e.kind).votes:  # direct measurements: every event votes
            if vote.each_event:
                votes.add(vote.cause, vote.weight, vote.evidence(e.step, e.message))
    _vote_attention(votes, serious)
    _vote_measured_causes(votes, serious)
    if kinds & kinds_tagged(Tag.STATE):
        votes.add("optimizer_eps", 1.0, "weights or optimizer moments became non-finite/extreme")
        votes.add("lr_too_high", 0.5, "weights or optimizer moments became non-finite/extreme")


STALL_WEIGHT = 3.0
"""A stall whose run showed why (the LR at 0, no gradient, a loss at chance while the weights
move) measured its cause over a hundred steps: as strong as a direct measurement."""
STALL_UNEXPLAINED = (("lr_too_high", 1.0, "the loss did not come down"),
                     ("lr_too_low", 1.0, "the loss did not come down: an LR too low moves "
                                         "nothing"))
"""What a stall whose run showed no reason says: the LR, one way or the other."""


def _vote_stalls(votes: _Votes, serious: list[Event]) -> None:
    """A stall votes for the cause its run showed (`details["cause"]`, `detect/stall_reason.py`),
    else for the LR either way. A stall recorded before stalls gave their reason (no
    `details["reason"]`) says what it said then: a collapsed gradient norm is the LR's, and a
    loss that did not come down may carry no gradient."""
    for e in serious:
        if e.kind not in kinds_tagged(Tag.STALL):
            continue
        cause = e.details.get("cause")
        if cause is None and e.details.get("grad_collapse"):
            cause = "lr_too_high"
        if isinstance(cause, str) and cause in CAUSES:
            votes.add(cause, STALL_WEIGHT, f"step {e.step}: {e.message}")
            continue
        for code, weight, why in STALL_UNEXPLAINED:
            votes.add(code, weight, why)
        if "reason" not in e.details:
            votes.add("no_gradients", 0.5, "a loss that does not come down may carry no gradient")


MEASURED_CAUSE_WEIGHT = 2.0
"""What the run showed with the event tells its cause: a KL blow-up's timing
(`detect/kl_blowup.py`: after a long drift at an LR that did not rise, a penalty too weak; in the
first updates or after the LR rose, the LR), truncated completions' reward (rising: they need
room; not: the policy stopped ending them). It outweighs the kind's standing order."""
MEASURED_CAUSE = frozenset({Kind.KL_BLOWUP, Kind.COMPLETIONS_TRUNCATED})


def _vote_measured_causes(votes: _Votes, serious: list[Event]) -> None:
    for e in serious:
        cause = e.details.get("cause") if e.kind in MEASURED_CAUSE else None
        if isinstance(cause, str) and cause in CAUSES:
            votes.add(cause, MEASURED_CAUSE_WEIGHT, f"step {e.step}: {e.message}")


ATTENTION_SIGNAL = "attn_logit_max"
ATTENTION_WEIGHT = 2.0
"""A warning from the attention logits, before any other finding, measures the mechanism (and
names its own fix, QK-norm): as strong as a jump early in the run, but not above a preflight
warning on the LR, which says what let the logits grow. With that warning the LR leads and the
mechanism comes second (on the suite's GPT-2 faults at LRs far above their range the attention
warning comes first of all events; weighed above the LR it ranked the mechanism first on three
runs labelled by their LR, to name it first on one labelled by its mechanism); without it,
the mechanism leads."""
ATTENTION_AFTER_WEIGHT = 1.0
"""The same warning after the trouble showed: logits thrown up by the damage say little."""


def _vote_attention(votes: _Votes, serious: list[Event]) -> None:
    """An `instability_precursor` warning read from the attention logits votes for their
    growth (`detect/attention_logits.py`)."""
    warned = next((e for e in serious if e.kind == Kind.INSTABILITY_PRECURSOR
                   and e.details.get("signal") == ATTENTION_SIGNAL), None)
    if warned is None:
        return
    others = [e.step for e in serious if e.kind != Kind.INSTABILITY_PRECURSOR]
    first = not others or warned.step < min(others)
    votes.add("attention_logit_growth", ATTENTION_WEIGHT if first else ATTENTION_AFTER_WEIGHT,
              f"step {warned.step}: {warned.message}")


def _precursor_came_first(serious: list[Event]) -> bool:
    """Whether an `instability_precursor` warning came before any other finding: a moment
    lagging the gradient ahead of the trouble speaks for the LR, one raised after the trouble
    showed (the weights an outlier batch or a bad shard has just thrown off) is the damage, and
    says nothing of the cause."""
    warned = [e.step for e in serious if e.kind == Kind.INSTABILITY_PRECURSOR]
    others = [e.step for e in serious if e.kind != Kind.INSTABILITY_PRECURSOR]
    return bool(warned) and (not others or min(warned) < min(others))


def _vote_climb(votes: _Votes, events: list[Event], serious: list[Event]) -> None:
    """A loss that climbed, or an output that shrank to nothing while it did not."""
    kinds = {e.kind for e in serious}
    climb = kinds_tagged(Tag.CLIMB)
    shrunk = next((e for e in events if e.kind in kinds_tagged(Tag.COLLAPSE)
                   and e.details.get("how") == "collapsed"), None)
    if shrunk is not None and not kinds & climb:
        # a continuous output that shrank to nothing while the loss did not climb: the model
        # did what its targets asked
        votes.add("label_problem", 3.0, f"step {shrunk.step}: {shrunk.message}, while the loss "
                  "did not climb: the targets ask for it")
    if kinds & climb:  # a slow climb, not a first-steps blow-up: the LR itself
        votes.add("lr_too_high", 1.0, "the smoothed loss climbed and stayed up")
        bent = next((e for e in serious if e.kind in climb and e.details.get("accelerating")),
                    None)
        if bent is not None:  # the loss's second derivative was positive: it accelerated up
            votes.add("lr_too_high", 0.5, f"step {bent.step}: the loss climbed with a positive "
                      "curvature (accelerating upwards), as updates too large do")


def _vote_jumps(votes: _Votes, serious: list[Event], findings: list[Finding],
                specific: dict[int, list[Event]], no_warmup: bool,
                lr_cut_at: int | None, scaled: set[int], raises: list[int]) -> None:
    """Spikes and explosions: where and when they happened says whose doing they were. A jump
    after the recover policy cut the LR far down (`lr_cut_at`) is no vote for too high an LR:
    that LR would have stopped it (`_weigh_down_lr` counts it against the LR). A jump at a step
    whose loss stood beyond what the model's scores allow (`scaled`) is the loss's reduction:
    nothing the model read or did gives that loss. A single jump right after the LR rose far
    (`raises`, the steps of those rises) is hardly an odd batch."""
    early = min(e.step for e in serious) < EARLY_STEPS
    climb = kinds_tagged(Tag.CLIMB)
    jump_kinds = kinds_tagged(Tag.JUMP)
    jumps = [e for e in serious if e.kind in jump_kinds]
    # a jump in an adapter points at LoRA's scaling only when the audit found it high (alpha/r
    # above 2): at 1-2 the adapters step like any weight, and the jump is someone else's doing
    high_scaling = any(f.cause == "lora_scaling" for f in findings)
    for e in jumps:
        if e.step in scaled:
            votes.add(SCALED_CAUSE, 1.5, f"step {e.step}: {e.kind} with the loss beyond what the "
                      "model's class scores allow")
            continue
        param = e.param or ""
        if "lora_" in param and high_scaling:
            votes.add("lora_scaling", 1.5, f"step {e.step}: {e.kind} in LoRA adapter {param}")
        if any(f.check == "layer_init" and f.evidence.get("param") == param for f in findings):
            votes.add("bad_init", 2.0, f"step {e.step}: {e.kind} in the badly initialised {param}")
        single = e.kind not in climb and not [
            o for o in jumps if o is not e and abs(o.step - e.step) > 5]
        if e.step == 0:
            # before any update: the initial weights or the data, not the learning rate
            votes.add("bad_init", 1.5, f"step 0: {e.kind} before any update was applied")
            votes.add("input_scale", 0.5, f"step 0: {e.kind} before any update was applied")
        elif not early and single and e.step in specific:
            # the generic "one odd batch" is what the inspector found wrong with that batch
            _explain(votes, specific[e.step], 1.5,
                     f"step {e.step}: a single {e.kind} late in the run, on that batch")
        elif not early and single:
            raised = any(r < e.step <= r + RAISE_SHOWS for r in raises)
            votes.add(GENERIC_BATCH_CAUSE, RAISED_BATCH_WEIGHT if raised else 1.5,
                      f"step {e.step}: a single {e.kind} late in the run"
                      + (", just after the LR rose" if raised else ""))
        elif early and any(r < e.step for r in raises):
            # the steps before the loop raised the LR went well: the raise, not the start
            votes.add("lr_too_high", 1.0, f"step {e.step}: {e.kind} after the LR rose")
        elif early:
            votes.add("lr_too_high", 1.0, f"step {e.step}: {e.kind} early in the run")
            votes.add("missing_warmup", 2.0 if no_warmup else 0.3,
                      f"step {e.step}: {e.kind} in the first steps"
                      + (" of a schedule without warmup" if no_warmup else ""))
            votes.add("bad_init", 0.3, f"step {e.step}: {e.kind} early in the run")
        elif lr_cut_at is None or e.step <= lr_cut_at:
            votes.add("lr_too_high", 1.0, f"step {e.step}: repeated {e.kind}")


SCALED_CAUSE = "loss_reduction"
"""A loss scaled, summed or divided outside the model: what raised it is the loss's own
arithmetic, not anything the model read or computed."""
BEYOND_WEIGHT = BATCH_FINDING_WEIGHT
"""A loss beyond the most a cross-entropy of the model's own class scores could cost at the
step (`diagnose/loss_bound.py`) is measured at that step as directly as a batch finding: no
cause that acts through the model (its inputs, its weights) can give it."""
SCALED_JUMP_RATIO = 100.0
"""Without that ceiling: a loss that jumped by two orders of magnitude or more in one step..."""
SCALED_JUMP_BAND = 10.0
"""...with the gradient norm jumping within this factor of the loss's jump (a factor on the
loss multiplies every gradient by itself)..."""
SCALED_JUMP_WEIGHT = 1.0
"""...is weaker evidence, below the generic reading of one odd batch: a batch far out of scale
moves both alike too (its batch finding, when the batch was inspected, takes the step)."""
REPLAY_DIFFERS_WEIGHT = 1.0
"""A replay of the step on the state from before it, which did not give the loss the run
recorded (`details["replay_differs"]` on a proof): the loss handed over is not what the model
and its loss function compute. A loop's own loss arithmetic does that, faulty or not."""


def _vote_loss_scale(votes: _Votes, serious: list[Event], events: list[Event],
                     batch_kinds: frozenset[str]) -> set[int]:
    """Evidence that the loss was scaled, summed or divided outside the model; returns the
    steps whose loss stood beyond what the model's class scores allow."""
    beyond_steps: set[int] = set()
    for e in serious:
        ceiling = e.details.get(CEILING_KEY)
        if e.value is not None and isinstance(ceiling, (int, float)) and beyond(e.value, ceiling):
            beyond_steps.add(e.step)
            votes.add(SCALED_CAUSE, BEYOND_WEIGHT, f"step {e.step}: {describe(e.value, ceiling)}"
                      ": it was not computed from them alone")
    # a jump told again where it did not come back is the jump of its own step
    spikes = {int(e.details.get("jump_step", e.step)): e for e in serious
              if e.kind == Kind.LOSS_SPIKE and CEILING_KEY not in e.details}
    explained = {e.step for e in serious if e.kind in batch_kinds and e.details.get("cause")}
    for e in serious:
        step = int(e.details.get("jump_step", e.step))
        spike = spikes.get(step)
        if (e.kind != Kind.GRAD_EXPLOSION or spike is None or step in explained
                or step in beyond_steps):
            continue
        loss_ratio, grad_ratio = spike.details.get("ratio"), e.details.get("ratio")
        if (isinstance(loss_ratio, (int, float)) and isinstance(grad_ratio, (int, float))
                and loss_ratio >= SCALED_JUMP_RATIO
                and loss_ratio / SCALED_JUMP_BAND <= grad_ratio <= loss_ratio * SCALED_JUMP_BAND):
            votes.add(SCALED_CAUSE, SCALED_JUMP_WEIGHT, f"step {e.step}: the loss jumped "
                      f"{loss_ratio:.3g}x in one step and the gradient norm {grad_ratio:.3g}x "
                      "with it, as a factor on the loss does")
    for e in events:
        if Tag.PROOF in event_kind(e.kind).tags and e.details.get("replay_differs"):
            votes.add(SCALED_CAUSE, REPLAY_DIFFERS_WEIGHT, f"step {e.step}: the step replayed "
                      "did not give the loss the run recorded: the loss handed over is not what "
                      "the model computes")
    return beyond_steps


def _weigh_down_lr(votes: _Votes, events: list[Event], symptoms: list[Event],
                   data_runs: list[tuple[Finding, str]], batch_causes: set[str],
                   against_lr: str, *, lr_changed: bool) -> None:
    """Trouble that outlasted an LR cut, or began with bad batches, is the data's, not the LR's
    (unless an LR change came just before the trouble)."""
    outlasted, skipped = _outlasted_lr_cut(events, symptoms)
    if outlasted:
        data = sorted({c for _, c in data_runs}) or sorted(batch_causes)
        if skipped:  # back after the blamed batch was kept out: in every batch, not in one
            data = [c for c in data if c != GENERIC_BATCH_CAUSE] or [PERSISTENT_DATA_CAUSE]
            if GENERIC_BATCH_CAUSE in votes.score:
                votes.score[GENERIC_BATCH_CAUSE] *= DATA_DISCOUNT
                votes.evidence[GENERIC_BATCH_CAUSE].insert(0, f"weighed down: {outlasted}")
        for code in data or [GENERIC_BATCH_CAUSE]:
            votes.add(code, 2.0 / max(len(data), 1), outlasted)
        against_lr = against_lr or outlasted
    if against_lr and not lr_changed:
        for code in CONFIG_CAUSES if against_lr == ORDERED else ("lr_too_high", "missing_warmup"):
            if code in votes.score:
                votes.score[code] *= DATA_DISCOUNT
                votes.evidence[code].insert(0, f"weighed down: {against_lr}")


def _ranked(votes: _Votes, top: int, fixes: Mapping[str, str],
            confirmed: dict[str, str] | None = None,
            ruled_out: set[str] | frozenset[str] = frozenset()) -> list[RankedCause]:
    """Causes by votes; those a replay confirmed first (with the sentence that proves them),
    those it ruled out left out."""
    confirmed = {c: why for c, why in (confirmed or {}).items() if c in votes.score}
    score = {c: s for c, s in votes.score.items() if c in confirmed or c not in ruled_out}
    proved = sorted((c for c in score if c in confirmed), key=lambda c: -score[c])
    voted = sorted((c for c in score if c not in confirmed), key=lambda c: -score[c])
    out = []
    for group, share in ((proved, CONFIRMED_SHARE), (voted, 1 - CONFIRMED_SHARE if proved
                                                      else 1.0)):
        total = sum(score[c] for c in group) or 1.0
        for code in group:
            evidence = (([confirmed[code]] if code in confirmed else [])
                        + votes.evidence.get(code, []))
            out.append(RankedCause(code=code, confidence=share * score[code] / total,
                                   score=score[code], evidence=evidence,
                                   fix=_fix(votes, code, fixes),
                                   proof="confirmed" if code in confirmed else ""))
    return out[:top]


def _bad_runs(votes: _Votes, runs: list[Finding],
              symptoms: list[Event]) -> list[tuple[Finding, str]]:
    """Runs of consecutive bad batches during which (or soon after which) the trouble showed:
    each votes for the data. An outlier field that lasts to the last batch inspected is a change
    of the data's scale rather than outliers."""
    out = []
    for run in runs:
        first, last = run.evidence["first_step"], run.evidence["last_step"]
        during = [e for e in symptoms if first <= e.step <= last + RUN_GRACE]
        if not during or run.cause not in CAUSES:
            continue
        cause = run.cause
        if (cause == GENERIC_BATCH_CAUSE and run.evidence.get("ongoing")
                and run.evidence["batches"] >= LASTING_RUN):
            cause = "input_scale"
        votes.add(cause, RUN_WEIGHT, f"{run.message}; {during[0].kind} at step {during[0].step}"
                  + (" while they lasted" if during[0].step <= last else " after them"))
        out.append((run, cause))
    return out


def _in_run(event: Event, run: Finding) -> bool:
    """Whether a batch event is one of the batches of a run (its finding, its field)."""
    return (event.kind == run.evidence["finding"] and event.param == run.evidence.get("field")
            and run.evidence["first_step"] <= event.step <= run.evidence["last_step"])


def _deep_lr_cuts(events: list[Event]) -> list[Event]:
    """The recover policy's LR cuts to `LR_CUT` or less."""
    cut_kinds = kinds_tagged(Tag.LR_CUT)
    return [e for e in events if e.kind in cut_kinds
            and isinstance(factor := e.details.get("lr_factor"), (int, float))
            and 0 <= factor <= LR_CUT]


def _first_lr_cut(events: list[Event]) -> int | None:
    """The step of the first deep LR cut (None: none)."""
    return min((e.step for e in _deep_lr_cuts(events)), default=None)


def _outlasted_lr_cut(events: list[Event], symptoms: list[Event]) -> tuple[str, bool]:
    """Evidence that the trouble came back right after the recover policy cut the LR far down
    ("" when it did not): an LR too high would have stopped; and whether that cut also kept
    the blamed data out (then no single batch brought the trouble back either)."""
    again_kinds = kinds_tagged(Tag.JUMP) | kinds_tagged(Tag.NONFINITE)
    for cut in _deep_lr_cuts(events):
        factor = cut.details["lr_factor"]
        again = next((e for e in symptoms if e.kind in again_kinds
                      and cut.step < e.step <= cut.step + RECUR_WINDOW), None)
        if again is not None:
            skipped = bool(cut.details.get("skipped_data"))
            return (f"step {again.step}: {again.kind} again after the LR was cut x{factor:g} "
                    + ("and the blamed data skipped " if skipped else "")
                    + f"at step {cut.step}: the LR was not what broke it"), skipped
    return "", False


def _nonfinite_eval(event: Event) -> bool:
    return event.kind == Kind.METRIC_COLLAPSE and event.details.get("rule") == "nonfinite"


def _went_nonfinite(events: list[Event], step: int) -> str:
    """What went non-finite at `step`, by name: "the loss" only when the loss did, else the
    gradients, else the evaluation metrics."""
    at = [e for e in events if e.step == step]
    if any(e.kind == Kind.NONFINITE_LOSS for e in at):
        return "the loss"
    if any(e.kind == Kind.NONFINITE_GRAD for e in at):
        return "the gradients"
    value = next((e.param for e in at if e.kind == Kind.NONFINITE_VALUE and e.param), None)
    if value is not None:  # a log without a loss: the value that went non-finite, by name
        return value
    metrics = [str(e.details.get("metric") or e.param) for e in at if _nonfinite_eval(e)]
    if metrics:
        return ("eval metric " if len(metrics) == 1 else "eval metrics ") + ", ".join(metrics)
    return "a value"


def _nonfinite_batch_evidence(nonfinite: list[Event], events: list[Event]) -> str:
    """What is known of the batch of a non-finite step: a finite batch only when it was
    inspected on the rank(s) that went bad."""
    checked = next((e for e in nonfinite if e.details.get("batch") == "finite"), None)
    if checked is not None:
        ranks = checked.details.get("ranks")
        whose = (" and ".join(f"rank {r}'s" for r in ranks) + " batch" if ranks
                 else "its batch")
        return (f"{_went_nonfinite(events, checked.step)} turned non-finite at step "
                f"{checked.step} with {whose} inspected and finite")
    first = nonfinite[0]
    return (f"{_went_nonfinite(events, first.step)} turned non-finite at step {first.step} "
            "(its batch was not inspected)")


def _message(event: Event) -> str:
    return event.message.split(" Fix:")[0]


def _specific_batch_findings(serious: list[Event], batch_kinds: frozenset[str],
                             ) -> dict[int, list[Event]]:
    """Per step, the batch findings that name a cause of their own (not the generic outlier)."""
    out: dict[int, list[Event]] = defaultdict(list)
    for e in serious:
        cause = e.details.get("cause") if e.kind in batch_kinds else None
        if cause in CAUSES and cause != GENERIC_BATCH_CAUSE:
            out[e.step].append(e)
    return out


def _same_field(a: Event, b: Event) -> bool:
    """Whether two batch findings may be about the same field (an unnamed field may be any)."""
    return a.param is None or b.param is None or a.param == b.param


def _explain(votes: _Votes, findings: list[Event], weight: float, why: str) -> None:
    """Give the weight of a generic outlier explanation to the causes the specific findings of
    the same batch name, shared among them: the same symptom is explained once."""
    for finding in findings:
        votes.add(finding.details["cause"], weight / len(findings),
                  f"{why}, explained by its {finding.kind}")


def _fix(votes: _Votes, code: str, fixes: Mapping[str, str]) -> str:
    """A finding's own fix, else the run's, else the catalogue's."""
    return votes.fixes.get(code) or fixes.get(code) or CAUSES[code].fix


def _configuration_risks(findings: list[Finding], top: int,
                         fixes: Mapping[str, str]) -> list[RankedCause]:
    votes = _Votes()
    for f in findings:
        if at_least(f.severity, "warning"):
            votes.add(f.cause, FINDING_WEIGHT[f.severity],
                      f"no symptom detected; found in the configuration: {f.message}", f.fix)
            if f.cause == "missing_warmup":  # a missing warmup hurts when the LR is high
                votes.add("lr_too_high", 0.3 * FINDING_WEIGHT[f.severity],
                          "no symptom detected; without warmup the full LR acts from the "
                          "first step")
    why = warmup_would_do(findings)
    if why and votes.score.get("lr_too_high") and votes.score.get("missing_warmup"):
        # both risks found: at an LR the model takes behind a warmup, the warmup is the one to fix
        moved = WARMUP_SHIFT * votes.score["lr_too_high"]
        votes.score["lr_too_high"] -= moved
        votes.add("missing_warmup", moved, f"no symptom detected; {why}: a warmup is the fix")
    total = sum(votes.score.values())
    ranked = sorted(votes.score.items(), key=lambda item: -item[1])[:top]
    return [RankedCause(code=code, confidence=NO_SYMPTOM_SHARE * score / total, score=score,
                        evidence=votes.evidence[code],
                        fix=_fix(votes, code, fixes)) for code, score in ranked]
