"""A weight decay added to the gradient of an optimizer that normalises it: `Adam(weight_decay=)`
where AdamW's setting was meant.

`torch.optim.Adam`'s `weight_decay` is an L2 term, `wd * w`, added to each gradient before the
moments (coupled); AdamW takes `lr * wd * w` off the weights beside the step (decoupled). Where the
term outweighs the loss's gradient, Adam divides their sum by its own running size: the update
follows the sign of each weight, and every weight steps toward 0 by up to the LR at each step
whatever the loss asks. The setting people give AdamW (0.01-0.1) does that: on the GPT-2 scenario
family's fine-tune, `Adam(weight_decay=0.1)` ends at a held-out loss of 1.59 against AdamW's 0.93
(the term was 1.2x and 1.3x the gradient of the typical weight at steps 0 and 1; at 0.01 the
loss ended at 1.02); a 20-64-5 MLP trained from scratch ends at 0.96 against AdamW's 0.37 (the
term 1.0x the gradient at steps 0 and 1; at 0.01, 0.40).

Checked on the run's first `CHECKED` steps (those the full check sees: steps 0 and 1 of a
plain loop), before the decay has shrunk the weights (at step 50 of that fine-tune the term was
down to 0.37x: the weights had lost most of their norm), for the groups of the optimizers in
`NORMALISING` with `weight_decay > 0` and no `decoupled_weight_decay`: the norms of their weights
and gradients (two fused passes, one transfer through `transfer.to_host`), the median over the
parameters of `wd * ||w|| / ||g||`. Told (a warning finding, cause `weight_decay_coupled`)
when that median is at least `SHARE` at every one of them: the term weighs as much as half the
gradient or more for most weights, for more than a step, and the update's direction is as much
the decay's as the loss's. SGD's coupled decay is plain L2 (its step is not normalised) and is
judged by the preflight's `weight_decay` check; so is AdamW's.
"""

from __future__ import annotations

import statistics

import torch

from trainguard.finding import Finding
from trainguard.probes.local import local_tensor
from trainguard.transfer import to_host

CHECK = "weight_decay_coupled"
CHECKED = 2
"""The steps judged: the run's first two, one batch's gradient is not all of it."""
SHARE = 0.5
"""The decay term at this share of the gradient's norm or more steers the normalised update."""
NORMALISING = frozenset({"Adam", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad", "Adadelta"})
"""`torch.optim` classes whose step divides the gradient (L2 term included) by its running size."""


def coupled_rows(optimizers: list[torch.optim.Optimizer]
                 ) -> list[tuple[str, int, float, torch.Tensor]]:
    """(optimizer class, group index, weight_decay, parameter) of every parameter with a
    gradient in a group whose decay is added to the gradient and normalised with it."""
    rows = []
    for optimizer in optimizers:
        name = type(optimizer).__name__
        if name not in NORMALISING or not type(optimizer).__module__.startswith("torch.optim"):
            continue
        for index, group in enumerate(optimizer.param_groups):
            decay = float(group.get("weight_decay") or 0.0)
            if decay <= 0.0 or group.get("decoupled_weight_decay"):
                continue
            rows += [(name, index, decay, p) for p in group["params"] if p.grad is not None]
    return rows


class CoupledDecay:
    """The check's memory: the medians measured so far."""

    def __init__(self) -> None:
        self.medians: list[tuple[int, float]] = []
        """(step, median of wd * ||w|| / ||g||) of each sampled step judged."""
        self.done = False

    def check(self, optimizers: list[torch.optim.Optimizer], step: int) -> list[Finding]:
        if self.done:
            return []
        rows = coupled_rows(optimizers)
        if not rows:
            self.done = True
            return []
        with torch.no_grad():
            weights = [local_tensor(p) for _, _, _, p in rows]
            grads = [local_tensor(p.grad) for _, _, _, p in rows]  # type: ignore[arg-type]
            norms = [*torch._foreach_norm(weights), *torch._foreach_norm(grads)]
            device = norms[0].device  # parameters on several devices meet on the first's
            values = to_host(torch.stack([n.to(device=device, dtype=torch.float32)
                                          for n in norms])).tolist()
        count = len(rows)
        ratios = [decay * w / g for (_, _, decay, _), w, g
                  in zip(rows, values[:count], values[count:], strict=True) if g > 0.0]
        if not ratios:  # no finite gradient to weigh against: `no_gradients`' (or a
            self.done = True  # GradScaler's skip), and no norms read again at every step
            return []
        self.medians.append((step, statistics.median(ratios)))
        if len(self.medians) < CHECKED:
            return []
        self.done = True
        if min(m for _, m in self.medians) < SHARE:
            return []
        return [self._finding(rows)]

    def _finding(self, rows: list[tuple[str, int, float, torch.Tensor]]) -> Finding:
        names = sorted({name for name, _, _, _ in rows})
        decays = sorted({decay for _, _, decay, _ in rows})
        seen = " and ".join(f"{m:.2g}x at step {s}" for s, m in self.medians)
        what = ", ".join(names)
        decay = "/".join(f"{d:g}" for d in decays)
        return Finding(
            CHECK, "warning",
            f"{what} adds weight_decay {decay} to the gradient (an L2 term, wd x w), and on "
            f"the typical parameter that term was {seen} the norm of the loss's gradient: the "
            "optimizer divides their sum by its running size, so the decay steers the update "
            "as much as the loss does, and where it outweighs the gradient the weights step "
            "toward 0 by up to the LR at every step whatever the loss asks (AdamW takes lr x "
            "weight_decay of them beside the step instead).",
            "use torch.optim.AdamW with this weight_decay (or Adam(..., "
            "decoupled_weight_decay=True)), or lower weight_decay until the term is well under "
            "the gradient.",
            cause=CHECK,
            evidence={"weight_decay": decays[-1], "optimizers": names,
                      "ratios": [m for _, m in self.medians],
                      "steps": [s for s, _ in self.medians]})
