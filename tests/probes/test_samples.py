"""Samples seen: the Guard makes a diffusion model's samples on a budget, leaves the training
as it was, and sees the colour noise a loss does not show."""

from __future__ import annotations

import logging
import time

import pytest
import torch
import torch.nn.functional as F

from trainguard import Guard, GuardConfig
from trainguard.probes.samples import SampleProbe

diffusers = pytest.importorskip("diffusers")
from benchmarks.scenarios.families import diffusers_sd  # noqa: E402

from trainguard.recipes import sampler  # noqa: E402

QUIET = {"sinks": {"console": False}}


def tiny_unet() -> torch.nn.Module:
    torch.manual_seed(0)
    return diffusers.UNet2DModel(sample_size=8, in_channels=3, out_channels=3, layers_per_block=1,
                                 block_out_channels=(16, 32), norm_num_groups=8,
                                 down_block_types=("DownBlock2D", "DownBlock2D"),
                                 up_block_types=("UpBlock2D", "UpBlock2D"))


def train(unet: torch.nn.Module, scheduler, images: torch.Tensor, steps: int, *, lr: float,
          config: GuardConfig, sample_fn=None, v_target: bool = False) -> Guard:
    """The diffusers examples' loop; `v_target`: the loss aims at the velocity while the
    scheduler (and so the sampler) expects the noise, a mismatch the loss cannot show."""
    optimizer = torch.optim.AdamW(unet.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(1)
    guard = Guard(unet, optimizer, config=config, sample_fn=sample_fn)
    for step in range(steps):
        clean = images[(step * 16) % len(images):][:16]
        noise = torch.randn(clean.shape, generator=generator)
        t = torch.randint(0, scheduler.config.num_train_timesteps, (clean.shape[0],),
                          generator=generator)
        target = scheduler.get_velocity(clean, noise, t) if v_target else noise
        loss = F.mse_loss(unet(scheduler.add_noise(clean, noise, t), t).sample, target)
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    return guard


def test_sampling_leaves_the_training_bit_for_bit_as_it_was() -> None:
    """`observe` stays neutral: the samples are made under no_grad, in eval mode, and the global
    generators are put back (this sampler draws from them on purpose)."""
    scheduler = diffusers.DDPMScheduler(num_train_timesteps=100)
    images = torch.rand(32, 3, 8, 8) * 2 - 1

    def greedy_sampler(model: torch.nn.Module) -> torch.Tensor:
        x = torch.randn(2, 3, 8, 8)  # the global generator
        return model(x, torch.tensor(50)).sample

    config = GuardConfig(policy="observe", probes={"samples_every": 2, "samples_budget": 1.0},
                         **QUIET)
    plain = train(tiny_unet(), scheduler, images, 8, lr=1e-3, config=config)
    seen = train(tiny_unet(), scheduler, images, 8, lr=1e-3, config=config,
                 sample_fn=greedy_sampler)
    assert seen._samples is not None and seen._samples.probe.calls == 5  # before 0, then 1, 3, 5, 7
    for a, b in zip(plain.model.parameters(), seen.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert seen.model.training and seen.samples is not None and seen.samples.shape == (2, 3, 8, 8)


def test_a_sampler_that_fails_is_logged_and_the_run_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    def broken(model: torch.nn.Module) -> torch.Tensor:
        raise RuntimeError("out of memory")

    scheduler = diffusers.DDPMScheduler(num_train_timesteps=100)
    with caplog.at_level(logging.ERROR, logger="trainguard"):
        guard = train(tiny_unet(), scheduler, torch.rand(32, 3, 8, 8) * 2 - 1, 4, lr=1e-3,
                      config=GuardConfig(probes={"samples_every": 1}, **QUIET), sample_fn=broken)
    assert "sample_fn failed" in caplog.text and guard.run.steps_taken == 4
    assert not [e for e in guard.events if e.kind == "samples_degraded"]


def test_the_cadence_keeps_to_the_budget() -> None:
    probe = SampleProbe(lambda m: torch.zeros(1, 3, 4, 4), every=10, budget=0.02)
    probe.seconds, probe._gap_steps = 0.5, 10
    assert probe._gap(trained=1.0) == 250  # 0.1 s a step: 0.5 s is 2% of 25 s, 250 steps
    assert probe._gap(trained=1000.0) == 10  # a cheap call: the cadence's own floor
    assert probe._gap(trained=None) == 10
    model = torch.nn.Linear(2, 2)
    start = time.perf_counter()
    probe.take(model, 0)
    assert probe.calls == 1 and probe.spent <= time.perf_counter() - start


@pytest.mark.slow
def test_colour_noise_is_seen_long_before_any_loss_event_and_the_healthy_twin_is_quiet() -> None:
    """A pre-trained UNet fine-tuned on the velocity while its scheduler (and sampler) expect the
    noise: the loss falls as a healthy run's does, the samples turn into colour noise."""
    images = diffusers_sd._images(diffusers_sd.Recipe(), 256, torch.Generator().manual_seed(0))
    scheduler = diffusers_sd.noise_scheduler()
    config = GuardConfig(policy="observe", probes={"samples_every": 5, "samples_budget": 1.0},
                         **QUIET)
    runs = {}
    for name, v_target in (("healthy", False), ("v_target", True)):
        runs[name] = train(diffusers_sd.base_unet(), scheduler, images, 40, lr=2e-3,
                           config=config, sample_fn=sampler(scheduler, images=4, steps=10),
                           v_target=v_target)
    assert [e for e in runs["healthy"].events if e.severity != "info"] == []
    events = runs["v_target"].events
    [seen] = [e for e in events if e.kind == "samples_degraded"]
    assert seen.step <= 10 and "colour noise" in seen.message
    others = [e for e in events if e.kind != "samples_degraded"]
    assert all(e.step >= seen.step + 10 for e in others), others
    # the loss fell as the healthy run's did; the verdict goes by the samples still broken
    assert runs["healthy"].verdict is not None and runs["healthy"].verdict.verdict == "healthy"
    verdict = runs["v_target"].verdict
    assert verdict is not None and verdict.verdict == "degraded"
    assert "samples were broken from step" in verdict.message


def test_the_samples_are_kept_in_the_run_store_drawn_in_the_report_and_in_tensorboard(
        tmp_path) -> None:
    """The run store keeps each call's samples drawn (the first marked the reference), the HTML
    report shows them over steps, and TensorBoard gets them as images."""
    accumulator = pytest.importorskip(
        "tensorboard.backend.event_processing.event_accumulator", reason="needs tensorboard")
    from trainguard.report.data import read_run
    from trainguard.report.sample_grid import samples_html
    from trainguard.sinks import TensorBoardSink

    scheduler = diffusers.DDPMScheduler(num_train_timesteps=100)
    images = torch.rand(32, 3, 8, 8) * 2 - 1

    def fixed_sampler(model: torch.nn.Module) -> torch.Tensor:
        x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0))
        return model(x, torch.tensor(50)).sample

    unet = tiny_unet()
    optimizer = torch.optim.AdamW(unet.parameters(), lr=1e-3)
    config = GuardConfig(probes={"samples_every": 2, "samples_budget": 1.0}, **QUIET)
    guard = Guard(unet, optimizer, config=config, sample_fn=fixed_sampler,
                  run_dir=tmp_path / "run", sinks=[TensorBoardSink(tmp_path / "tb")])
    for step in range(6):
        clean = images[step * 4:][:4]
        noise = torch.randn(clean.shape)
        t = torch.randint(0, 100, (4,))
        loss = F.mse_loss(unet(scheduler.add_noise(clean, noise, t), t).sample, noise)
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
    guard.close()

    data = read_run(tmp_path / "run")
    kept = data.meta["samples"]
    assert [s["step"] for s in kept] == [-1, 1, 3, 5]
    assert [s["first"] for s in kept] == [True, False, False, False]
    assert not any(s["degraded"] for s in kept)
    html = samples_html(data)
    assert html is not None and html.count('<img class="samples"') == 4

    tb = accumulator.EventAccumulator(str(tmp_path / "tb"), size_guidance={"images": 0})
    tb.Reload()
    assert [e.step for e in tb.Images("samples")] == [-1, 1, 3, 5]
    assert {e.step for e in tb.Scalars("samples/roughness")} == {-1, 1, 3, 5}
