"""The `diffusers` family: the diffusion library's own models, trained as its examples train
them. Its healthy twins are quiet on three seeds; each fault is caught with its cause first."""

from __future__ import annotations

import pytest

pytest.importorskip("diffusers")
from benchmarks.scenarios import run_scenario, scenario

HEALTHY = ("diffusers_healthy", "diffusers_healthy_latent", "diffusers_healthy_lora",
           "diffusers_healthy_conditioned", "diffusers_healthy_constant_lr")
FAULTS = {
    "diffusers_lr_too_high": "lr_too_high",
    "diffusers_unfrozen_vae": "unfrozen_part",
    "diffusers_images_255": "input_scale",
    "diffusers_channels_scrambled": "input_scale",
    "diffusers_fp16_no_scaler": "optimizer_eps",
    "diffusers_conditioning_init": "bad_init",
    "diffusers_velocity_target": "prediction_type_mismatch",
    "diffusers_lr_raised": "lr_too_high",
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_twins_are_quiet(name: str, seed: int) -> None:
    result = run_scenario(scenario(name), seed=seed)
    assert result.outcome == "finished" and result.false_alarms == 0, (
        [e for e in result.events if e["severity"] != "info"], result.findings)
    assert result.verdict == "healthy" and result.diagnosis == []


@pytest.mark.parametrize("name", FAULTS)
def test_each_fault_is_caught_with_its_cause_first(name: str) -> None:
    result = run_scenario(scenario(name))
    assert result.detected and result.latency <= 1
    assert result.diagnosis[0] == FAULTS[name], result.diagnosis


def test_the_unfrozen_vae_and_the_pixel_range_are_named_before_the_first_step() -> None:
    """The VAE in the optimizer is the preflight's (found under `first_stage_model`), the
    [0, 255] images the first batch's."""
    vae = run_scenario(scenario("diffusers_unfrozen_vae"), steps=1)
    assert [f["cause"] for f in vae.findings if f["severity"] == "warning"] == ["unfrozen_part"]
    assert "first_stage_model" in vae.findings[0]["message"]
    pixels = run_scenario(scenario("diffusers_images_255"), steps=1)
    [event] = [e for e in pixels.events if e["severity"] == "warning"]
    assert (event["step"], event["kind"], event["details"]["cause"]) == (
        0, "batch_image_range", "input_scale")


def test_scrambled_channels_are_named_on_the_first_batch() -> None:
    """Channel-last images reshaped, not permuted: the first batch's check names it."""
    scrambled = run_scenario(scenario("diffusers_channels_scrambled"), steps=1)
    [event] = [e for e in scrambled.events if e["severity"] == "warning"]
    assert (event["step"], event["kind"], event["details"]["cause"]) == (
        0, "batch_channel_order", "input_scale")


def test_a_velocity_target_under_an_epsilon_scheduler_is_named_at_the_first_step() -> None:
    """The loop's loss scores the velocity; its scheduler samples for the noise."""
    ran = run_scenario(scenario("diffusers_velocity_target"), steps=1)
    [finding] = [f for f in ran.findings if f["severity"] == "warning"]
    assert (finding["check"], finding["cause"]) == ("diffusion_target",
                                                    "prediction_type_mismatch")
