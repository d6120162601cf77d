"""Each preflight check fires on a real misconfigured object and stays silent on a sane one."""

from __future__ import annotations

import copy
import functools
import math
import types
import warnings
from collections.abc import Callable, Iterable

import pytest
import torch
from torch import nn

import trainguard
from trainguard import GuardConfig, preflight
from trainguard.diagnose.lr_range import (
    fine_tuning_mode,
    pretrained_evidence,
    small_model_lr_allowance,
)
from trainguard.diagnose.preflight import probe_schedule, run_length, warmup_advice
from trainguard.recipes import warmup_cosine

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
    assert "10,000x" in finding.message
    assert "at most 0.05 for this model" in finding.fix and "5e-05" in finding.fix
    assert "allowing 1000x more" in finding.message  # a tiny model tolerates more
    assert finding.evidence["mode"] == "full"


def test_a_few_times_above_a_small_models_stretched_top_is_a_note() -> None:
    # 0.1 is 2x the top this 0.03M-parameter model with no sign of pre-training is allowed (0.05):
    # that top is a guess from its size, so the run's own signals decide
    model, optimizer, scheduler = sane(lr=0.1)
    [finding] = checks(preflight(model, optimizer, scheduler))["mode_and_lr"]
    assert finding.severity == "info" and finding.cause == "lr_too_high"
    assert "mode_and_lr" not in checks(preflight(model, optimizer, scheduler), "warning")
    # the same excess over a pre-trained model's top is a warning: its range is the guide's own
    model, optimizer, scheduler = sane(lr=1e-2)
    model.config = types.SimpleNamespace(name_or_path="org/pretrained-classifier")
    [finding] = checks(preflight(model, optimizer, scheduler))["mode_and_lr"]
    assert finding.severity == "warning" and "200x" in finding.message  # 2x its allowed top


def test_small_models_get_an_allowance_above_the_guide_ranges() -> None:
    assert small_model_lr_allowance(100_000) == 100.0  # a tiny model that may be pre-trained
    assert small_model_lr_allowance(10**7) == 100.0
    # with no sign of pre-training, tiny models tolerate up to 1000x
    assert small_model_lr_allowance(50_000, pretrained=False) == 1000.0
    assert small_model_lr_allowance(10**6, pretrained=False) == pytest.approx(316.2, rel=1e-3)
    assert small_model_lr_allowance(10**7, pretrained=False) == 100.0
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
    assert lr.severity == "error" and "LoRA" in lr.message and lr.evidence["ratio"] == 400
    [scaling] = found["lora_scaling"]
    assert scaling.severity == "error" and scaling.evidence["scaling"] == 64
    assert scaling.cause == "lora_scaling"


def gpt2_lora(r: int = 8, alpha: int = 16) -> nn.Module:
    """LoRA on a tiny GPT-2 built from its config (0.1M parameters: the size alone would earn
    a from-scratch model a 1000x LR allowance)."""
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=50,
                                     n_positions=16)
    lora = peft.LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.1, target_modules=["c_attn"],
                           fan_in_fan_out=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return peft.get_peft_model(transformers.GPT2LMHeadModel(config), lora)


@pytest.mark.parametrize(("lr", "severity"), [(0.5, "error"), (1e-2, "warning"), (3e-3, None)])
def test_lora_lr_is_judged_on_the_lora_range_whatever_the_model_size(
        lr: float, severity: str | None) -> None:
    model = gpt2_lora()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    found = checks(preflight(model, optimizer, cosine_with_warmup(optimizer, 10)))
    if severity is None:
        assert "mode_and_lr" not in found
        return
    [finding] = found["mode_and_lr"]
    assert finding.severity == severity and finding.cause == "lr_too_high"
    assert finding.evidence["small_model_allowance"] == 1.0
    assert "at most 0.005" in finding.fix and "allowing" not in finding.message
    constant = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    [warmup] = checks(preflight(model, constant))["warmup"]  # the same range judges the warmup
    assert warmup.evidence["tolerated_lr"] == 5e-3 and warmup.severity == "warning"


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
    assert finding.severity == "info", "a small model at a low LR: a note, not a warning"
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


