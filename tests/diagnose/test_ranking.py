"""Cause ranking combines events, findings and replay into ranked causes with evidence and fixes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import trainguard
from trainguard.diagnose.finding import Finding
from trainguard.diagnose.ranking import RankedCause, rank_causes
from trainguard.events import Event

from ..conftest import make_setup, torch_threads
from ..test_guard import train


def event(kind: str, step: int, severity: str = "error", **details) -> Event:
    return Event(kind=kind, step=step, severity=severity, message=kind, details=details)


def codes(ranked) -> list[str]:
    return [c.code for c in ranked]


def test_a_healthy_run_with_a_sane_configuration_has_no_diagnosis() -> None:
    note = Finding("clipping", "info", "no clipping", "clip")
    assert rank_causes([], []) == []
    assert rank_causes([event("loss_spike", 40, "info")], [note]) == []


def test_a_nan_batch_beats_configuration_findings() -> None:
    events = [event("nonfinite_loss", 80), event("nonfinite_grad", 80),
              event("batch_nonfinite", 80, cause="nonfinite_input")]
    lr = Finding("mode_and_lr", "error", "LR high", "lower it", cause="lr_too_high")
    ranked = rank_causes(events, [lr])
    assert codes(ranked)[0] == "nonfinite_input"
    assert ranked[0].confidence > 0.5 and ranked[0].evidence and ranked[0].fix


def test_a_nan_with_a_clean_batch_points_at_a_numerical_op() -> None:
    replayed = {"first_nonfinite_module": "loss_head"}
    ranked = rank_causes([event("nonfinite_loss", 60, replay=replayed)])
    assert codes(ranked)[0] == "numerical_op"
    assert "loss_head" in ranked[0].evidence[0]


def test_an_explosion_at_step_zero_is_not_the_learning_rate() -> None:
    init = Finding("layer_init", "error", "head std 100", "std 0.02", cause="bad_init",
                   evidence={"param": "head.weight"})
    lr = Finding("mode_and_lr", "error", "LR high", "lower it", cause="lr_too_high")
    explosion = Event("grad_explosion", 0, "error", "big", param="head.weight")
    assert codes(rank_causes([explosion], [init, lr]))[0] == "bad_init"


def test_early_instability_without_warmup_points_at_warmup() -> None:
    warmup = Finding("warmup", "warning", "no warmup", "warm up", cause="missing_warmup")
    ranked = rank_causes([event("loss_spike", 1, "warning")], [warmup])
    assert codes(ranked)[0] == "missing_warmup"
    assert codes(rank_causes([event("loss_spike", 1, "warning")]))[0] == "lr_too_high"


def test_a_single_late_spike_is_an_outlier_batch() -> None:
    ranked = rank_causes([event("grad_explosion", 120), event("loss_spike", 120, "warning")])
    assert codes(ranked)[0] == "outlier_batch"


def test_jumps_just_after_the_lr_rose_are_the_rise_not_an_odd_batch() -> None:
    """The recover policy rolled back at once after the loop raised the LR 1e5-fold, and the LR
    it cut was still far too high: the jumps came back two steps later. Jumps that close
    together are a single one, which late in a run points at an odd batch, but not right after
    the LR rose: the rise is first, the batch stays a candidate (a replay can rule it out)."""
    raised = Event(kind="lr_change", step=60, severity="info", message="LR x100000 at step 60",
                   details={"ratio": 1e5})
    jumps = [event("grad_explosion", 61), event("loss_spike", 61),
             event("grad_explosion", 63), event("loss_spike", 63)]
    cut = Event(kind="rollback", step=61, severity="warning", message="rolled back",
                details={"lr_factor": 0.05, "skipped_data": []})
    ranked = codes(rank_causes([raised, jumps[0], jumps[1], cut, *jumps[2:]], top=100))
    assert ranked[0] == "lr_too_high" and "outlier_batch" in ranked
    # ...and without the rise the same jumps are still an odd batch's
    assert codes(rank_causes([jumps[0], jumps[1], cut, *jumps[2:]]))[0] == "outlier_batch"


def test_a_precursor_after_a_late_spike_leaves_it_an_outlier_batch() -> None:
    spike = [event("grad_explosion", 120), event("loss_spike", 120, "warning")]
    after = rank_causes([*spike, event("instability_precursor", 123, "warning")])
    assert codes(after)[0] == "outlier_batch"  # the damage, not the cause
    assert codes(after) == codes(rank_causes(spike))


def test_a_precursor_before_the_spike_votes_for_the_learning_rate() -> None:
    def score(events: list[Event]) -> float:
        return next((c.score for c in rank_causes(events) if c.code == "lr_too_high"), 0.0)

    spike = [event("grad_explosion", 120), event("loss_spike", 120, "warning")]
    before = score([event("instability_precursor", 114, "warning"), *spike])
    assert before == pytest.approx(score(spike) + 1.5)
    alone = rank_causes([event("instability_precursor", 114, "warning")])
    assert codes(alone)[0] == "lr_too_high"


LORA_PARAM = "base_model.model.h.0.attn.c_attn.lora_B.default.weight"


def test_lora_parameters_in_the_evidence_point_at_a_high_lora_scaling() -> None:
    spike = Event("grad_explosion", 30, "error", "big", param=LORA_PARAM)
    high = Finding("lora_scaling", "warning", "alpha/r 8", "lower alpha", cause="lora_scaling",
                   evidence={"scaling": 8.0})
    ranked = rank_causes([spike], [high])
    assert "lora_scaling" in codes(ranked)[:2]
    assert any("LoRA adapter" in why for why in ranked[codes(ranked).index(
        "lora_scaling")].evidence)


@pytest.mark.parametrize("alpha", [8, 16])  # alpha/r 1 and 2
def test_a_lora_scaling_of_at_most_2_never_votes_lora_scaling(alpha: int) -> None:
    from .test_preflight import gpt2_lora

    model = gpt2_lora(r=8, alpha=alpha)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    findings = trainguard.preflight(model, optimizer)
    events = [Event("grad_explosion", step, "error", "big", param=LORA_PARAM)
              for step in (3, 30, 31)]
    assert "lora_scaling" not in codes(rank_causes(events, findings, top=20))
    assert "lora_scaling" not in codes(rank_causes(events, top=20))  # nor with no audit at all


@pytest.mark.parametrize("source", ["guard", "error"])
def test_the_guard_diagnoses_stores_and_raises_with_the_diagnosis(tmp_path, source) -> None:
    setup = make_setup()
    policy = "halt" if source == "error" else "protect"
    guard = trainguard.Guard(setup.model, setup.optimizer, run_dir=tmp_path,
                             config=trainguard.GuardConfig(policy=policy, sinks={"console": False}))
    train(guard, setup, 3)
    batch = {"tokens": setup.batch().float()}
    batch["tokens"][0, 0] = float("nan")
    loss = setup.model.loss(setup.batch()) * float("nan")
    loss.backward()
    if source == "error":
        with pytest.raises(trainguard.TrainingDiverged) as info:
            guard.step(loss, batch=batch)
        assert info.value.diagnosis[0].code == "nonfinite_input"
    else:
        guard.step(loss, batch=batch)
        assert guard.diagnose()[0].code == "nonfinite_input"
        guard.close()
    summary = trainguard.RunReader(tmp_path).summary()
    assert summary["diagnosis"][0]["code"] == "nonfinite_input"


def test_events_carry_their_likely_causes() -> None:
    setup = make_setup()
    guard = trainguard.Guard(setup.model, setup.optimizer,
                             config=trainguard.GuardConfig(sinks={"console": False}))
    train(guard, setup, 3)
    loss = setup.model.loss(setup.batch()) * float("nan")
    loss.backward()
    report = guard.step(loss, batch={"tokens": setup.batch()})
    for event in report.events:
        assert event.details["likely_causes"][0]["code"] == "numerical_op"


def test_without_symptoms_the_configuration_risks_are_the_diagnosis() -> None:
    lora = Finding("lora_scaling", "error", "alpha/r 64", "keep it <= 1", cause="lora_scaling")
    warmup = Finding("warmup", "warning", "no warmup", "add one", cause="missing_warmup")
    note = Finding("clipping", "info", "no clipping", "clip")
    ranked = rank_causes([], [warmup, lora, note])
    assert codes(ranked) == ["lora_scaling", "missing_warmup", "lr_too_high"]
    assert all(c.confidence <= 0.5 for c in ranked)  # no symptom: never confident
    assert "no symptom detected" in ranked[0].evidence[0]
    assert rank_causes([], [note]) == []


def test_a_bad_start_points_at_initialisation_or_at_the_learning_rate() -> None:
    assert codes(rank_causes([event("bad_start", 10, "warning", cause="bad_init")]))[0] \
        == "bad_init"
    blown_up = [event("bad_start", 10, "warning", cause="lr_too_high")]
    assert codes(rank_causes(blown_up))[:2] == ["lr_too_high", "missing_warmup"]
    no_warmup = Finding("warmup", "warning", "no warmup", "add one", cause="missing_warmup")
    assert codes(rank_causes(blown_up, [no_warmup]))[0] == "missing_warmup"
    stayed_up = [*blown_up, event("bad_start", 50, "warning", cause="lr_too_high", sustained=True)]
    assert codes(rank_causes(stayed_up, [no_warmup]))[0] == "lr_too_high"


def no_warmup_at(share: float, severity: str = "info") -> Finding:
    """The preflight's `warmup` finding of a run whose LR is `share` times what the model takes
    behind a warmup."""
    return Finding("warmup", severity, "no warmup", "add one", cause="missing_warmup",
                   evidence={"lr_share": share, "tolerated_lr": 0.05})


def test_a_blow_up_that_lasts_is_the_warmups_when_the_lr_is_one_the_model_takes() -> None:
    stayed_up = [event("loss_spike", 1, "warning"),
                 event("bad_start", 10, "warning", cause="lr_too_high"),
                 event("bad_start", 50, "warning", cause="lr_too_high", sustained=True)]
    ranked = rank_causes(stayed_up, [no_warmup_at(0.4)])
    assert codes(ranked)[:2] == ["missing_warmup", "lr_too_high"]
    assert any("0.4x the most this model takes behind a warmup" in why
               for why in ranked[0].evidence)
    # far above what a warmup makes bearable, the LR itself is at fault
    assert codes(rank_causes(stayed_up, [no_warmup_at(20.0)]))[0] == "lr_too_high"
    # trouble that began late is not the first steps' doing, warmup or not
    late = [event("loss_spike", 300, "warning"), event("grad_explosion", 300),
            event("loss_divergence", 320)]
    unknown = Finding("warmup", "info", "no warmup", "add one", cause="missing_warmup")
    assert [(c.code, c.score) for c in rank_causes(late, [no_warmup_at(0.4)])] \
        == [(c.code, c.score) for c in rank_causes(late, [unknown])]


def test_early_trouble_after_the_loop_raised_the_lr_is_the_raises() -> None:
    """A run without warmup whose loop raised the LR 1000x at step 10: the blow-up at step 11 is
    within the first steps, but the ten steps at the first LR went well; the raise, not the
    missing warmup, ranks first. The same blow-up with no raise is the warmup's."""
    blown = [event("grad_explosion", 11), event("loss_spike", 12),
             event("loss_divergence", 24)]
    raised = [event("lr_change", 10, "info"), *blown]
    assert codes(rank_causes(raised, [no_warmup_at(0.1)]))[0] == "lr_too_high"
    assert codes(rank_causes(blown, [no_warmup_at(0.1)]))[0] == "missing_warmup"


