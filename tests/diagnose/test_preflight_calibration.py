"""The preflight on the public fine-tuning recipes: which findings each one draws, and why.

Each recipe is built from configs, nothing downloaded: a small real architecture of the right
family (transformers' Llama, MT5 and BERT; peft's real LoraConfig and get_peft_model; a UNet-like
module with diffusers' attention names, as diffusers is not installed), with the recipe's own LoRA
config, optimizer, schedule, precision and clipping. The model's parameter count is emulated at the
real model's size by one parameter on the meta device (no memory), as the audit judges by size;
every recipe is audited at its real size and at the small one. docs/preflight-calibration.md has
the table, with the sources and the reasons.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from torch import nn

from trainguard import preflight
from trainguard.diagnose.finding import Finding
from trainguard.diagnose.lr_range import pretrained_evidence
from trainguard.diagnose.preflight import run_length

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

LLAMA_7B = 6_738_415_616
MT0_LARGE = 1_229_581_312  # 1,231,940,608 with the LoRA adapters, as PEFT prints it
SD15_UNET = 859_520_964
BERT_BASE_CASED_CLS = 108_311_810


def emulate_size(model: nn.Module, params: int | None, *, trainable: bool = False) -> nn.Module:
    """Give `model` the parameter count of the real model: the rest is one parameter on the meta
    device (it has a size and no storage). The audit reads sizes, never these values."""
    if params is not None:
        rest = params - sum(p.numel() for p in model.parameters())
        model.register_parameter("emulated_rest", nn.Parameter(
            torch.empty(rest, device="meta"), requires_grad=trainable))
    return model


def loaded_from(model: nn.Module, name: str) -> nn.Module:
    """What from_pretrained leaves in the config: the checkpoint's name."""
    model.config._name_or_path = name
    return model


def tiny_llama() -> nn.Module:
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=4, max_position_embeddings=64)
    return loaded_from(transformers.LlamaForCausalLM(config), "huggyllama/llama-7b")


def with_lora(model: nn.Module, config: Any) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return peft.get_peft_model(model, config)


def trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


@dataclass
class Built:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    audit: dict[str, Any] = field(default_factory=dict)
    """The rest of what the run tells the audit: scaler, autocast dtype, clipping."""

    def findings(self) -> list[Finding]:
        return preflight(self.model, self.optimizer, self.scheduler, **self.audit)


def hf_trainer_audit(fp16: bool = False, bf16: bool = False,
                     max_grad_norm: float = 1.0) -> dict[str, Any]:
    """The Trainer's precision and clipping (TrainingArguments defaults: max_grad_norm 1.0)."""
    dtype = torch.float16 if fp16 else torch.bfloat16 if bf16 else None
    return {"autocast_dtype": dtype, "scaler": torch.amp.GradScaler("cpu") if fp16 else None,
            "max_grad_norm": max_grad_norm, "clipping_known": True}


# -- the recipes -----------------------------------------------------------------------------


def alpaca_lora(size: int | None, lora_alpha: int = 16) -> Built:
    """tloen/alpaca-lora finetune.py defaults: LLaMA-7B in 8 bits, LoraConfig(r=8, lora_alpha=16,
    lora_dropout=0.05, target_modules=["q_proj", "v_proj"]), Trainer with adamw_torch, lr 3e-4,
    warmup_steps=100, linear decay (the Trainer's default), fp16, 3 epochs of batch 128 over the
    ~49.8k training rows of alpaca-cleaned: 3 x 388 = 1164 steps."""
    model = with_lora(emulate_size(tiny_llama(), size), peft.LoraConfig(
        r=8, lora_alpha=lora_alpha, lora_dropout=0.05, target_modules=["q_proj", "v_proj"],
        bias="none", task_type="CAUSAL_LM"))
    optimizer = torch.optim.AdamW(trainable(model), lr=3e-4, weight_decay=0.0)
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, 100, 1164)
    return Built(model, optimizer, scheduler, hf_trainer_audit(fp16=True))


def qlora(size: int | None, use_rslora: bool = False, lora_alpha: int = 16) -> Built:
    """The QLoRA paper's Guanaco-7B run (artidoro/qlora scripts/finetune_guanaco_7b.sh): 4-bit NF4
    with double quantisation, LoRA r=64, alpha=16, dropout 0.1 (0.05 for 33B/65B) on all linear
    layers, paged AdamW (32-bit state) lr 2e-4, beta2 0.999, weight decay 0, constant schedule
    with warmup_ratio 0.03 of max_steps 1875 (57 steps), max_grad_norm 0.3, bf16."""
    base = emulate_size(tiny_llama(), size)
    base.config.quantization_config = transformers.BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_use_double_quant=True, bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=torch.bfloat16)
    model = with_lora(base, peft.LoraConfig(
        r=64, lora_alpha=lora_alpha, lora_dropout=0.1, use_rslora=use_rslora, bias="none",
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                        "down_proj"], task_type="CAUSAL_LM"))
    optimizer = torch.optim.AdamW(trainable(model), lr=2e-4, betas=(0.9, 0.999), weight_decay=0.0)
    scheduler = transformers.get_constant_schedule_with_warmup(optimizer, math.ceil(0.03 * 1875))
    return Built(model, optimizer, scheduler, hf_trainer_audit(bf16=True, max_grad_norm=0.3))


