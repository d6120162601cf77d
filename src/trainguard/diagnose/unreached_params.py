"""Trainable parameters the optimizer holds that the loss never reaches: a stray `.detach()`.

A `.detach()` (or a `torch.no_grad()` block, a round trip through NumPy or `.item()`) in the
forward cuts the graph: every parameter before the cut gets no gradient at all (`grad` stays
None), the optimizer skips it, and the layers after the cut learn around it, so the loss still
falls and nothing else says so. A 20-64-64-5 MLP whose second layer reads
`self.a(x).detach()` ends "healthy" with its first layer, 23% of its weights, as initialised.

Checked at steps 0 and 1 and the first sampled step after them (`probes.sample_every`, 50 by
default; one Python pass over the watched parameters each, no device work): the parameters with
`requires_grad` whose gradient was None at every one of them while others had one. Told once,
as a finding (what the set-up does, not that a step went wrong): a warning, cause
`no_gradients`, when they hold `SHARE` of the watched weights or more; an info otherwise (a
pooler a model computes and the loss does not use: small parts a set-up may leave idle by
design). A branch used on every other batch gets a gradient at step 0 or 1;
one used more rarely than the steps checked can be named (an expert no token was routed to).
"""

from __future__ import annotations

from trainguard.finding import Finding
from trainguard.params import WatchedParams

CHECK = "unreached_params"
CHECKED = 3
"""The steps judged: 0, 1 (consecutive: a branch used on alternate batches shows) and the
first sampled step after them."""
SHARE = 0.05
"""Unreached parameters holding this share of the watched weights or more are a part of the
model that does not train (a layer), not a small piece a set-up leaves idle."""
NAMED = 5


class UnreachedParams:
    """The check's memory: which parameters had a gradient at no step checked so far."""

    def __init__(self) -> None:
        self.never: set[int] | None = None
        """Indices into the watched parameters, trainable, with no gradient at every check."""
        self.steps: list[int] = []
        """The steps checked."""
        self.done = False

    def check(self, watched: WatchedParams, step: int) -> list[Finding]:
        if self.done:
            return []
        params = watched.params
        missing = {i for i, p in enumerate(params) if p.requires_grad and p.grad is None}
        if len(missing) == len(params):  # no gradient at all: `no_gradients`' to tell
            return []
        self.never = missing if self.never is None else self.never & missing
        self.steps.append(step)
        if len(self.steps) < CHECKED and self.never:
            return []
        self.done = True
        if not self.never:
            return []
        return [self._finding(watched, sorted(self.never))]

    def _finding(self, watched: WatchedParams, never: list[int]) -> Finding:
        sizes = [p.numel() for p in watched.params]
        share = sum(sizes[i] for i in never) / max(1, sum(sizes))
        names = [watched.names[i] for i in never]
        shown = ", ".join(names[:NAMED]) + (f" and {len(names) - NAMED} more"
                                            if len(names) > NAMED else "")
        warning = share >= SHARE
        return Finding(
            CHECK, "warning" if warning else "info",
            f"{len(names)} trainable parameter(s) the optimizer holds, {share:.1%} of its "
            f"weights, got no gradient at steps {_steps(self.steps)}: the loss does not reach "
            f"them, so they do not train: {shown}.",
            "look for a .detach(), a torch.no_grad() block, .item() or a NumPy round trip "
            "between them and the loss in the forward; if they are meant to stay as they are, "
            "requires_grad_(False) says so.",
            cause="no_gradients" if warning else None,
            evidence={"params": names, "share": share, "steps": list(self.steps)})


def _steps(steps: list[int]) -> str:
    return ", ".join(map(str, steps[:-1])) + f" and {steps[-1]}" if len(steps) > 1 else str(
        steps[0])
