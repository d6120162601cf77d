"""The diffusion target probe on real diffusers models: the prediction's error against each
target, exactly what the loop's loss computes, and nothing changed in the step."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.diffusion_models import tiny_unet
from trainguard.probes.diffusion_target import CHECK_STEPS, DiffusionTargetProbe, readable

diffusers = pytest.importorskip("diffusers")


def scheduler(prediction_type: str = "epsilon") -> object:
    return diffusers.DDPMScheduler(num_train_timesteps=50, prediction_type=prediction_type)


def one_batch(unet: torch.nn.Module, noise_scheduler: object
              ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    clean = torch.rand(4, 3, 8, 8) * 2 - 1
    noise = torch.randn_like(clean)
    timesteps = torch.tensor([0, 10, 30, 49])
    noisy = noise_scheduler.add_noise(clean, noise, timesteps)  # type: ignore[attr-defined]
    predicted = unet(noisy, timesteps).sample
    velocity = noise_scheduler.get_velocity(clean, noise, timesteps)  # type: ignore[attr-defined]
    return predicted, {"epsilon": noise, "v_prediction": velocity, "sample": clean}


def test_its_errors_are_the_losses_against_each_target() -> None:
    unet, noise_scheduler = tiny_unet(), scheduler()
    probe = DiffusionTargetProbe(noise_scheduler, unet)
    predicted, targets = one_batch(unet, noise_scheduler)
    errors = probe.take()
    assert errors is not None
    expected = torch.stack([F.mse_loss(predicted, targets[k])
                            for k in ("epsilon", "v_prediction", "sample")]).detach()
    torch.testing.assert_close(errors, expected)


def test_it_changes_nothing_the_loop_computes() -> None:
    """`add_noise` returns the scheduler's own result, the UNet's output is untouched, and no
    random number is drawn."""
    plain_unet, plain_scheduler = tiny_unet(), scheduler()
    torch.manual_seed(5)
    plain, _ = one_batch(plain_unet, plain_scheduler)
    after_plain = torch.rand(1)
    unet, noise_scheduler = tiny_unet(), scheduler()
    probe = DiffusionTargetProbe(noise_scheduler, unet)
    torch.manual_seed(5)
    watched, _ = one_batch(unet, noise_scheduler)
    probe.take()
    assert torch.equal(plain, watched) and torch.equal(after_plain, torch.rand(1))


def test_a_forward_on_anything_but_the_noised_batch_is_not_taken() -> None:
    """A sampler's or a reference model's forward on other inputs is not the training
    prediction."""
    unet, noise_scheduler = tiny_unet(), scheduler()
    probe = DiffusionTargetProbe(noise_scheduler, unet)
    clean = torch.randn(2, 3, 8, 8)
    noise_scheduler.add_noise(clean, torch.randn_like(clean), torch.tensor([3, 4]))
    unet(torch.randn(2, 3, 8, 8), torch.tensor([3, 4]))
    assert probe.take() is None


def test_it_comes_off_after_its_steps() -> None:
    unet, noise_scheduler = tiny_unet(), scheduler()
    probe = DiffusionTargetProbe(noise_scheduler, unet)
    for _ in range(CHECK_STEPS):
        one_batch(unet, noise_scheduler)
        assert probe.take() is not None
    assert not probe.attached and "add_noise" not in vars(noise_scheduler)
    one_batch(unet, noise_scheduler)
    assert probe.take() is None


def test_it_finds_a_denoiser_inside_a_larger_model() -> None:
    """A latent diffusion model holding its UNet under any name: the UNet's forward is the one
    hooked."""
    holder = torch.nn.ModuleDict({"denoiser": tiny_unet()})
    noise_scheduler = scheduler()
    probe = DiffusionTargetProbe(noise_scheduler, holder)
    one_batch(holder["denoiser"], noise_scheduler)
    assert probe.take() is not None


def test_schedulers_it_can_read() -> None:
    assert readable(scheduler()) and readable(scheduler("v_prediction"))
    assert not readable(diffusers.FlowMatchEulerDiscreteScheduler())
    assert not readable(object())
