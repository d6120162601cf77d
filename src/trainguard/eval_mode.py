"""A model trained in eval mode: `model.eval()` never undone, or never switched off.

`model.eval()` turns dropout off and makes batch norm normalise with its running statistics,
which it then stops updating. A plain loop that evaluates inside the training loop and does
not call `model.train()` afterwards trains every later step that way: nothing fails, the run
goes on without its dropout and with its batch norm held at the statistics of the steps before.
`from_pretrained` also returns a model in eval mode, which a loop that never calls
`model.train()` trains so from its first step.

Only modules whose forward is known to read the mode are counted: torch's dropout layers with
p > 0 and its batch and instance norms that track running statistics, with torch's own forward
(a frozen batch norm that overrides it is left out). A model without any trains the same in
either mode, and nothing is said.

Told once per run, when `Guard.step` finds the model (its root module) in eval mode and the
next step's forward runs in eval mode too (an evaluation between the backward and
`Guard.step`, in a loop that calls `model.train()` at its top, is no fault):
- after steps in train mode: a warning (an evaluation left it there; nobody switches a run's
  mode halfway on purpose);
- from the first step: a warning when a batch norm is among the modules (statistics that never
  follow the data), an info when only dropout is off (some fine-tunes train without it).

Cheap: one attribute read a step; the modules are listed once; a forward pre-hook on the root
module only while the model is found in eval mode. Only the plain-loop Guard: the
HF Trainer and Lightning put the model in train mode at each step themselves.
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
        self.model = model
        self.dropouts, self.norms = mode_dependent(model)
        self.trained_in_train_mode = False
        """A step so far found the model in train mode."""
        self.told = not (self.dropouts or self.norms)
        self.suspected = False
        """The step before found the model in eval mode: the next forward is watched."""
        self.forwards = [False, False]
        """Since the step before, a forward of the root module that records a graph ran in
        train mode, in eval mode (an evaluation under `no_grad` records none)."""
        self._handle: RemovableHandle | None = None

    def check(self, step: int) -> Event | None:
        """Before step `step`: the event, the first time the model trained in eval mode. The
        mode at `Guard.step` may be an evaluation's between the backward and the step, with
        `model.train()` at the top of the loop: it is told only when the next step's forward
        ran in eval mode too, and none in train mode (a pre-hook on the root module, in place
        while the mode at the step was eval; without one, a second step in a row found in eval
        mode)."""
        if self.told:
            return None
        if self.model.training:
            self.trained_in_train_mode = True
            self.suspected = False
            self._unhook()
            return None
        trained, evaluated = self.forwards
        self.forwards = [False, False]
        if not self.suspected or trained or not (evaluated or self._handle is None):
            self.suspected = True
            self._hook()
            return None
        self.told = True
        self._unhook()
        modules = dict(self.model.named_modules())
        dropouts = [n for n in self.dropouts if n in modules and not modules[n].training]
        norms = [n for n in self.norms if n in modules and not modules[n].training]
        if not (dropouts or norms):  # the loop put them back in train mode one by one
            return None
        off = _what_is_off(dropouts, norms)
        severity: Severity
        if self.trained_in_train_mode:
            severity = "warning"
            said = (f"the model trains in eval mode at step {step} (it trained in train mode "
                    "before): a model.eval() (as for an evaluation) was not followed by "
                    f"model.train(), so {off}")
        else:
            severity = "warning" if norms else "info"
            said = (f"the model trains in eval mode at step {step}, as it was at the first step "
                    f"this Guard checked (from_pretrained returns a model in eval mode), so {off}")
        return Event(
            kind="model_in_eval_mode", step=step, severity=severity,
            message=(f"{said}. Fix: call model.train() before the training steps (after each "
                     "evaluation, or at the start of each epoch)"),
            param=(norms or dropouts)[0],
            details={"cause": "model_in_eval_mode", "dropout_layers": len(dropouts),
                     "norm_layers": len(norms),
                     "trained_in_train_mode": self.trained_in_train_mode})

    def _before_forward(self, module: nn.Module, args: Any) -> None:
        if torch.is_grad_enabled():
            self.forwards[0 if module.training else 1] = True

    def _hook(self) -> None:
        if self._handle is None:
            try:
                self._handle = self.model.register_forward_pre_hook(self._before_forward)
            except RuntimeError:  # a module that takes no hooks: the step's mode alone
                self._handle = None

    def _unhook(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def close(self) -> None:
        self._unhook()


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