def test_a_precursor_at_an_lr_that_rose_since_the_first_steps_is_the_lrs() -> None:
    """Nothing but a precursor warning, in a run without warmup at an LR the model takes: at
    the first steps' LR it speaks for the missing warmup; at 15x that LR (a loop that kept
    raising it) for the LR."""
    no_warmup = Finding("warmup", "info", "no warmup", "add one", cause="missing_warmup",
                        evidence={"lr_share": 0.02, "tolerated_lr": 0.05,
                                  "lr_head": [1e-3] * 5})
    same = [event("instability_precursor", 22, "warning", lr=1e-3)]
    assert codes(rank_causes(same, [no_warmup]))[0] == "missing_warmup"
    rose = [event("instability_precursor", 129, "warning", lr=1.5e-2)]
    ranked = rank_causes(rose, [no_warmup])
    assert codes(ranked)[0] == "lr_too_high"
    assert not any("nothing but a precursor warning" in why
                   for c in ranked for why in c.evidence)
    # a warning without its LR (an older log) is read as before
    assert codes(rank_causes([event("instability_precursor", 129, "warning")],
                             [no_warmup]))[0] == "missing_warmup"


def test_a_missing_warmup_under_sgd_does_not_outvote_its_lr() -> None:
    blown_up = [event("bad_start", 10, "warning", cause="lr_too_high")]
    sgd = Finding("warmup", "info", "no warmup; a low risk here: SGD", "add one",
                  cause="missing_warmup", evidence={"optimizer": "SGD", "adaptive": False})
    assert codes(rank_causes(blown_up, [sgd]))[0] == "lr_too_high"
    adam = Finding("warmup", "info", "no warmup", "add one", cause="missing_warmup",
                   evidence={"optimizer": "AdamW", "adaptive": True})
    assert codes(rank_causes(blown_up, [adam]))[0] == "missing_warmup"


