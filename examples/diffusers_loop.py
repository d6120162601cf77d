"""trainguard.Guard in a diffusers training loop: the UNet learns to predict the noise.

    python examples/diffusers_loop.py --steps 60
    python examples/diffusers_loop.py --steps 60 --lr 0.5        # far too high
    python examples/diffusers_loop.py --steps 60 --pixels-255    # images left in [0, 255]
    python examples/diffusers_loop.py --steps 60 --velocity      # a v-prediction target

The loop of diffusers' training examples (`train_unconditional.py`): clean images, noise added at
a random timestep by a `DDPMScheduler`, the UNet's noise prediction against the noise (MSE). The
model is a tiny `UNet2DModel` built from a config, the data 16x16 images of soft discs, so it runs
on a CPU in seconds. Hand `guard.step` the batch: its first batch is inspected (images in
[0, 255] instead of [-1, 1] are named before the first update), and its noise scheduler: the
first steps' loss is checked against the target the scheduler's `prediction_type` names (a
velocity target under an epsilon scheduler is named at the first step). The guide's remedies for
latent diffusion (freeze the VAE, clip the convolutions, LoRA on the UNet) are in
`trainguard.recipes`; see docs/diffusion.md.
"""

from __future__ import annotations

import argparse
import tempfile

import torch
import torch.nn.functional as F
from diffusers import DDPMScheduler, UNet2DModel

import trainguard


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps")
    parser.add_argument("--lr", type=float, default=2e-3, help="AdamW learning rate")
    parser.add_argument("--pixels-255", action="store_true",
                        help="hand the images over in [0, 255] (a common data bug)")
    parser.add_argument("--velocity", action="store_true",
                        help="score the UNet against the velocity while the scheduler says "
                             "epsilon (a copied v-prediction script)")
    parser.add_argument("--run-dir", default=None,
                        help="trainguard run store (default: a new temporary directory)")
    return parser.parse_args(argv)


def discs(n: int, size: int = 16, seed: int = 0) -> torch.Tensor:
    """n RGB images in [-1, 1]: a soft disc of a random colour on a dark background."""
    generator = torch.Generator().manual_seed(seed)
    grid = torch.linspace(-1, 1, size)
    y, x = torch.meshgrid(grid, grid, indexing="ij")
    centre = torch.rand(n, 2, 1, 1, generator=generator) - 0.5
    radius = 0.3 + 0.3 * torch.rand(n, 1, 1, generator=generator)
    distance = ((x - centre[:, 0]) ** 2 + (y - centre[:, 1]) ** 2).sqrt()
    mask = torch.sigmoid((radius - distance) * 20).unsqueeze(1)
    colour = torch.rand(n, 3, 1, 1, generator=generator) * 2 - 1
    return (mask * colour + (1 - mask) * -0.8).clamp(-1, 1)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run_dir = args.run_dir or tempfile.mkdtemp(prefix="trainguard-diffusers-")
    torch.manual_seed(0)
    unet = UNet2DModel(sample_size=16, in_channels=3, out_channels=3, layers_per_block=1,
                       block_out_channels=(32, 64), norm_num_groups=8,
                       down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                       up_block_types=("AttnUpBlock2D", "UpBlock2D"))
    scheduler = DDPMScheduler(num_train_timesteps=1000)
    optimizer = torch.optim.AdamW(unet.parameters(), lr=args.lr)
    images = discs(256)
    if args.pixels_255:
        images = (images + 1) * 127.5
    config = trainguard.GuardConfig(policy="protect")
    with trainguard.Guard(unet, optimizer, config=config, run_dir=run_dir,
                          noise_scheduler=scheduler) as guard:
        for step in range(args.steps):
            clean = images[(step * 16) % 256:(step * 16) % 256 + 16]
            noise = torch.randn_like(clean)
            timesteps = torch.randint(0, scheduler.config.num_train_timesteps, (clean.shape[0],))
            noisy = scheduler.add_noise(clean, noise, timesteps)
            target = (scheduler.get_velocity(clean, noise, timesteps) if args.velocity
                      else noise)
            loss = F.mse_loss(unet(noisy, timesteps).sample, target)
            loss.backward()
            report = guard.step(loss, batch={"pixel_values": clean})
            optimizer.zero_grad(set_to_none=True)
    print(f"final loss {report.loss:.4f}")
    print("events:", sorted({e.kind for e in guard.events}) or "none")
    warned = sorted({f.check for f in guard.findings if f.severity != "info"})
    print("findings:", warned or "none")
    causes = guard.diagnose()
    print("likely cause:", causes[0].code if causes else "none")
    print("verdict:", guard.verdict.verdict if guard.verdict else "none")
    print("run store:", run_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