def peft_example(size: int | None) -> Built:
    """The PEFT README / examples/conditional_generation/peft_lora_seq2seq.ipynb: mt0-large,
    LoraConfig(task_type=SEQ_2_SEQ_LM, r=8, lora_alpha=32, lora_dropout=0.1) (PEFT's default
    targets for mT5: q, v), torch AdamW(model.parameters(), lr=1e-3), linear schedule with
    num_warmup_steps=0 over 3 epochs x 255 batches = 765 steps; a plain loop, fp32, no clipping
    (a bare audit: whether it clips is not known)."""
    config = transformers.MT5Config(vocab_size=128, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                                    num_heads=4, decoder_start_token_id=0)
    base = loaded_from(transformers.MT5ForConditionalGeneration(config), "bigscience/mt0-large")
    model = with_lora(emulate_size(base, size), peft.LoraConfig(
        task_type="SEQ_2_SEQ_LM", inference_mode=False, r=8, lora_alpha=32, lora_dropout=0.1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, 0, 3 * 255)
    return Built(model, optimizer, scheduler)


class Attention(nn.Module):
    """diffusers' Attention, by its parameter names (to_q, to_k, to_v, to_out.0)."""

    def __init__(self, width: int, context: int) -> None:
        super().__init__()
        self.to_q = nn.Linear(width, width, bias=False)
        self.to_k = nn.Linear(context, width, bias=False)
        self.to_v = nn.Linear(context, width, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(width, width), nn.Dropout(0.0)])


class TransformerBlock(nn.Module):
    def __init__(self, width: int, cross_attention_dim: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn1 = Attention(width, width)  # self-attention
        self.attn2 = Attention(width, cross_attention_dim)  # cross-attention to the text


class UNetLike(nn.Module):
    """The attention layers of Stable Diffusion 1.5's UNet at their real widths (320 in the first
    down block, 1280 in the deepest; text context 768), between a conv in and out."""

    def __init__(self) -> None:
        super().__init__()
        self.conv_in = nn.Conv2d(4, 320, 3, padding=1)
        self.down_blocks = nn.ModuleList([TransformerBlock(320, 768), TransformerBlock(1280, 768)])
        self.conv_out = nn.Conv2d(320, 4, 3, padding=1)
        self.config = {"_name_or_path": "stable-diffusion-v1-5/stable-diffusion-v1-5"}


def diffusers_text_to_image_lora(size: int | None) -> Built:
    """diffusers examples/text_to_image/train_text_to_image_lora.py: the UNet frozen (and cast to
    float16 under --mixed_precision fp16), unet.add_adapter(LoraConfig(r=args.rank,
    lora_alpha=args.rank, init_lora_weights="gaussian", target_modules=["to_k", "to_q", "to_v",
    "to_out.0"])) with rank 4 (lora_dropout: peft's default 0), the LoRA weights cast back to
    float32, AdamW lr 1e-4, betas (0.9, 0.999), weight decay 1e-2, eps 1e-8, --lr_scheduler
    constant with --lr_warmup_steps 0 (the README's command), max_grad_norm 1.0, accelerate's
    float16 autocast with a GradScaler."""
    unet = emulate_size(UNetLike(), size)
    unet.requires_grad_(False)
    unet.half()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peft.inject_adapter_in_model(peft.LoraConfig(
            r=4, lora_alpha=4, init_lora_weights="gaussian",
            target_modules=["to_k", "to_q", "to_v", "to_out.0"]), unet)  # what add_adapter does
    for p in trainable(unet):
        p.data = p.data.float()
    optimizer = torch.optim.AdamW(trainable(unet), lr=1e-4, betas=(0.9, 0.999),
                                  weight_decay=1e-2, eps=1e-8)
    scheduler = transformers.get_constant_schedule(optimizer)
    return Built(unet, optimizer, scheduler, {
        "autocast_dtype": torch.float16, "scaler": torch.amp.GradScaler("cpu"),
        "max_grad_norm": 1.0, "clipping_known": True})


def run_glue(size: int | None, lr: float = 2e-5) -> Built:
    """transformers examples/pytorch/text-classification/run_glue.py as its README runs it:
    bert-base-cased, --learning_rate 2e-5, 3 epochs of batch 32 (MRPC: 115 batches per epoch, 345
    steps); the Trainer's defaults otherwise: AdamW (0.9, 0.999, eps 1e-8, weight decay 0), linear
    schedule, warmup 0, max_grad_norm 1.0, fp32. Full fine-tuning with a new classifier head."""
    config = transformers.BertConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=128,
                                     max_position_embeddings=64, num_labels=2)
    model = loaded_from(transformers.BertForSequenceClassification(config), "bert-base-cased")
    model = emulate_size(model, size, trainable=True)
    optimizer = torch.optim.AdamW(trainable(model), lr=lr, weight_decay=0.0)
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, 0, 345)
    return Built(model, optimizer, scheduler, hf_trainer_audit())