def test_with_no_symptom_the_warmup_is_the_risk_to_fix_at_an_lr_the_model_takes() -> None:
    lr = Finding("mode_and_lr", "warning", "LR high", "lower it", cause="lr_too_high")
    assert codes(rank_causes([], [lr, no_warmup_at(1.04, "warning")]))[0] == "missing_warmup"
    assert codes(rank_causes([], [lr, no_warmup_at(6.0, "warning")]))[0] == "lr_too_high"


def batch_event(kind: str, step: int, cause: str, field: str | None = "pixel_values") -> Event:
    return Event(kind=kind, step=step, severity="warning", message=f"{kind} Fix: fix it",
                 param=field, details={"cause": cause})


def test_a_specific_batch_finding_explains_a_late_spike_rather_than_an_outlier_batch() -> None:
    spike = [event("loss_spike", 40, "warning"), event("grad_explosion", 40)]
    images = batch_event("batch_image_range", 40, "input_scale")
    ranked = rank_causes([*spike, images])
    assert codes(ranked) == ["input_scale"]
    assert any("explained by its batch_image_range" in why for why in ranked[0].evidence)
    # the outlier finding of the same field is what the image range explains, too
    outlier = batch_event("batch_outlier", 40, "outlier_batch")
    assert codes(rank_causes([*spike, images, outlier])) == ["input_scale"]
    # an outlier in another field is not explained by it; nor is a spike at another step
    other = batch_event("batch_outlier", 40, "outlier_batch", field="mask")
    scores = {c.code: c.score for c in rank_causes([*spike, images, other])}
    assert scores["outlier_batch"] == 4.0 and scores["input_scale"] == 1.0 + 3.0
    later = [event("loss_spike", 90, "warning"), event("grad_explosion", 90)]
    assert codes(rank_causes([*later, images]))[0] == "outlier_batch"
    # several specific findings share the explanation
    nan = batch_event("batch_nonfinite", 40, "nonfinite_input", field="labels")
    scores = {c.code: c.score for c in rank_causes([*spike, images, nan])}
    assert scores["input_scale"] == 1.0 + 1.5 and scores["nonfinite_input"] == 4.0 + 1.5


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(),
                                      nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(16, 4)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(images))