WEIGHT_DECAYS: dict[str, tuple[Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer],
                               float | None]] = {
    # told: lr x weight_decay (over 1 - momentum for SGD) is 1% of the weights a step or more
    "sgd_0.1_x_0.5": (lambda p: torch.optim.SGD(p, lr=0.1, weight_decay=0.5), 0.05),
    "sgd_momentum_sums_it": (lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9,
                                                         weight_decay=0.1), 0.01),
    "adamw_1e-2_x_1": (lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=1.0), 0.01),
    "adam_decoupled": (lambda p: torch.optim.Adam(p, lr=0.1, weight_decay=0.5,
                                                  decoupled_weight_decay=True), 0.05),
    # quiet: the usual settings, and a coupled decay that Adam's normalisation rescales
    "sgd_imagenet": (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=1e-4),
                     None),
    "adamw_pretraining": (lambda p: torch.optim.AdamW(p, lr=6e-4, weight_decay=0.1), None),
    "adamw_grokking": (lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=1.0), None),
    "adam_coupled": (lambda p: torch.optim.Adam(p, lr=1e-3, weight_decay=0.5), None),
    "no_decay": (lambda p: torch.optim.SGD(p, lr=1.0), None),
}


@pytest.mark.parametrize("name", sorted(WEIGHT_DECAYS))
def test_a_weight_decay_that_takes_a_share_of_the_weights_every_step(name: str) -> None:
    make, rate = WEIGHT_DECAYS[name]
    model = Classifier()
    found = checks(preflight(model, make(model.parameters()))).get("weight_decay", [])
    if rate is None:
        assert found == []
        return
    [finding] = found
    assert finding.severity == "warning" and finding.cause == "weight_decay_too_high"
    assert finding.evidence["decay_per_step"] == pytest.approx(rate)
    assert "lower weight_decay to" in finding.fix


def test_the_weight_decay_is_judged_at_the_schedules_peak_lr() -> None:
    """A warm-up starts the LR near 0: the decay is judged at the LR the schedule rises to."""
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=0.5)
    scheduler = cosine_with_warmup(optimizer, warmup=100)
    assert optimizer.param_groups[0]["lr"] < 0.01
    [finding] = checks(preflight(model, optimizer, scheduler))["weight_decay"]
    assert finding.evidence["lr"] == 0.1


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


def test_a_vae_in_the_optimizer_is_found_by_what_it_is() -> None:
    """The original Stable Diffusion code's name for the VAE, `first_stage_model`: the check
    reads the module's role (encode/decode beside a UNet that takes a timestep)."""
    diffusers_sd = pytest.importorskip("benchmarks.scenarios.families.diffusers_sd")
    model = diffusers_sd.LatentDiffusion(diffusers_sd.tiny_unet(4, 8), diffusers_sd.tiny_vae())
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    scheduler = cosine_with_warmup(optimizer, 10)
    [finding] = checks(preflight(model, optimizer, scheduler))["frozen_parts"]
    assert finding.severity == "warning" and finding.cause == "unfrozen_part"
    assert finding.evidence["part"] == "first_stage_model"
    assert finding.evidence["role"] == "autoencoder"
    assert finding.evidence["weights"] == sum(
        p.numel() for p in model.first_stage_model.parameters())
    assert "first_stage_model.requires_grad_(False)" in finding.fix


def test_a_vae_out_of_the_optimizer_or_frozen_is_no_finding() -> None:
    diffusers_sd = pytest.importorskip("benchmarks.scenarios.families.diffusers_sd")
    model = diffusers_sd.LatentDiffusion(diffusers_sd.tiny_unet(4, 8), diffusers_sd.tiny_vae())
    # trainable but never stepped: the optimizer holds the UNet's parameters only
    optimizer = torch.optim.AdamW(model.unet.parameters(), lr=2e-5)
    assert "frozen_parts" not in checks(preflight(model, optimizer,
                                                  cosine_with_warmup(optimizer, 10)))
    model.first_stage_model.requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    assert "frozen_parts" not in checks(preflight(model, optimizer,
                                                  cosine_with_warmup(optimizer, 10)))


def test_a_text_encoder_in_the_optimizer() -> None:
    diffusers_sd = pytest.importorskip("benchmarks.scenarios.families.diffusers_sd")
    from .test_model_parts import tiny_text_encoder

    model = nn.ModuleDict({"model": diffusers_sd.tiny_unet(),
                           "cond_stage_model": tiny_text_encoder()})
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    [finding] = checks(preflight(model, optimizer, cosine_with_warmup(optimizer, 10)))[
        "frozen_parts"]
    assert finding.evidence["role"] == "text_encoder" and "text encoder" in finding.message


