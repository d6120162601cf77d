"""Trainable parameters that get gradients no optimizer applies: a layer unfrozen after the
optimizer was built.

A Trainer (Hugging Face, Lightning) builds its optimizer from the parameters trainable when
training starts, and a plain loop often does the same (`[p for p in model.parameters() if
p.requires_grad]`). A layer unfrozen later with `requires_grad_(True)` is then computed a gradient
at every step that nothing applies: it never trains, and nothing in the loss says so. Checked on
the sampled steps (one pass over the parameters in Python, no device work): a parameter made
trainable after the first check is a warning finding; the set-up's own (a teacher or a
discriminator inside the model, trainable but deliberately left out of the optimizer) an info,
once. A finding, not an event: it says what the set-up does, not that the training went wrong,
so it is no trouble for the verdict or the recover policy.
"""

from __future__ import annotations

from torch import nn

from trainguard.finding import Finding
from trainguard.params import WatchedParams, unheld_trainable

CHECK = "unheld_params"


class UnheldParams:
    """The check's memory: what the set-up left out at the first check, what was said."""

    def __init__(self) -> None:
        self.setup: set[str] | None = None
        """The trainable parameters no optimizer held at the first check."""
        self.said: set[str] = set()

    def check(self, model: nn.Module, watched: WatchedParams, step: int) -> list[Finding]:
        unheld = unheld_trainable(model, watched)
        first = self.setup is None
        if self.setup is None:
            self.setup = set(unheld)
        fresh = [name for name, has_grad in unheld.items()
                 if has_grad and name not in self.said]
        self.said.update(fresh)
        late = [name for name in fresh if name not in self.setup]
        known = [name for name in fresh if name in self.setup]
        findings = []
        if late:
            findings.append(Finding(
                CHECK, "warning",
                f"{len(late)} parameter(s) made trainable after the optimizer was built get "
                f"gradients that no optimizer holds (seen at step {step}): they do not train: "
                f"{_names(late)}.",
                "add them to the optimizer (`optimizer.add_param_group`), or unfreeze them "
                "before the optimizer (or the Trainer's) is created.",
                evidence={"params": late, "step": step}))
        if known:
            findings.append(Finding(
                CHECK, "info",
                f"{len(known)} trainable parameter(s) {'get' if first else 'got'} gradients "
                f"that no optimizer holds, as set up (a teacher or a discriminator inside the "
                f"model?): they do not train: {_names(known)}.",
                "if they are not meant to train, `requires_grad_(False)` spares computing "
                "their gradients.",
                evidence={"params": known, "step": step}))
        return findings


def _names(names: list[str], shown: int = 5) -> str:
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")