@pytest.mark.parametrize("sample_every", [50, 5])  # 5: the outlier finding fires as well
def test_one_unnormalised_image_batch_is_diagnosed_as_input_scale(sample_every: int) -> None:
    """A plain loop with a Guard; the batch of step 40 holds images in [0, 255] where every other
    batch is in [0, 1] (a forgotten /255 on one path of the loader)."""
    torch.manual_seed(0)
    templates = torch.rand(4, 3, 16, 16)  # one pattern per class, so the task is learnable
    model = SmallCNN()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    guard = trainguard.Guard(model, optimizer, config=trainguard.GuardConfig(
        sinks={"console": False}, probes={"sample_every": sample_every}))
    with torch_threads(1):
        for step in range(60):
            generator = torch.Generator().manual_seed(step)
            labels = torch.randint(0, 4, (16,), generator=generator)
            noise = torch.rand(16, 3, 16, 16, generator=generator)
            images = (0.7 * templates[labels] + 0.3 * noise).clamp(0, 1)
            if step == 40:
                images = images * 255
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            guard.step(loss, batch={"pixel_values": images, "labels": labels})
            optimizer.zero_grad(set_to_none=True)
    kinds = {(e.kind, e.step) for e in guard.run.events}
    assert ("batch_image_range", 40) in kinds
    assert kinds & {("grad_explosion", 40), ("loss_spike", 40)}, "the batch made a spike"
    ranked = guard.diagnose()
    guard.close()
    assert ranked[0].code == "input_scale", [str(c) for c in ranked]
    assert "outlier_batch" not in codes(ranked)


# -- the data against the learning rate ------------------------------------------------------------
def data_event(kind: str, step: int, cause: str, severity: str = "warning",
                field: str = "x") -> Event:
    return Event(kind=kind, step=step, severity=severity, message=f"{kind} on {field}",
                 param=field, details={"cause": cause, "field": field})


def bad_run(first: int, last: int, *, ongoing: bool = False,
            finding: str = "batch_outlier", cause: str = "outlier_batch") -> Finding:
    return Finding("batch_run", "warning",
                   f"{last - first + 1} consecutive batches (steps {first}-{last}, data ids "
                   f"{first}-{last}) had {finding} on 'x'", "drop the shard", cause=cause,
                   evidence={"finding": finding, "field": "x", "first_step": first,
                             "last_step": last, "batches": last - first + 1,
                             "data_ids": list(range(first, last + 1)), "ongoing": ongoing})


def blow_up(at: int) -> list[Event]:
    """A huge batch's explosion, the output that blew up after it and the climb it left."""
    return [event("grad_explosion", at), event("loss_spike", at, "warning"),
            data_event("batch_outlier", at, "outlier_batch"),
            Event("output_collapse", at + 1, "warning", "the model's output exploded",
                  details={"how": "exploded"}),
            event("loss_divergence", at + 13)]


def test_without_a_run_of_bad_batches_a_lasting_blow_up_reads_as_the_lr() -> None:
    assert codes(rank_causes(blow_up(100)))[0] == "lr_too_high"