@dataclass(frozen=True)
class Recipe:
    name: str
    build: Callable[[int | None], Built]
    size: int
    drawn: frozenset[tuple[str, str]]
    """The findings (check, severity) it draws at its real size."""


RECIPES = [
    Recipe("alpaca-lora", alpaca_lora, LLAMA_7B, frozenset()),
    Recipe("qlora-guanaco-7b", qlora, LLAMA_7B, frozenset()),
    Recipe("peft-lora-seq2seq", peft_example, MT0_LARGE,
           frozenset({("lora_scaling", "info"), ("warmup", "info")})),
    Recipe("diffusers-text-to-image-lora", diffusers_text_to_image_lora, SD15_UNET,
           frozenset({("lora_scaling", "info"), ("warmup", "info")})),
    Recipe("run-glue", run_glue, BERT_BASE_CASED_CLS, frozenset({("warmup", "info")})),
]


def drawn(findings: list[Finding]) -> set[tuple[str, str]]:
    return {(f.check, f.severity) for f in findings}


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.name)
def test_a_public_recipe_at_its_real_size_draws_no_warning(recipe: Recipe) -> None:
    built = recipe.build(recipe.size)
    params = sum(p.numel() for p in built.model.parameters())
    assert recipe.size <= params < 1.01 * recipe.size  # the real model (and its adapters)
    findings = built.findings()
    assert drawn(findings) == recipe.drawn, [str(f) for f in findings]
    assert pretrained_evidence(built.model) is not None


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.name)
def test_a_public_recipe_on_a_small_model_draws_no_warning_either(recipe: Recipe) -> None:
    findings = recipe.build(None).findings()
    assert all(f.severity == "info" for f in findings), [str(f) for f in findings]


def test_what_the_notes_say() -> None:
    found = {f.check: f for f in peft_example(MT0_LARGE).findings()}
    scaling = found["lora_scaling"]
    assert scaling.evidence["scaling"] == 4 and scaling.cause == "lora_scaling"
    warmup = found["warmup"]
    assert warmup.cause == "missing_warmup" and warmup.evidence["lr_share"] == pytest.approx(0.2)
    assert warmup.evidence["pretrained"] == "peft adapters on a base model"
    assert "~38-76 steps (5-10% of this run's 765)" in warmup.fix  # the run's own length
    glue = {f.check: f for f in run_glue(BERT_BASE_CASED_CLS).findings()}["warmup"]
    assert glue.evidence["lr_share"] == pytest.approx(0.4)  # 2e-5 of the range's top 5e-5
    assert "~17-34 steps (5-10% of this run's 345)" in glue.fix
    [dropout] = [f for f in diffusers_text_to_image_lora(SD15_UNET).findings()
                 if f.check == "lora_scaling"]
    assert dropout.message == "lora_dropout is 0."


def test_the_recipes_schedules_are_read_as_they_are() -> None:
    assert run_length(alpaca_lora(None).scheduler) == 1164
    assert run_length(qlora(None).scheduler) is None  # a constant schedule has no end
    assert run_length(peft_example(None).scheduler) == 765


# -- where the same recipes become really risky ----------------------------------------------


def test_the_trainer_default_lr_without_warmup_on_bert_base_is_a_warning() -> None:
    """run_glue without --learning_rate: the Trainer's default 5e-5, the top of the full
    fine-tuning range, from the first step (no warmup)."""
    findings = run_glue(BERT_BASE_CASED_CLS, lr=5e-5).findings()
    [warmup] = [f for f in findings if f.check == "warmup"]
    assert warmup.severity == "warning" and warmup.cause == "missing_warmup"
    assert "near the top of its range" in warmup.message
    assert "mode_and_lr" not in {f.check for f in findings}  # the LR itself is in range


@pytest.mark.parametrize(("lora_alpha", "severity"), [(16, None), (24, "info"), (32, "info"),
                                                      (40, "warning"), (64, "warning"),
                                                      (128, "error")])
def test_alpaca_lora_with_other_alphas(lora_alpha: int, severity: str | None) -> None:
    found = [f for f in alpaca_lora(LLAMA_7B, lora_alpha=lora_alpha).findings()
             if f.check == "lora_scaling"]
    assert [f.severity for f in found] == ([severity] if severity else [])


@pytest.mark.parametrize(("lora_alpha", "severity"), [(16, None), (32, "info"), (64, "warning")])
def test_qlora_under_rslora_is_judged_by_alpha_over_sqrt_r(lora_alpha: int,
                                                          severity: str | None) -> None:
    found = [f for f in qlora(LLAMA_7B, use_rslora=True, lora_alpha=lora_alpha).findings()
             if f.check == "lora_scaling"]
    assert [f.severity for f in found] == ([severity] if severity else [])
    if found:
        assert found[0].evidence["scaling"] == lora_alpha / 8 and "sqrt(r)" in found[0].message
