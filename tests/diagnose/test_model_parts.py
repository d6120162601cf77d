"""The parts of a diffusion model, found by what they are: real diffusers and transformers
modules built from tiny configs."""

from __future__ import annotations

import pytest
from torch import nn

pytest.importorskip("diffusers")
from benchmarks.scenarios.families.diffusers_sd import (
    LatentDiffusion,
    tiny_unet,
    tiny_vae,
)
from transformers import CLIPTextConfig, CLIPTextModel

from trainguard.diagnose.model_parts import (
    denoisers,
    fixed_parts,
    is_autoencoder,
    is_text_encoder,
    takes_timestep,
)


def tiny_text_encoder() -> CLIPTextModel:
    return CLIPTextModel(CLIPTextConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                        num_hidden_layers=1, num_attention_heads=2,
                                        max_position_embeddings=8, bos_token_id=0,
                                        eos_token_id=1, pad_token_id=1))


def test_roles_are_read_from_the_modules() -> None:
    unet, vae, text = tiny_unet(), tiny_vae(), tiny_text_encoder()
    assert takes_timestep(unet) and not takes_timestep(vae) and not takes_timestep(text)
    assert is_autoencoder(vae) and not is_autoencoder(unet) and not is_autoencoder(text)
    assert is_text_encoder(text) and not is_text_encoder(vae) and not is_text_encoder(unet)


def test_parts_beside_the_denoiser_under_any_name() -> None:
    pipeline = nn.ModuleDict({"model": tiny_unet(), "first_stage_model": tiny_vae(),
                              "cond_stage_model": tiny_text_encoder()})
    assert denoisers(pipeline) == ["model"]
    parts = {p.name: p.role for p in fixed_parts(pipeline)}
    assert parts == {"first_stage_model": "autoencoder", "cond_stage_model": "text_encoder"}


def test_no_parts_without_a_denoiser_beside_them() -> None:
    assert fixed_parts(tiny_unet()) == []  # the denoiser alone
    assert fixed_parts(tiny_vae()) == []  # a VAE trained on its own is the run's subject
    assert fixed_parts(nn.ModuleDict({"vae": tiny_vae(), "head": nn.Linear(4, 4)})) == []


def test_a_wrapper_holding_the_denoiser_is_not_a_part() -> None:
    model = LatentDiffusion(tiny_unet(4, 8), tiny_vae())
    assert denoisers(model) == ["unet"]
    assert [(p.name, p.role) for p in fixed_parts(model)] == [("first_stage_model",
                                                               "autoencoder")]