def test_a_bad_shard_is_the_data_and_names_its_batches() -> None:
    ranked = rank_causes(blow_up(100), [bad_run(100, 109)])
    assert codes(ranked)[0] == "outlier_batch" and ranked[0].confidence > 0.5
    assert "steps 100-109, data ids 100-109" in ranked[0].evidence[0]
    lr = next(c for c in ranked if c.code == "lr_too_high")
    assert lr.evidence[0] == "weighed down: the trouble began with a run of bad batches"


def test_inputs_that_stay_far_above_their_size_are_a_change_of_scale() -> None:
    ranked = rank_causes(blow_up(100), [bad_run(100, 299, ongoing=True)])
    assert codes(ranked)[0] == "input_scale"
    assert "lr_too_high" not in codes(ranked)[:1]


def test_a_run_of_bad_batches_after_the_trouble_began_does_not_clear_the_lr() -> None:
    events = [event("loss_spike", 50, "warning"), event("loss_divergence", 70), *blow_up(100)]
    ranked = rank_causes(events, [bad_run(100, 109)])
    lr = next(c for c in ranked if c.code == "lr_too_high")
    assert not any(e.startswith("weighed down") for e in lr.evidence)


def test_trouble_that_outlasts_a_cut_lr_is_not_the_lr() -> None:
    events = blow_up(100)
    for cut, factor in ((110, 0.05), (121, 0.0005)):
        events += [Event("rollback", cut, "warning", "rolled back", details={"lr_factor": factor}),
                   event("grad_explosion", cut + 1), event("loss_spike", cut + 1, "warning")]
    ranked = rank_causes(events)
    assert codes(ranked)[0] == "outlier_batch"
    assert any("again after the LR was cut x0.05 at step 110" in e for e in ranked[0].evidence)
    # a cut that was not far enough says nothing
    mild = [*blow_up(100), Event("rollback", 110, "warning", "rolled back",
                                 details={"lr_factor": 0.5}), event("grad_explosion", 111)]
    assert codes(rank_causes(mild))[0] == "lr_too_high"


def test_trouble_back_after_the_lr_was_cut_and_the_batch_skipped_is_in_every_batch() -> None:
    """The rollback cut the LR 20x and kept the blamed batch out, and the same trouble came back
    at the next step on other data: neither the LR nor one batch, the targets of every batch."""
    events = blow_up(100)
    for cut, factor in ((110, 0.05), (121, 0.0005)):
        events += [Event("rollback", cut, "warning", "rolled back",
                         details={"lr_factor": factor, "skipped_data": [cut - 10]}),
                   event("grad_explosion", cut + 1), event("loss_spike", cut + 1, "warning")]
    ranked = rank_causes(events)
    assert codes(ranked)[0] == "label_problem"
    assert any("again after the LR was cut x0.05 and the blamed data skipped at step 110" in e
               for e in ranked[0].evidence)
    # a batch finding that names the data's fault still names it
    assert codes(rank_causes(events, [bad_run(100, 299, ongoing=True)]))[0] == "input_scale"


def test_jumps_after_a_deep_lr_cut_are_no_votes_for_the_lr() -> None:
    """Four rollbacks, each cutting the LR further and keeping the blamed batch out, and the
    trouble back after each: the jumps under the cut LR count against the LR, not for it, however
    many there are (each used to vote "repeated" for the LR, and enough of them tied it with the
    data)."""
    events = blow_up(80)
    for cut, factor in ((90, 0.05), (101, 5e-4), (112, 5e-6), (123, 5e-8)):
        events += [Event("rollback", cut, "warning", "rolled back",
                         details={"lr_factor": factor, "skipped_data": [cut - 10]}),
                   event("grad_explosion", cut + 1), event("loss_spike", cut + 1, "warning")]
    ranked = rank_causes(events)
    assert codes(ranked)[0] == "label_problem"
    lr = next(c for c in ranked if c.code == "lr_too_high")
    assert not any("repeated" in e and "step 80" not in e for e in lr.evidence)
    # before any cut, the repeats still vote for the LR
    repeats = [*blow_up(80), event("grad_explosion", 91), event("grad_explosion", 102)]
    assert codes(rank_causes(repeats))[0] == "lr_too_high"


def test_a_nan_loss_with_every_label_ignored_is_the_labels() -> None:
    events = [event("nonfinite_loss", 120, batch="finite"),
              data_event("batch_labels", 120, "empty_loss", "error", "labels")]
    ranked = rank_causes(events)
    assert codes(ranked)[0] == "empty_loss" and ranked[0].confidence > 0.9
    assert "numerical_op" not in codes(ranked)