def test_no_clipping_is_noted_when_known() -> None:
    model, optimizer, scheduler = sane()
    assert checks(preflight(model, optimizer, scheduler, max_grad_norm=None,
                            clipping_known=True))["clipping"][0].severity == "info"
    assert preflight(model, optimizer, scheduler, max_grad_norm=None) == []


def test_the_guard_runs_the_audit_and_stores_it(tmp_path, capsys) -> None:
    setup = make_setup(lr=1.0, warmup=0)
    guard = trainguard.Guard(setup.model, setup.optimizer, run_dir=tmp_path,
                             config=GuardConfig(sinks={"console": True}))
    for _ in range(3):  # "no warmup" waits for the LRs the first steps use
        loss = setup.model.loss(setup.batch())
        loss.backward()
        guard.step(loss)
        setup.optimizer.zero_grad(set_to_none=True)
    guard.close()
    assert {f.check for f in guard.findings} >= {"mode_and_lr", "warmup"}
    assert "trainguard preflight ERROR mode_and_lr" in capsys.readouterr().err
    stored = trainguard.RunReader(tmp_path).meta()["preflight"]
    assert [f["check"] for f in stored] == [f.check for f in guard.findings]
    quiet = trainguard.Guard(setup.model, setup.optimizer,
                             config=GuardConfig(sinks={"console": False},
                                                probes={"preflight": False}))
    assert quiet.findings == []


class Lion(torch.optim.Optimizer):
    """An adaptive optimizer outside the Adam family (sign updates: every weight moves by lr)."""

    def __init__(self, params: Iterable[nn.Parameter], lr: float = 1e-4) -> None:
        super().__init__(params, {"lr": lr})


def pretrained(model: nn.Module, name: str = "someone/checkpoint") -> nn.Module:
    model.config = types.SimpleNamespace(name_or_path=name)  # what from_pretrained leaves
    return model


def small() -> nn.Module:
    return Classifier()


def loaded() -> nn.Module:
    return pretrained(Classifier())


@pytest.mark.parametrize(("model", "optimizer", "lr", "severity"), [
    # a plain SGD step is proportional to the gradient, with or without momentum
    (small, torch.optim.SGD, 0.1, "info"),
    (small, functools.partial(torch.optim.SGD, momentum=0.9), 0.1, "info"),
    (loaded, torch.optim.SGD, 0.1, "info"),
    # Adam on a tiny model with no sign of pre-training: the LR against the most it tolerates
    # (5e-2 with the tiny-model allowance)
    (small, torch.optim.AdamW, 1e-3, "info"),
    (small, torch.optim.AdamW, 1e-2, "info"),
    (small, torch.optim.AdamW, 5e-2, "warning"),
    (small, torch.optim.Adam, 1e-1, "warning"),
    # ...and on a pre-trained one, from half of it
    (loaded, torch.optim.AdamW, 1e-3, "info"),
    (loaded, torch.optim.AdamW, 3e-3, "warning"),
    # RAdam's rectification is a warmup; other adaptive optimizers: by pre-training alone
    (loaded, torch.optim.RAdam, 1e-2, "info"),
    (small, Lion, 1e-4, "info"),
    (loaded, Lion, 1e-4, "warning"),
    (loaded, torch.optim.RMSprop, 1e-4, "warning"),
])
def test_a_missing_warmup_warns_only_where_it_matters(
        model: Callable[[], nn.Module], optimizer: Callable[..., torch.optim.Optimizer],
        lr: float, severity: str) -> None:
    net = model()
    [finding] = checks(preflight(net, optimizer(net.parameters(), lr=lr)))["warmup"]
    assert finding.severity == severity, finding.message
    assert finding.cause == "missing_warmup" and finding.evidence["lr_head"] == [lr]
    # what the ranking weighs a missing warmup by: whether the optimizer inflates first steps
    sgd = issubclass(getattr(optimizer, "func", optimizer), torch.optim.SGD)
    assert finding.evidence["adaptive"] is not sgd


