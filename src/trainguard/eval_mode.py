"""A model trained in eval mode: `model.eval()` never undone, or never switched off.

`model.eval()` turns dropout off and makes batch norm normalise with its running statistics,
which it then stops updating. A plain loop that evaluates inside the training loop and does
not call `model.train()` afterwards trains every later step that way: nothing fails, the run
goes on without its dropout and with its batch norm held at the statistics of the steps before.
`from_pretrained` also returns a model in eval mode, which a loop that never calls
`model.train()` trains so from its first step (a LoRA wrapper around it, whose own modules start
in train mode, included).

Only modules whose forward is known to read the mode are counted: torch's dropout layers with
p > 0 and its batch and instance norms that track running statistics, with torch's own forward
(a frozen batch norm that overrides it is left out). Each module's own mode is read, not the
root's (a wrapper's root may be in train mode around a model in eval mode). Off are:
- a dropout in eval mode whose parent module holds parameters that train (a frozen backbone's
  dropout, set to eval with it, is the loop's choice);
- a batch or instance norm in eval mode while every counted module is (a norm frozen beside
  others in train mode is the usual way to keep its statistics while fine-tuning).

Told once per run, when a step finds modules off and the next step's forward runs one of them
in eval mode (a forward pre-hook on it, forwards that record a graph only: an evaluation under
`no_grad` records none), none in train mode (an evaluation between the backward and
`Guard.step`, in a loop that calls `model.train()` at its top, is no fault):
- after steps in train mode: a warning (an evaluation left it there; nobody switches a run's
  mode halfway on purpose);
- from the first step: a warning when a batch norm is among them (statistics that never follow
  the data), an info when only dropout is off (some fine-tunes train without it).
The Guard's own replays (a proof's) are not heard.

Cheap: each counted module's flag read once a step (2.3 us for a 12-layer GPT-2's 37 dropout
layers on one CPU thread, in proportion to the model); a forward pre-hook on one module for the
first step and while modules are off. Only the plain-loop Guard: the HF Trainer and Lightning
put the model in train mode at each step themselves.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from trainguard.events import Event, Severity

_NORMS = (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm)
_TORCH_FORWARDS = ("torch.nn.modules.dropout", "torch.nn.modules.batchnorm",
                   "torch.nn.modules.instancenorm")
"""Where the forwards that read the mode are defined: a subclass with its own is not judged."""


def mode_dependent(model: nn.Module) -> tuple[list[str], list[str]]:
    """The names of the modules whose forward reads the mode: (dropout layers with p > 0,
    batch and instance norms that track running statistics)."""
    dropouts, norms = [], []
    for name, module in model.named_modules():
        if getattr(type(module).forward, "__module__", None) not in _TORCH_FORWARDS:
            continue
        if isinstance(module, nn.modules.dropout._DropoutNd) and module.p > 0:
            dropouts.append(name)
        elif isinstance(module, _NORMS) and module.track_running_stats:
            norms.append(name)
    return dropouts, norms


class EvalModeSteps:
    """Tells, once per run, the first step the model trains in eval mode."""

    def __init__(self, model: nn.Module) -> None:
        dropouts, norms = mode_dependent(model)
        modules = dict(model.named_modules())
        self.dropouts = [(name, modules[name], modules[name.rpartition(".")[0]])
                         for name in dropouts]
        """(name, module, parent module) of each counted dropout."""
        self.norms = [(name, modules[name]) for name in norms]
        self.told = not (dropouts or norms)
        self.trained_in_train_mode = False
        """A step (or a forward heard) so far found the counted modules in train mode."""
        self.off_since: int | None = None
        """The step that first found modules off, until they are on again."""
        self.forwards = [False, False]
        """Since the last check, a forward of the watched module that records a graph ran in
        train mode, in eval mode."""
        self.listening = True
        """Off from a check to the end of its step (the Guard's own replays) and in a proof."""
        self._watched: nn.Module | None = None
        self._handle: RemovableHandle | None = None
        if not self.told:  # the first step's forward: was it in train mode?
            self._watch(self._counted()[0][1])

    def check(self, step: int) -> Event | None:
        """Before step `step`: the event, the first time modules off (see the module's
        docstring) ran so in a step's forward."""
        if self.told:
            return None
        self.listening = False
        trained, evaluated = self.forwards
        self.forwards = [False, False]
        if trained:
            self.trained_in_train_mode = True
        dropouts, norms = self._off()
        if not (dropouts or norms):
            self.trained_in_train_mode = True
            self.off_since = None
            self._watch(None)
            return None
        watched = self._watched
        first = self.off_since is None
        if first:
            self.off_since = step
        names = dict(self._counted())
        off_modules = [names[n] for n in (*dropouts, *norms)]
        if first or trained or not evaluated or not any(m is watched for m in off_modules):
            self._watch(off_modules[0])  # the next forward says whether it trains so
            return None
        self.told = True
        self._watch(None)
        return self._event(step, dropouts, norms)

    def _counted(self) -> list[tuple[str, nn.Module]]:
        return [(name, module) for name, module, _ in self.dropouts] + self.norms

    def _off(self) -> tuple[list[str], list[str]]:
        """The counted modules off now: dropouts in eval mode around parameters that train,
        norms in eval mode while every counted module is."""
        dropouts = [(name, parent) for name, module, parent in self.dropouts
                    if not module.training]
        if not dropouts and all(module.training for _, module in self.norms):
            return [], []  # the usual step: every flag read once
        dropouts_off = [name for name, parent in dropouts
                        if any(p.requires_grad for p in parent.parameters())]
        every = all(not module.training for _, module in self._counted())
        norms_off = [name for name, module in self.norms if every and not module.training]
        return dropouts_off, norms_off

    def _event(self, step: int, dropouts: list[str], norms: list[str]) -> Event:
        off = _what_is_off(dropouts, norms)
        since = self.off_since
        severity: Severity
        if self.trained_in_train_mode:
            severity = "warning"
            said = (f"the model trains in eval mode: found so at step {since}, and step "
                    f"{step}'s forward ran so, after it trained in train mode: a model.eval() "
                    f"(as for an evaluation) was not followed by model.train(), so {off}")
        else:
            severity = "warning" if norms else "info"
            said = ("the model trains in eval mode from the first step this Guard checked "
                    f"(found so at step {since}, and step {step}'s forward ran so; "
                    f"from_pretrained returns a model in eval mode), so {off}")
        return Event(
            kind="model_in_eval_mode", step=step, severity=severity,
            message=(f"{said}. Fix: call model.train() before the training steps (after each "
                     "evaluation, or at the start of each epoch)"),
            param=(norms or dropouts)[0],
            details={"cause": "model_in_eval_mode", "dropout_layers": len(dropouts),
                     "norm_layers": len(norms), "since": since,
                     "trained_in_train_mode": self.trained_in_train_mode})

    def _before_forward(self, module: nn.Module, args: Any) -> None:
        if self.listening and torch.is_grad_enabled():
            self.forwards[0 if module.training else 1] = True

    def _watch(self, module: nn.Module | None) -> None:
        """Hear the forwards of `module` (None: of none)."""
        if module is self._watched:
            return
        if self._handle is not None:
            self._handle.remove()
            self._handle = None
        self._watched = module
        if module is not None:
            self._handle = module.register_forward_pre_hook(self._before_forward)

    def step_ended(self) -> None:
        """`Guard.step` returned (or a proof between steps ended): the loop's forwards count."""
        self.listening = True

    def pause(self) -> None:
        """The Guard's own forwards (a proof's replays) until `step_ended`."""
        self.listening = False

    def close(self) -> None:
        self._watch(None)


def _what_is_off(dropouts: list[str], norms: list[str]) -> str:
    parts = []
    if dropouts:
        parts.append(f"its dropout ({_layers(len(dropouts))}) is off")
    if norms:
        parts.append(f"its batch norm ({_layers(len(norms))}) normalises with running "
                     "statistics it no longer updates")
    return " and ".join(parts)


def _layers(n: int) -> str:
    return "1 layer" if n == 1 else f"{n} layers"
