"""Which target a diffusion loss scores, read from its errors against each (table tests)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tests.diffusion_models import tiny_unet
from trainguard import Guard, GuardConfig
from trainguard.diagnose.diffusion_target import read_target
from trainguard.finding import Finding

ERRORS = (0.06, 0.83, 1.07)
"""Against the noise, the velocity and the clean sample, in that order."""


@pytest.mark.parametrize(("loss", "errors", "prediction_type", "trained", "finding"), [
    (0.06, ERRORS, "epsilon", "epsilon", False),                # as configured
    (0.83, ERRORS, "epsilon", "v_prediction", True),             # velocity, epsilon scheduler
    (0.06, ERRORS, "v_prediction", "epsilon", True),             # noise, v scheduler
    (1.07, ERRORS, "sample", "sample", False),
    (0.0601, ERRORS, "v_prediction", "epsilon", True),           # float16 rounding: still it
    (0.5, ERRORS, "epsilon", None, False),                       # SNR-weighted: none of them
    (0.03, ERRORS, "v_prediction", None, False),                 # halved over micro-batches
    (0.5, (0.5, 0.51, 0.9), "v_prediction", None, False),        # two targets alike
    (math.nan, ERRORS, "v_prediction", None, False),
    (None, ERRORS, "v_prediction", None, False),
])
def test_the_target_read_from_the_loss(loss, errors, prediction_type, trained,
                                       finding) -> None:
    read = read_target(loss, errors, prediction_type)
    assert read.trained == trained
    assert (read.finding is not None) == finding
    if read.finding is not None:
        assert read.finding.cause == "prediction_type_mismatch"
        assert read.finding.severity == "warning"
        assert f"'{prediction_type}'" in read.finding.message
        assert f"prediction_type='{trained}'" in read.finding.fix


# -- in a guarded diffusers loop ---------------------------------------------------------------
def diffusers_loop(target: str, prediction_type: str = "epsilon", *, weighted: bool = False,
                   steps: int = 4, given: bool = True, set_late: str | None = None,
                   sync: str = "blocking"
                   ) -> tuple[list[Finding], list[str], dict[str, torch.Tensor]]:
    """A `train_unconditional.py`-style loop under the Guard: the findings, the diagnosis
    and the final weights."""
    diffusers = pytest.importorskip("diffusers")
    unet = tiny_unet()
    noise_scheduler = diffusers.DDPMScheduler(num_train_timesteps=50,
                                              prediction_type=prediction_type)
    optimizer = torch.optim.AdamW(unet.parameters(), lr=1e-3, fused=sync == "deferred")
    guard = Guard(unet, optimizer, config=GuardConfig(sync=sync, sinks={"console": False}),
                  noise_scheduler=noise_scheduler if given else None)
    if set_late is not None:  # as the diffusers examples do with --prediction_type
        noise_scheduler.register_to_config(prediction_type=set_late)
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        clean = torch.rand(4, 3, 8, 8, generator=generator) * 2 - 1
        noise = torch.randn(clean.shape, generator=generator)
        timesteps = torch.randint(0, 50, (4,), generator=generator)
        noisy = noise_scheduler.add_noise(clean, noise, timesteps)
        predicted = unet(noisy, timesteps).sample
        goal = noise_scheduler.get_velocity(clean, noise, timesteps) if target == "v" else noise
        if weighted:  # min-SNR-style weights per sample
            per_sample = F.mse_loss(predicted, goal, reduction="none").mean(dim=(1, 2, 3))
            loss = (per_sample * (timesteps.float() + 1) / 25).mean()
        else:
            loss = F.mse_loss(predicted, goal)
        loss.backward()
        guard.step(loss, batch={"pixel_values": clean})
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    found = [f for f in guard.findings if f.check == "diffusion_target"]
    return found, [c.code for c in guard.diagnose()], {
        k: v.clone() for k, v in unet.state_dict().items()}


@pytest.mark.parametrize("sync", ["blocking", "deferred"])
def test_a_velocity_loss_under_an_epsilon_scheduler_is_named_at_the_first_step(sync) -> None:
    """Under `sync="deferred"` (a fused AdamW) the errors ride the step's transfer as well, read
    a call later."""
    found, diagnosis, _ = diffusers_loop("v", sync=sync)
    [finding] = found
    assert finding.evidence["trained_for"] == "v_prediction"
    assert diagnosis[0] == "prediction_type_mismatch"


@pytest.mark.parametrize(("target", "prediction_type", "weighted", "set_late"), [
    ("noise", "epsilon", False, None),
    ("v", "v_prediction", False, None),
    ("v", "epsilon", False, "v_prediction"),  # set on the scheduler after the Guard was made
    ("v", "epsilon", True, None),             # weighted: the loss is none of the plain errors
])
def test_quiet_when_the_target_is_the_schedulers_or_unknown(target, prediction_type, weighted,
                                                            set_late) -> None:
    found, diagnosis, _ = diffusers_loop(target, prediction_type, weighted=weighted,
                                         set_late=set_late)
    assert found == [] and "prediction_type_mismatch" not in diagnosis


def test_the_check_changes_no_weight() -> None:
    _, _, checked = diffusers_loop("v")
    _, _, plain = diffusers_loop("v", given=False)
    assert all(torch.equal(checked[k], plain[k]) for k in plain)
