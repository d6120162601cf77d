"""The sane LR range sized to the model, its mode and its optimizer: one range that the preflight
judges the LR by and the cause ranking's advice names."""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

import trainguard
from trainguard.demo import MarkovLanguage, TinyCausalLM
from trainguard.diagnose.lr_range import FULL_LR_RANGE, sane_lr
from trainguard.sinks.console import ConsoleSink

from ..conftest import torch_threads


def _tiny_lm() -> TinyCausalLM:
    torch.manual_seed(0)
    return TinyCausalLM(vocab_size=64, d_model=64, n_layer=2, n_head=2, max_len=32)


def test_a_small_model_from_scratch_is_advised_the_range_the_preflight_allows() -> None:
    """A 0.11M-parameter model from scratch whose loop raises the LR 300x mid-run: the advice
    names the range the preflight sizes for it, not the guide's 7B range."""
    out = io.StringIO()
    with torch_threads(1):
        model = _tiny_lm()
        language = MarkovLanguage(vocab_size=64, seed=0)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
        guard = trainguard.Guard(model, optimizer,
                                 config=trainguard.GuardConfig(sinks={"console": False}),
                                 sinks=[ConsoleSink(out)])
        for step in range(45):
            if step == 30:
                for group in optimizer.param_groups:
                    group["lr"] = 3.0
            loss = model.loss(language.batch(8, 17))
            loss.backward()
            guard.step(loss)
            optimizer.zero_grad(set_to_none=True)
        guard.close()
    sane = sane_lr(model, [optimizer])
    assert sane.params < 2e5 and sane.pretrained is None and sane.high is not None
    assert sane.high == pytest.approx(FULL_LR_RANGE[1] * sane.allowance)
    [advice] = [c.fix for c in guard.diagnose() if c.code == "lr_too_high"]
    assert f"at most {sane.high:.3g}" in advice and "from scratch" in advice
    assert not advice.startswith("Use Adam(W) 1e-6..5e-5")
    # what the console printed beside the incident's likely causes is the same advice
    printed = [line for line in out.getvalue().splitlines() if "likely causes: lr_too_high" in line]
    assert printed and all(f"at most {sane.high:.3g}" in line for line in printed)


def test_the_preflight_judges_by_the_same_range_it_advises() -> None:
    model = _tiny_lm()
    sane = sane_lr(model, [torch.optim.AdamW(model.parameters(), lr=1e-3)])
    assert sane.high is not None and sane.low is not None
    above = torch.optim.AdamW(model.parameters(), lr=2 * sane.high)
    [finding] = [f for f in trainguard.preflight(model, above) if f.check == "mode_and_lr"]
    assert finding.cause == "lr_too_high" and f"at most {sane.high:.3g}" in finding.fix
    assert finding.evidence["sane_range"] == [sane.low, sane.high]
    inside = torch.optim.AdamW(model.parameters(), lr=sane.high / 2)
    assert not [f for f in trainguard.preflight(model, inside) if f.check == "mode_and_lr"]
    # a small model trains at the guide's low end too, slowly: far below it, the same range
    assert sane.low == FULL_LR_RANGE[0]
    below = torch.optim.AdamW(model.parameters(), lr=sane.low / 20)
    [low] = [f for f in trainguard.preflight(model, below) if f.check == "mode_and_lr"]
    assert low.cause == "lr_too_low" and f"try {sane.low:.3g} or more" in low.fix
    assert sane.sized() in low.message


def test_lora_adapters_keep_their_range_whatever_the_base() -> None:
    peft = pytest.importorskip("peft")
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = peft.get_peft_model(GPT2LMHeadModel(GPT2Config(
        n_layer=2, n_embd=64, n_head=2, vocab_size=100, n_positions=32)),
        peft.LoraConfig(r=8, lora_alpha=16, target_modules=["c_attn"]))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    sane = sane_lr(model, [optimizer])
    assert (sane.mode, sane.low, sane.high, sane.allowance) == ("lora", 1e-4, 5e-3, 1.0)
    assert "Adam(W) 0.0001..0.005 for LoRA, whatever the base's size" in \
        sane.fixes()["lr_too_high"]
    # an LR inside the range can still be too low for the run: raised toward the top, not "into"
    assert sane.fixes()["lr_too_low"].startswith("Raise the LR, 10x at a time, to at most 0.005")


def test_an_optimizer_the_guide_gives_no_range_for_is_advised_none() -> None:
    model = nn.Linear(8, 2)
    sane = sane_lr(model, [torch.optim.SGD(model.parameters(), lr=0.1)])
    assert sane.low is sane.high is None
    fixes = sane.fixes()
    assert "say nothing of SGD" in fixes["lr_too_high"] and "Adam(W) 1e" not in fixes["lr_too_high"]
    assert "Raise SGD's LR" in fixes["lr_too_low"]
