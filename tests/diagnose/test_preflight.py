"""Each preflight check fires on a real misconfigured object and stays silent on a sane one."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
from torch import nn

import trainguard
from trainguard import GuardConfig, preflight
from trainguard.diagnose.preflight import (
    fine_tuning_mode,
    probe_schedule,
    small_model_lr_allowance,
)

from ..conftest import make_setup


def checks(findings, severity_at_least: str = "info") -> dict[str, list]:
    order = ["info", "warning", "error", "critical"]
    out: dict[str, list] = {}
    for f in findings:
        if order.index(f.severity) >= order.index(severity_at_least):
            out.setdefault(f.check, []).append(f)
    return out


def cosine_with_warmup(optimizer, warmup: int, total: int = 1000):
    def schedule(step: int) -> float:
        return min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * step / total))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


class Classifier(nn.Module):
    def __init__(self, head_std: float | None = 0.02) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, 4)
        if head_std is not None:
            nn.init.normal_(self.head.weight, std=head_std)

    def forward(self, x):
        return self.head(self.backbone(x))


def sane(model: nn.Module | None = None, lr: float = 2e-5):
    model = model or Classifier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    return model, optimizer, cosine_with_warmup(optimizer, warmup=50)


def test_a_sane_full_fine_tune_has_no_findings() -> None:
    model, optimizer, scheduler = sane()
    assert preflight(model, optimizer, scheduler, max_grad_norm=1.0, clipping_known=True) == []


def test_lr_far_above_the_full_fine_tuning_range() -> None:
    model, optimizer, scheduler = sane(lr=0.5)
    [finding] = checks(preflight(model, optimizer, scheduler))["mode_and_lr"]
    assert finding.severity == "error" and finding.cause == "lr_too_high"
    assert "1e+04x" in finding.message
    assert "at most 0.005 for this model" in finding.fix and "5e-05" in finding.fix
    assert "allowing 100x more" in finding.message  # a small model tolerates more
    assert finding.evidence["mode"] == "full"


def test_small_models_get_an_allowance_above_the_guide_ranges() -> None:
    assert small_model_lr_allowance(100_000) == 100.0
    assert small_model_lr_allowance(10**7) == 100.0
    assert small_model_lr_allowance(int(10**7.5)) == pytest.approx(10.0, rel=1e-6)
    assert small_model_lr_allowance(10**8) == small_model_lr_allowance(7 * 10**9) == 1.0
    model, optimizer, scheduler = sane(lr=3e-3)  # sane for this 0.03M-parameter model
    assert "mode_and_lr" not in checks(preflight(model, optimizer, scheduler))


def test_modes_from_the_trainable_parameters() -> None:
    model = Classifier()
    assert fine_tuning_mode(model) == "full"
    model.backbone.requires_grad_(False)
    assert fine_tuning_mode(model) == "head"
    optimizer = torch.optim.AdamW(model.head.parameters(), lr=1e-3)
    assert "mode_and_lr" not in checks(preflight(model, optimizer, cosine_with_warmup(optimizer,
                                                                                     10)))


peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")


def lora_model(r: int = 8, alpha: int = 8, dropout: float = 0.1) -> nn.Module:
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50,
                                     n_positions=16, bos_token_id=None, eos_token_id=None)
    base = transformers.GPT2LMHeadModel(config)
    lora = peft.LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout,
                           target_modules=["c_attn"], fan_in_fan_out=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return peft.get_peft_model(base, lora)


def test_lora_mode_lr_range_and_scaling() -> None:
    model = lora_model(r=8, alpha=512)
    assert fine_tuning_mode(model) == "lora"
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2.0)
    found = checks(preflight(model, optimizer, cosine_with_warmup(optimizer, 10)))
    [lr] = found["mode_and_lr"]
    assert lr.severity == "warning" and "LoRA" in lr.message and lr.evidence["ratio"] == 400
    [scaling] = found["lora_scaling"]
    assert scaling.severity == "error" and scaling.evidence["scaling"] == 64
    assert scaling.cause == "lora_scaling"


def test_sane_lora_is_silent_and_zero_dropout_is_noted() -> None:
    model = lora_model(r=8, alpha=8)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    assert preflight(model, optimizer, cosine_with_warmup(optimizer, 10)) == []
    model = lora_model(r=8, alpha=8, dropout=0.0)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    [note] = checks(preflight(model, optimizer, cosine_with_warmup(optimizer, 10)))["lora_scaling"]
    assert note.severity == "info" and "lora_dropout" in note.message


def test_missing_warmup_without_scheduler_or_with_a_constant_one() -> None:
    model, optimizer, _ = sane()
    [finding] = checks(preflight(model, optimizer))["warmup"]
    assert finding.cause == "missing_warmup" and "no scheduler" in finding.message
    constant = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    assert "warmup" in checks(preflight(model, optimizer, constant))
    decaying = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=100)
    assert "warmup" in checks(preflight(model, optimizer, decaying))


@pytest.mark.filterwarnings("ignore:Detected call of:UserWarning")
def test_probing_the_schedule_does_not_disturb_it() -> None:
    model, optimizer, scheduler = sane()
    _, twin_optimizer, twin_scheduler = sane(copy.deepcopy(model))
    for _ in range(3):
        scheduler.step()
        twin_scheduler.step()
    before = copy.deepcopy(scheduler.state_dict())
    lrs = probe_schedule(optimizer, scheduler, steps=100)
    assert lrs[0] < lrs[40], "it really probed the warmup"
    assert scheduler.state_dict() == before
    for _ in range(5):
        scheduler.step()
        twin_scheduler.step()
        assert optimizer.param_groups[0]["lr"] == twin_optimizer.param_groups[0]["lr"]


def test_risky_adam_settings() -> None:
    model = Classifier()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, eps=1e-16, betas=(0.9, 0.9))
    [finding] = checks(preflight(model, optimizer, cosine_with_warmup(optimizer, 10)))[
        "adam_settings"]
    assert finding.severity == "error" and finding.cause == "optimizer_eps"
    assert "eps 1e-16" in finding.message and "beta2 0.9" in finding.message
    half = Classifier().half()
    optimizer = torch.optim.AdamW(half.parameters(), lr=2e-5)  # eps 1e-8 with float16 state
    found = checks(preflight(half, optimizer, cosine_with_warmup(optimizer, 10)))
    assert found["adam_settings"][0].severity == "warning"
    assert found["precision"][0].severity == "error", "float16 weights are trained"


@pytest.mark.parametrize("std, severity", [(10.0, "warning"), (100.0, "error")])
def test_badly_initialised_new_head(std: float, severity: str) -> None:
    model, optimizer, scheduler = sane(Classifier(head_std=std))
    [finding] = checks(preflight(model, optimizer, scheduler))["layer_init"]
    assert finding.severity == severity and finding.evidence["param"] == "head.weight"
    assert finding.cause == "bad_init" and "std=0.02" in finding.fix


def test_default_initialisations_are_sane() -> None:
    model, optimizer, scheduler = sane(Classifier(head_std=None))  # PyTorch's Kaiming-uniform
    assert "layer_init" not in checks(preflight(model, optimizer, scheduler))


def test_fp16_autocast_needs_a_grad_scaler() -> None:
    model, optimizer, scheduler = sane()
    [finding] = checks(preflight(model, optimizer, scheduler,
                                 autocast_dtype=torch.float16))["precision"]
    assert finding.severity == "error" and "GradScaler" in finding.fix
    scaler = torch.amp.GradScaler("cpu")
    assert "precision" not in checks(preflight(model, optimizer, scheduler, scaler=scaler,
                                               autocast_dtype=torch.float16))
    assert "precision" not in checks(preflight(model, optimizer, scheduler,
                                               autocast_dtype=torch.bfloat16))


def test_a_vae_that_is_not_frozen() -> None:
    pipeline = nn.ModuleDict({"unet": nn.Linear(8, 8), "vae": nn.Linear(8, 8)})
    optimizer = torch.optim.AdamW(pipeline.parameters(), lr=2e-5)
    scheduler = cosine_with_warmup(optimizer, 10)
    [finding] = checks(preflight(pipeline, optimizer, scheduler))["frozen_vae"]
    assert "vae.weight" in finding.message
    pipeline["vae"].requires_grad_(False)
    assert "frozen_vae" not in checks(preflight(pipeline, optimizer, scheduler))


def test_no_clipping_is_noted_when_known() -> None:
    model, optimizer, scheduler = sane()
    assert checks(preflight(model, optimizer, scheduler, max_grad_norm=None,
                            clipping_known=True))["clipping"][0].severity == "info"
    assert preflight(model, optimizer, scheduler, max_grad_norm=None) == []


def test_the_guard_runs_the_audit_and_stores_it(tmp_path, capsys) -> None:
    setup = make_setup(lr=1.0, warmup=0)
    guard = trainguard.Guard(setup.model, setup.optimizer, run_dir=tmp_path,
                             config=GuardConfig(console=True))
    guard.close()
    assert {f.check for f in guard.findings} >= {"mode_and_lr", "warmup"}
    assert "trainguard preflight ERROR mode_and_lr" in capsys.readouterr().err
    stored = trainguard.RunReader(tmp_path).meta()["preflight"]
    assert [f["check"] for f in stored] == [f.check for f in guard.findings]
    quiet = trainguard.Guard(setup.model, setup.optimizer,
                             config=GuardConfig(console=False, preflight=False))
    assert quiet.findings == []
