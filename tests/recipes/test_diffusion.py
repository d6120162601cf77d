"""Diffusion fine-tuning's remedies on real diffusers models built from tiny configs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("diffusers")
pytest.importorskip("peft")

from benchmarks.scenarios.families.diffusers_sd import (
    LatentDiffusion,
    noise_scheduler,
    tiny_unet,
    tiny_vae,
)

from trainguard import Guard, GuardConfig, preflight
from trainguard.diagnose.lr_range import fine_tuning_mode
from trainguard.recipes import conv_clip, freeze_parts, unet_lora


def latent_step(model: LatentDiffusion, seed: int = 0) -> torch.Tensor:
    """One batch of the diffusers examples' latent objective, the VAE encoding inside it."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.rand(4, 3, 16, 16, generator=generator) * 2 - 1
    latents = model.latents(images, generator)
    noise = torch.randn(latents.shape, generator=generator)
    timesteps = torch.randint(0, 100, (4,), generator=generator)
    noisy = noise_scheduler().add_noise(latents, noise, timesteps)
    return F.mse_loss(model.unet(noisy, timesteps).sample, noise)


def pixel_loss(unet: torch.nn.Module, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    images = torch.rand(4, 3, 16, 16, generator=generator) * 2 - 1
    noise = torch.randn(images.shape, generator=generator)
    timesteps = torch.randint(0, 100, (4,), generator=generator)
    noisy = noise_scheduler().add_noise(images, noise, timesteps)
    return F.mse_loss(unet(noisy, timesteps).sample, noise)


def test_freeze_parts_freezes_the_vae_and_takes_it_out_of_the_optimizer() -> None:
    torch.manual_seed(0)
    model = LatentDiffusion(tiny_unet(4, 8), tiny_vae())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # the whole pipeline
    assert freeze_parts(model, optimizer) == ["first_stage_model"]
    vae = model.first_stage_model
    assert not vae.training and not any(p.requires_grad for p in vae.parameters())
    optimized = {id(p) for g in optimizer.param_groups for p in g["params"]}
    assert optimized == {id(p) for p in model.unet.parameters()}
    assert "frozen_parts" not in {f.check for f in preflight(model, optimizer)}
    before_vae = [p.detach().clone() for p in vae.parameters()]
    before_unet = [p.detach().clone() for p in model.unet.parameters()]
    latent_step(model).backward()
    optimizer.step()
    assert all(torch.equal(a, p) for a, p in zip(before_vae, vae.parameters(), strict=True))
    assert not all(torch.equal(a, p) for a, p in zip(before_unet, model.unet.parameters(),
                                                      strict=True))


def test_freeze_parts_leaves_a_model_without_parts_alone() -> None:
    unet = tiny_unet()
    optimizer = torch.optim.AdamW(unet.parameters(), lr=1e-3)
    assert freeze_parts(unet, optimizer) == []
    assert all(p.requires_grad for p in unet.parameters())
    assert len(optimizer.param_groups[0]["params"]) == len(list(unet.parameters()))


def test_conv_clip_holds_each_convolution_and_leaves_the_rest() -> None:
    torch.manual_seed(0)
    unet = tiny_unet()
    limit = 1e-4  # far below this UNet's convolution gradients
    rule = conv_clip(unet, limit)
    optimizer = torch.optim.SGD(unet.parameters(), lr=0.0)  # the gradients stay to be read
    guard = Guard(unet, optimizer, config=GuardConfig(clip={"rule": rule},
                                                      sinks={"console": False}))
    loss = pixel_loss(unet)
    loss.backward()
    raw = {n: p.grad.norm().item() for n, p in unet.named_parameters()}
    guard.step(loss)
    guard.close()
    convs = {f"{m}.{n}" for m, module in unet.named_modules()
             if isinstance(module, torch.nn.Conv2d) for n, _ in module.named_parameters()}
    for name, p in unet.named_parameters():
        norm = p.grad.norm().item()
        if name in convs and raw[name] > limit:
            assert norm == pytest.approx(limit, rel=1e-3), name
        else:
            assert norm == pytest.approx(raw[name], rel=1e-6), name
    assert any(raw[n] > limit for n in convs)
    assert "time_embedding.linear_1.weight" not in convs


def test_unet_lora_trains_the_adapters_only() -> None:
    torch.manual_seed(0)
    unet = unet_lora(tiny_unet(), r=4)
    trained = [n for n, p in unet.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n for n in trained)
    assert any("conv1.lora_A" in n for n in trained) and any("to_q.lora_A" in n for n in trained)
    assert fine_tuning_mode(unet) == "lora"
    base = {n: p.detach().clone() for n, p in unet.named_parameters() if not p.requires_grad}
    lora = {n: p.detach().clone() for n, p in unet.named_parameters() if p.requires_grad}
    optimizer = torch.optim.AdamW([p for p in unet.parameters() if p.requires_grad], lr=1e-2)
    for seed in range(2):
        optimizer.zero_grad()
        pixel_loss(unet, seed).backward()
        optimizer.step()
    params = dict(unet.named_parameters())
    assert all(torch.equal(v, params[n]) for n, v in base.items())
    assert any(not torch.equal(v, params[n]) for n, v in lora.items())


def test_pipeline_sampler_samples_the_trained_unet_and_leaves_the_training_alone() -> None:
    """A DDPMPipeline built on the UNet being trained: its samples through the Guard, the
    training bit for bit as without them, the training's scheduler's timesteps untouched."""
    from diffusers import DDPMPipeline

    from trainguard.errors import UsageError
    from trainguard.recipes import pipeline_sampler

    def train(with_samples: bool) -> tuple[torch.nn.Module, Guard, torch.Tensor]:
        torch.manual_seed(0)
        unet = tiny_unet()
        scheduler = noise_scheduler()
        scheduler.set_timesteps(7)
        before = scheduler.timesteps.clone()
        sample_fn = (pipeline_sampler(DDPMPipeline(unet=unet, scheduler=scheduler), images=2,
                                      steps=3) if with_samples else None)
        optimizer = torch.optim.AdamW(unet.parameters(), lr=1e-3)
        config = GuardConfig(policy="observe", sinks={"console": False},
                             probes={"samples_every": 2, "samples_budget": 1.0})
        guard = Guard(unet, optimizer, config=config, sample_fn=sample_fn)
        for step in range(4):
            loss = pixel_loss(unet, seed=step)
            loss.backward()
            guard.step(loss)
            optimizer.zero_grad(set_to_none=True)
        guard.close()
        assert torch.equal(scheduler.timesteps, before)
        return unet, guard, before

    plain, _, _ = train(False)
    sampled, guard, _ = train(True)
    for a, b in zip(plain.parameters(), sampled.parameters(), strict=True):
        assert torch.equal(a, b)
    assert guard.samples is not None and guard.samples.shape[:2] == (2, 3)
    assert float(guard.samples.min()) >= 0.0 and float(guard.samples.max()) <= 1.0
    other = pipeline_sampler(DDPMPipeline(unet=tiny_unet(), scheduler=noise_scheduler()))
    with pytest.raises(UsageError, match="does not hold the model"):
        other(sampled)
    with pytest.raises(UsageError, match="diffusers pipeline"):
        pipeline_sampler(object())
