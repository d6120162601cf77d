"""Cause ranking combines events, findings and replay into ranked causes with evidence and fixes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import trainguard
from trainguard.diagnose.finding import Finding
from trainguard.diagnose.ranking import rank_causes
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
                             config=trainguard.GuardConfig(console=False, policy=policy))
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
                             config=trainguard.GuardConfig(console=False))
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
        console=False, sample_every=sample_every))
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