def test_a_finite_batch_is_claimed_only_when_it_was_inspected() -> None:
    [unknown] = [c for c in rank_causes([event("nonfinite_loss", 60)])
                 if c.code == "numerical_op"]
    assert unknown.evidence == ["the loss turned non-finite at step 60 (its batch was not "
                                "inspected)"]
    [checked] = [c for c in rank_causes([event("nonfinite_loss", 60, batch="finite")])
                 if c.code == "numerical_op"]
    assert checked.evidence == ["the loss turned non-finite at step 60 with its batch "
                                "inspected and finite"]
    on_rank = rank_causes([event("nonfinite_loss", 60, batch="finite", ranks=[1])])
    assert on_rank[0].evidence[0].endswith("with rank 1's batch inspected and finite")


def evidence(ranked) -> str:
    return " | ".join(line for cause in ranked for line in cause.evidence)


def test_the_evidence_names_what_went_non_finite() -> None:
    """"the loss turned non-finite" only when the loss did: NaN gradients beside a finite loss
    say so, and a NaN eval metric is named, with the training loss finite."""
    said = evidence(rank_causes([event("nonfinite_loss", 60), event("nonfinite_grad", 60)]))
    assert "the loss turned non-finite at step 60" in said
    said = evidence(rank_causes([event("nonfinite_grad", 60)]))
    assert "the gradients turned non-finite at step 60" in said and "loss" not in said
    nan_eval = Event(kind="metric_collapse", step=70, severity="error",
                     message="eval metric eval_loss is nan", param="eval_loss",
                     details={"metric": "eval_loss", "rule": "nonfinite"})
    said = evidence(rank_causes([nan_eval]))
    assert ("eval metric eval_loss turned non-finite at step 70 while the training loss stayed "
            "finite") in said
    assert "the loss turned" not in said


def test_a_nan_eval_metric_of_a_live_run_is_named_not_the_loss() -> None:
    setup = make_setup()
    guard = trainguard.Guard(setup.model, setup.optimizer, config=trainguard.GuardConfig(
        sinks={"console": False}))
    train(guard, setup, 20)
    [nan_eval] = guard.observe_eval({"eval_loss": float("nan"), "eval_accuracy": 0.5})
    assert nan_eval.message == "eval metric eval_loss is nan"
    said = evidence(guard.diagnose())
    assert "eval metric eval_loss turned non-finite at step 19" in said
    assert "the loss turned non-finite" not in said
    guard.close()


def proof(step: int, confirmed: dict[str, str], ruled_out: dict[str, str],
          reproduced: bool = True) -> Event:
    return Event(kind="proof", step=step, severity="info", message="replayed",
                 details={"confirmed": confirmed, "ruled_out": ruled_out,
                          "reproduced": reproduced})


def test_a_cause_confirmed_by_replay_ranks_first_and_a_ruled_out_one_drops_out() -> None:
    events = [event("loss_spike", 5, "warning"), event("grad_explosion", 5)]
    voted = rank_causes(events, [Finding("warmup", "warning", "no warmup", "warm up",
                                         cause="missing_warmup")])
    assert "lr_too_high" in codes(voted) and "bad_init" in codes(voted)
    assert all(c.proof == "" for c in voted)
    sentence = ("confirmed by replay: with LR x0.1 the loss after the update is 2.31 (run's "
                "typical 2.2) instead of NaN")
    ruled = {"lr_too_high": "ruled out: with LR x0.1 the step is still NaN"}
    ranked = rank_causes([*events, proof(5, {"bad_init": sentence}, ruled)],
                         [Finding("warmup", "warning", "no warmup", "warm up",
                                  cause="missing_warmup")])
    assert codes(ranked)[0] == "bad_init" and ranked[0].proof == "confirmed"
    assert ranked[0].evidence[0] == sentence and ranked[0].confidence >= 0.9 - 1e-9
    assert "lr_too_high" not in codes(ranked)
    assert ranked[0].to_dict()["proof"] == "confirmed"
    confirmed = [*events, proof(5, {"bad_init": sentence}, {})]
    assert abs(sum(c.confidence for c in rank_causes(confirmed, top=50)) - 1) < 1e-9


def test_a_proof_that_did_not_reproduce_its_fault_changes_nothing() -> None:
    events = [event("loss_spike", 5, "warning"), event("grad_explosion", 5)]
    unproved = proof(5, {"bad_init": "confirmed"}, {"lr_too_high": "ruled out"},
                     reproduced=False)
    assert [(c.code, c.confidence) for c in rank_causes([*events, unproved])] == [
        (c.code, c.confidence) for c in rank_causes(events)]


def test_a_confirmed_cause_without_votes_is_not_invented() -> None:
    events = [event("nonfinite_loss", 80), event("batch_nonfinite", 80, cause="nonfinite_input")]
    ranked = rank_causes([*events, proof(80, {"lora_scaling": "confirmed by replay"}, {})])
    assert "lora_scaling" not in codes(ranked)