def test_a_missing_warmup_on_a_large_or_adapted_model() -> None:
    big = nn.Sequential(nn.Linear(1000, 1000), nn.Linear(1000, 1000), nn.Linear(1000, 10000))
    assert pretrained_evidence(big) == "12M parameters"  # large: treated as pre-trained
    # the top of the full fine-tuning range 5e-5 with an allowance of ~69x for 12M parameters:
    # 3.45e-3 tolerated, and 2e-3 is in its upper half
    optimizer = torch.optim.AdamW(big.parameters(), lr=2e-3)
    [finding] = checks(preflight(big, optimizer))["warmup"]
    assert finding.severity == "warning" and "near the top of its range" in finding.message
    model = lora_model(r=8, alpha=16)
    lora = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    [note] = checks(preflight(model, lora))["warmup"]  # 5e-3 tolerated, 1e-3 is little
    assert note.severity == "info" and note.evidence["pretrained"] == (
        "peft adapters on a base model")


def test_what_says_a_model_is_pre_trained() -> None:
    assert pretrained_evidence(Classifier()) is None
    assert pretrained_evidence(loaded()) == "loaded from 'someone/checkpoint'"
    frozen = Classifier()
    frozen.backbone.requires_grad_(False)
    assert pretrained_evidence(frozen) == "a frozen backbone"
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=50,
                                     n_positions=16)
    built = transformers.GPT2LMHeadModel(config)
    assert pretrained_evidence(built) is None, "built from a config: freshly initialised"
    built.config._name_or_path = "openai-community/gpt2"  # as from_pretrained sets it
    assert pretrained_evidence(built) == "loaded from 'openai-community/gpt2'"


@pytest.mark.filterwarnings("ignore:Detected call of:UserWarning")
def test_the_warmup_advice_scales_to_the_run() -> None:
    assert warmup_advice(None) == "~5-10% of training"
    assert warmup_advice(2000) == "~100-200 steps (5-10% of this run's 2000)"
    assert warmup_advice(10) == "~1 step (5-10% of this run's 10)"
    model, optimizer, _ = sane(lr=1e-1)  # above the range: mode_and_lr cites a warmup too
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=2000)
    assert run_length(cosine) == 2000
    found = checks(preflight(model, optimizer, cosine))
    assert "~100-200 steps (5-10% of this run's 2000)" in found["warmup"][0].fix
    assert "~100-200 steps" in found["mode_and_lr"][0].fix and "500" not in (
        found["mode_and_lr"][0].fix)
    told = checks(preflight(model, optimizer, cosine, total_steps=10_000))
    assert "~500-1000 steps (5-10% of this run's 10000)" in told["warmup"][0].fix
    unknown = checks(preflight(model, optimizer))["warmup"][0]
    assert "~5-10% of training" in unknown.fix
    ours = warmup_cosine(optimizer, warmup_steps=0, total_steps=300)
    assert run_length(ours) == 300
    hf = transformers.get_linear_schedule_with_warmup(optimizer, 0, 765)
    assert run_length(hf) == 765
    one_cycle = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-3, total_steps=400)
    assert run_length(one_cycle) == 400
    assert run_length(torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)) is None


@pytest.mark.parametrize(("r", "alpha", "rslora", "severity"), [
    (8, 8, False, None), (8, 16, False, None),  # alpha = r, and alpaca-lora's alpha = 2r
    (8, 32, False, "info"), (8, 40, False, "warning"), (8, 128, False, "error"),
    (64, 16, True, None),  # rsLoRA: alpha / sqrt(r) = 2
    (64, 40, True, "warning"), (16, 16, True, "info"),
])
def test_lora_scaling_is_calibrated(r: int, alpha: int, rslora: bool,
                                    severity: str | None) -> None:
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=50,
                                     n_positions=16)
    lora = peft.LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.1, use_rslora=rslora,
                           target_modules=["c_attn"], fan_in_fan_out=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = peft.get_peft_model(transformers.GPT2LMHeadModel(config), lora)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    found = checks(preflight(model, optimizer, cosine_with_warmup(optimizer, 10)))
    assert [f.severity for f in found.get("lora_scaling", [])] == ([severity] if severity else [])


def test_lora_scaling_reads_per_module_alphas() -> None:
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=50,
                                     n_positions=16)
    lora = peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.1, alpha_pattern={"c_attn": 64},
                           target_modules=["c_attn", "c_proj"], fan_in_fan_out=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = peft.get_peft_model(transformers.GPT2LMHeadModel(config), lora)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    [finding] = checks(preflight(model, optimizer, cosine_with_warmup(optimizer, 10)))[
        "lora_scaling"]
    assert finding.severity == "warning" and "for 'c_attn'" in finding.message
    assert finding.evidence["scaling"] == 8
