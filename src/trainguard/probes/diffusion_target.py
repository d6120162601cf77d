"""What a diffusion loss is scored against, read off the first steps of the run.

A diffusers loop draws noise, calls `noise_scheduler.add_noise(clean, noise, timesteps)`, runs
the denoiser on the result and scores its prediction against a target: the noise itself under
the scheduler's `prediction_type="epsilon"`, the velocity `sqrt(a) * noise - sqrt(1 - a) * clean`
under `"v_prediction"`, the clean sample under `"sample"` (`a`: the scheduler's cumulative alpha at
the timestep). The target is computed in the user's code, so it can disagree with the scheduler
that samples from the model afterwards: the loss falls smoothly, toward the wrong thing.

Given the scheduler (`Guard(noise_scheduler=...)`), for the first `CHECK_STEPS` steps the probe
keeps what the loop's `add_noise` call was given and what the denoiser (the outermost module whose
forward takes a timestep, `diagnose/model_parts.py`) predicted from its result, and computes on
the device the prediction's mean squared error against each of the three targets. The three values
ride the step's one transfer; `diagnose/diffusion_target.py` compares them with the loss. Then it
takes its hooks off: later steps pay nothing. Nothing it does changes the step: it reads tensors the
loop made, draws no random numbers, and `add_noise` returns what the scheduler's own does.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.hooks import RemovableHandle

from trainguard.diagnose.model_parts import denoisers

log = logging.getLogger("trainguard")

TARGETS = ("epsilon", "v_prediction", "sample")
"""The scheduler's `prediction_type` values, in the order of the probe's values."""
CHECK_STEPS = 3
"""Steps the probe looks at: the first with a plain MSE loss settles it."""


class Noised(NamedTuple):
    clean: torch.Tensor
    noise: torch.Tensor
    timesteps: torch.Tensor
    noisy: torch.Tensor


def readable(scheduler: Any) -> bool:
    """A DDPM-style scheduler (DDPM, DDIM, PNDM, Euler...): `add_noise`, the cumulative alphas
    and a `prediction_type` of the three. Flow-matching schedulers have none of these."""
    config = getattr(scheduler, "config", None)
    return (callable(getattr(scheduler, "add_noise", None))
            and isinstance(getattr(scheduler, "alphas_cumprod", None), torch.Tensor)
            and getattr(config, "prediction_type", None) in TARGETS)


class DiffusionTargetProbe:
    def __init__(self, scheduler: Any, model: nn.Module) -> None:
        self.scheduler = scheduler
        self.steps_left = CHECK_STEPS
        self._handles: list[RemovableHandle] = []
        self._noised: Noised | None = None
        self._predicted: torch.Tensor | None = None
        names = denoisers(model)
        modules = dict(model.named_modules())
        for name in names:
            self._handles.append(modules[name].register_forward_hook(
                self._on_forward, with_kwargs=True))
        self._wrapped = self._wrap_add_noise() if names else False
        if not names:
            log.info("trainguard: no module of the model takes a timestep: the loss's "
                     "diffusion target is not checked")

    @property
    def attached(self) -> bool:
        return bool(self._handles)

    @property
    def prediction_type(self) -> str:
        """The scheduler's, read when asked: a loop may set it after building the scheduler
        (`noise_scheduler.register_to_config(prediction_type=...)`)."""
        return str(self.scheduler.config.prediction_type)

    def _wrap_add_noise(self) -> bool:
        original = self.scheduler.add_noise
        probe = self

        def add_noise(original_samples: torch.Tensor, noise: torch.Tensor,
                      timesteps: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
            noisy = original(original_samples, noise, timesteps, *args, **kwargs)
            probe._noised = Noised(original_samples.detach(), noise.detach(),
                                   torch.as_tensor(timesteps), noisy)
            return noisy

        try:
            self.scheduler.add_noise = add_noise
        except (AttributeError, TypeError):  # a scheduler that takes no attribute
            return False
        return True

    def _on_forward(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                    output: Any) -> None:
        noised = self._noised
        if noised is None:
            return
        sample = args[0] if args else kwargs.get("sample", kwargs.get("hidden_states"))
        if sample is not noised.noisy:  # another forward (a reference model, a sampler)
            return
        predicted = getattr(output, "sample", None)
        if predicted is None:
            predicted = output[0] if isinstance(output, (tuple, list)) and output else output
        if isinstance(predicted, torch.Tensor) and predicted.shape == noised.noisy.shape:
            self._predicted = predicted.detach()

    def take(self) -> torch.Tensor | None:
        """The last prediction's MSE against each target (`TARGETS` order, float32, on the
        device), once per step; None when the step ran no such forward. Counts the step."""
        if not self.attached:
            return None
        noised, predicted = self._noised, self._predicted
        self._noised = self._predicted = None
        self.steps_left -= 1
        if self.steps_left <= 0:
            self.detach()
        if noised is None or predicted is None:
            return None
        try:
            with torch.no_grad():
                return self._errors(noised, predicted)
        except Exception as exc:  # a check of the loop's code never stops its training
            log.error("trainguard: the diffusion target check failed (%s: %s); it is off",
                      type(exc).__name__, exc)
            self.detach()
            return None

    def _errors(self, noised: Noised, predicted: torch.Tensor) -> torch.Tensor:
        clean, noise = noised.clean.float(), noised.noise.float()
        alphas = self.scheduler.alphas_cumprod.to(device=clean.device, dtype=torch.float32)
        alpha = alphas[noised.timesteps.to(clean.device).long()]
        alpha = alpha.reshape(alpha.shape + (1,) * (clean.dim() - alpha.dim()))
        velocity = alpha.sqrt() * noise - (1 - alpha).sqrt() * clean
        prediction = predicted.float()
        return torch.stack([F.mse_loss(prediction, target)
                            for target in (noise, velocity, clean)])

    def detach(self) -> None:
        """Off for good: the hooks removed, the scheduler's own `add_noise` back."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._noised = self._predicted = None
        if self._wrapped:
            self.scheduler.__dict__.pop("add_noise", None)
            self._wrapped = False