def test_a_cause_reads_as_one_sentence_whatever_its_evidence_ends_with() -> None:
    cause = RankedCause("missing_warmup", 0.02, 1.0,
                        evidence=["No warmup; a low risk here: on a small model."],
                        fix="warm the LR up.")
    assert str(cause) == ("missing_warmup (2%): No warmup; a low risk here: on a small model. "
                          "Fix: warm the LR up.")


def test_a_cause_a_window_replay_confirmed_ranks_without_votes() -> None:
    """An LR that built a divergence up over steps that looked normal one by one: the symptoms
    vote for nothing, the window replay from a good state confirms it."""
    events = [event("loss_spike", 130)]  # a late spike: one bad batch, by the votes
    assert codes(rank_causes(events)) == ["outlier_batch"]
    window = proof(130, {"lr_too_high": "confirmed by replay: with LR x0.1 from step 110"}, {})
    window.details["window"] = 20
    ranked = rank_causes([*events, window])
    assert codes(ranked) == ["lr_too_high", "outlier_batch"] and ranked[0].proof == "confirmed"
    assert ranked[0].evidence[0].startswith("confirmed by replay")
    single = proof(130, {"lr_too_high": "confirmed by replay: with LR x0.1"}, {})
    assert codes(rank_causes([*events, single])) == ["outlier_batch"]


def test_a_lower_lr_that_heals_the_first_steps_proves_the_missing_warmup_too() -> None:
    """Early in a run without warmup, at an LR the model takes behind one, the replay's LR x0.1
    heals what a warmup would: both causes are confirmed and the votes order them."""
    stayed_up = [event("loss_spike", 19, "warning"), event("grad_explosion", 19),
                 event("bad_start", 19, "warning", cause="lr_too_high")]
    healed = proof(19, {"lr_too_high": "confirmed by replay: with LR x0.1 the loss is 0.3"}, {})
    ranked = rank_causes([*stayed_up, healed], [no_warmup_at(0.5)])
    assert codes(ranked)[:2] == ["missing_warmup", "lr_too_high"]
    assert ranked[0].proof == ranked[1].proof == "confirmed"
    assert "a warmup lowers the first steps' LR the same way" in ranked[0].evidence[0]
    # far above what a warmup makes bearable, or late in the run: the LR alone is proved
    for events, share in (([*stayed_up, healed], 20.0), (
            [event("loss_spike", 300, "warning"), event("grad_explosion", 300),
             proof(300, {"lr_too_high": "confirmed"}, {})], 0.5)):
        lr = Finding("mode_and_lr", "warning", "LR high", "lower it", cause="lr_too_high")
        ranked = rank_causes(events, [no_warmup_at(share), lr])
        assert [c.code for c in ranked if c.proof] == ["lr_too_high"]
    # a warmup the replay tried and that did not heal is not proved by the lower LR
    tried = proof(19, {"lr_too_high": "confirmed"}, {"missing_warmup": "ruled out"})
    assert "missing_warmup" not in codes(rank_causes([*stayed_up, tried], [no_warmup_at(0.5)]))


def test_a_cause_ruled_out_at_a_later_bad_step_is_no_longer_confirmed() -> None:
    """The previous good batch healed step 120, but at step 130 (after the rollback skipped that
    batch) the trouble came back and the previous batch no longer heals it: the fault outlived
    the batch, so the batch is not proved."""
    from trainguard.diagnose.ranking import proven
    first = proof(120, {"outlier_batch": "healed", "label_problem": "healed"}, {})
    later = proof(130, {}, {"outlier_batch": "still bad"})
    confirmed, ruled_out = proven([first, later])
    assert confirmed == {"label_problem": "healed"} and ruled_out == {"outlier_batch"}
    # the other order: ruled out first, then confirmed at a later step, is confirmed
    confirmed, ruled_out = proven([proof(110, {}, {"outlier_batch": "still bad"}), first])
    assert "outlier_batch" in confirmed and not ruled_out
    # at the same step a replay that healed it wins over one that did not
    confirmed, _ = proven([first, proof(120, {}, {"outlier_batch": "still bad"})])
    assert "outlier_batch" in confirmed


def _language_model_whose_loop_scales_its_loss(tmp_path, factor: float, at: int) -> list[dict]:
    """A tiny GPT-2 trained on a Markov language it learns well below chance level; at step
    `at` the loop multiplies the loss by `factor` outside the model, under `halt`. Returns the
    stored diagnosis."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from trainguard.demo import MarkovLanguage

    with torch_threads(1):
        torch.manual_seed(0)
        language = MarkovLanguage(vocab_size=32, seed=0)
        model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=32,
                                           n_positions=32, bos_token_id=0, eos_token_id=0))
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        guard = trainguard.Guard(model, optimizer, run_dir=tmp_path,
                                 config=trainguard.GuardConfig(policy="halt",
                                                               sinks={"console": False}))
        with pytest.raises(trainguard.TrainingDiverged):
            for step in range(at + 1):
                ids = language.batch(8, 17)
                loss = model(input_ids=ids, labels=ids).loss
                if step == at:
                    loss = loss * factor
                loss.backward()
                guard.step(loss, batch={"input_ids": ids, "labels": ids})
                optimizer.zero_grad(set_to_none=True)
    return trainguard.RunReader(tmp_path).summary()["diagnosis"]


def test_a_loss_scaled_outside_the_model_is_its_reduction_not_the_tokenizer(tmp_path) -> None:
    # a million times the loss: no tokenizer mismatch gets there, since misread ids still give
    # a cross-entropy of the scores the model made
    diagnosis = _language_model_whose_loop_scales_its_loss(tmp_path, 1e6, at=80)
    ranked = [c["code"] for c in diagnosis]
    assert ranked[0] == "loss_reduction" and diagnosis[0]["confidence"] > 0.5
    assert "tokenizer_mismatch" not in ranked
    assert "class scores could cost" in diagnosis[0]["evidence"][0]


def test_a_loss_within_what_the_scores_allow_leaves_the_ids_their_vote() -> None:
    # a shard of misread ids: the loss far above chance, under the ceiling of the scores
    events = [event("loss_spike", 60, "warning", ratio=7.9, baseline=1.0, ce_ceiling=14.0),
              event("batch_above_chance", 60, "warning", cause="tokenizer_mismatch")]
    events[0].value = 7.9
    ranked = codes(rank_causes(events, top=10))
    assert ranked[0] == "tokenizer_mismatch" and "loss_reduction" not in ranked


def test_without_a_ceiling_a_jump_of_loss_and_gradient_alike_points_at_the_loss() -> None:
    def run(grad_ratio: float, loss_ratio: float = 5e5, *more: Event) -> list[str]:
        spike = event("loss_spike", 80, ratio=loss_ratio, baseline=1.2)
        spike.value = 1.2 * loss_ratio
        return codes(rank_causes([spike, event("grad_explosion", 80, ratio=grad_ratio), *more],
                                 top=10))

    assert "loss_reduction" in run(1e6)
    assert "loss_reduction" not in run(1e8)  # the gradient grew far more: not a factor alone
    assert "loss_reduction" not in run(40.0, 50.0)  # no orders of magnitude
    outlier = event("batch_outlier", 80, "warning", cause="outlier_batch")
    assert "loss_reduction" not in run(1e6, 5e5, outlier)  # the batch's size says why


def test_a_jump_of_loss_and_gradient_alike_is_read_at_the_jump_when_told_again_later() -> None:
    """The loss's jump is an outlier batch (info) at its step and told again a step later,
    where it has not come back; the gradient's blew up (an error) at once."""
    grad = event("grad_explosion", 80, ratio=1e6)
    outlier = event("loss_spike", 80, "info", ratio=5e5, baseline=1.2, outlier=True)
    again = event("loss_spike", 81, ratio=5e5, baseline=1.2, jump_step=80)
    outlier.value = again.value = 1.2 * 5e5
    assert "loss_reduction" in codes(rank_causes([grad, outlier, again], top=10))
    assert "loss_reduction" not in codes(rank_causes([grad, outlier], top=10))


def test_a_replay_that_does_not_give_the_recorded_loss_votes_for_the_loss() -> None:
    spike = event("loss_spike", 80, ratio=30.0, baseline=1.0)
    proof = event("proof", 80, "info", replay_differs=True)
    assert "loss_reduction" in codes(rank_causes([spike, proof], top=10))
    assert "loss_reduction" not in codes(rank_causes([spike], top=10))


@pytest.mark.parametrize(("events", "first"), [
    # a KL that drifted away at an unchanged LR: the penalty first
    ([("kl_blowup", 31, {"cause": "beta_too_low"})], "beta_too_low"),
    ([("kl_blowup", 31, {"cause": "beta_too_low"}), ("entropy_collapse", 35, {})],
     "beta_too_low"),
    # the first updates threw it: the LR first
    ([("kl_blowup", 1, {"cause": "lr_too_high"})], "lr_too_high"),
    ([("kl_blowup", 1, {"cause": "lr_too_high"}), ("entropy_collapse", 15, {})],
     "lr_too_high"),
    # told before the blow-up said how it came: the kind's standing order, the LR first
    ([("kl_blowup", 4, {})], "lr_too_high"),
])
def test_a_kl_blowup_ranks_the_cause_its_timing_showed(
        events: list[tuple[str, int, dict]], first: str) -> None:
    ranked = rank_causes([event(kind, step, "warning", **details)
                          for kind, step, details in events])
    assert ranked[0].code == first, [c.code for c in ranked]
    assert {"lr_too_high", "beta_too_low"} <= {c.code for c in ranked}
