"""Progressive unfreezing: train the top of the model first, then unfreeze lower groups in turn.

The guide's recipe for full fine-tuning of large models: for the first 10% of steps only the top
layers train, then lower layers are unfrozen step by step. Freshly initialised top layers produce
large, noisy gradients at first; keeping the pre-trained lower layers frozen until the top has
settled keeps that noise from being pushed into them.

Groups are ordered bottom (embeddings) to top (head). The top group trains from step 0; the next
group down is unfrozen at `top_fraction * total_steps`, the bottom group at
`all_trainable_fraction * total_steps`, and the groups between are evenly spaced. Freezing sets
`requires_grad = False` and `.grad = None`: optimizers skip a parameter whose grad is None
entirely (no Adam moment update, no weight decay), so a frozen parameter stays exactly as it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from trainguard.errors import ConfigError, UsageError

GroupSpec = str | nn.Module | Sequence[str | nn.Module]
"""One group: a module-name prefix, a module, or a list of them (e.g. the final norm and the head).
A prefix matches a parameter name equal to it or starting with it followed by a dot, so
"transformer.h.1" does not match "transformer.h.10"."""


def _label(spec: GroupSpec) -> str:
    items = [spec] if isinstance(spec, (str, nn.Module)) else list(spec)
    names = [item if isinstance(item, str) else type(item).__name__ for item in items]
    return ", ".join(names[:3]) + (f" (+{len(names) - 3})" if len(names) > 3 else "")


def _matching(model: nn.Module, spec: GroupSpec, index: int) -> list[nn.Parameter]:
    """Parameters of one group spec, by identity (tied weights appear once)."""
    items = [spec] if isinstance(spec, (str, nn.Module)) else spec
    if isinstance(items, (bytes, dict)) or not isinstance(items, Sequence) or not items:
        raise ConfigError(f"groups[{index}]: must be a module-name prefix, a module or a "
                          f"non-empty list of them, got {spec!r}")
    model_params = {id(p) for p in model.parameters()}
    found: dict[int, nn.Parameter] = {}
    for item in items:
        if isinstance(item, str):
            if not item:
                raise ConfigError(f"groups[{index}]: an empty prefix would match every "
                                  "parameter; name the modules of this group")
            # remove_duplicate=False: a tied weight matches under each of its names.
            matched = [p for name, p in model.named_parameters(remove_duplicate=False)
                       if name == item or name.startswith(item + ".")]
            if not matched:
                raise ConfigError(f"groups[{index}]: prefix {item!r} matches no parameter of "
                                  f"the model")
        elif isinstance(item, nn.Module):
            matched = list(item.parameters())
            if not matched or any(id(p) not in model_params for p in matched):
                raise ConfigError(f"groups[{index}]: {type(item).__name__} is not a module of "
                                  "this model with parameters")
        else:
            raise ConfigError(f"groups[{index}]: must be a module-name prefix or a module, got "
                              f"{type(item).__name__}")
        for param in matched:
            found.setdefault(id(param), param)
    return list(found.values())


def unfreeze_schedule(n_groups: int, *, total_steps: int, top_fraction: float = 0.1,
                      all_trainable_fraction: float = 0.5) -> list[int]:
    """The step at which each group (bottom to top) starts training; the top group's is 0."""
    if isinstance(n_groups, bool) or not isinstance(n_groups, int) or n_groups < 1:
        raise ConfigError(f"groups: need at least one group, got {n_groups!r}")
    if isinstance(total_steps, bool) or not isinstance(total_steps, int) or total_steps < 1:
        raise ConfigError(f"total_steps: must be an integer >= 1, got {total_steps!r}")
    for name, value in (("top_fraction", top_fraction),
                        ("all_trainable_fraction", all_trainable_fraction)):
        # Written so that NaN fails the check.
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise ConfigError(f"{name}: must be a number in [0, 1], got {value!r}")
    if not top_fraction <= all_trainable_fraction:
        raise ConfigError(f"all_trainable_fraction: {all_trainable_fraction} is below "
                          f"top_fraction {top_fraction}; lower groups cannot finish unfreezing "
                          "before they start")
    lower = n_groups - 1
    starts = [0] * n_groups
    for k in range(1, lower + 1):  # k-th group below the top: index n_groups - 1 - k
        fraction = top_fraction if lower == 1 else (
            top_fraction + (k - 1) * (all_trainable_fraction - top_fraction) / (lower - 1))
        starts[n_groups - 1 - k] = round(fraction * total_steps)
    return starts


class ProgressiveUnfreezer:
    """Sets `requires_grad` group by group as training advances; see the module docstring.

    Only parameters that are trainable when the unfreezer is built are managed: parameters already
    frozen (a LoRA model's base weights, a frozen VAE) are never unfrozen. A parameter reachable
    from several groups (GPT-2's output head is its token embedding) belongs to the highest of
    them, so it trains from the step that group does.

    Build the optimizer from all managed parameters, frozen or not (AdamW skips the frozen ones
    until they get gradients); pass it as `optimizer` to have that checked. With `strict` (the
    default) every trainable parameter must belong to a group.

    Call `step()` once per optimizer step (like an LR scheduler), or `step(n)` with the global
    step; the state for step 0 is applied when the unfreezer is built.

    Under DistributedDataParallel, wrap the model before building the unfreezer (with
    find_unused_parameters=True): DDP only all-reduces parameters that required grad when it was
    built, so a group frozen then would later train unsynchronised on each rank.
    """

    def __init__(self, model: nn.Module, groups: Sequence[GroupSpec], *, total_steps: int,
                 top_fraction: float = 0.1, all_trainable_fraction: float = 0.5,
                 optimizer: torch.optim.Optimizer | None = None, strict: bool = True) -> None:
        if not isinstance(model, nn.Module):
            raise UsageError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if isinstance(groups, (str, nn.Module)) or not isinstance(groups, Sequence):
            raise ConfigError("groups: must be a list of groups ordered bottom (embeddings) to "
                              f"top (head), got {type(groups).__name__}")
        self.starts = unfreeze_schedule(len(groups), total_steps=total_steps,
                                        top_fraction=top_fraction,
                                        all_trainable_fraction=all_trainable_fraction)
        self.labels = [_label(spec) for spec in groups]
        matched = [_matching(model, spec, i) for i, spec in enumerate(groups)]
        owner: dict[int, int] = {}
        for index, params in enumerate(matched):
            for param in params:
                owner[id(param)] = index  # later (higher) groups win
        self.params: list[list[nn.Parameter]] = [
            [p for p in params if owner[id(p)] == index and p.requires_grad]
            for index, params in enumerate(matched)]
        for index, params in enumerate(self.params):
            if not params:
                raise ConfigError(f"groups[{index}] ({self.labels[index]}): has no trainable "
                                  "parameter of its own (all frozen already, or all held by a "
                                  "higher group)")
        if strict:
            loose = [n for n, p in model.named_parameters() if p.requires_grad
                     and id(p) not in owner]
            if loose:
                raise ConfigError(f"groups: {len(loose)} trainable parameter(s) belong to no "
                                  f"group (e.g. {', '.join(loose[:3])}); add them to a group or "
                                  "pass strict=False to leave them training throughout")
        if optimizer is not None:
            self._check_optimizer(model, optimizer)
        self.total_steps = total_steps
        self.current_step = 0
        self.trainable = [True] * len(self.params)  # managed parameters start out trainable
        self._apply(0)

    def _check_optimizer(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise UsageError(f"optimizer must be a torch.optim.Optimizer, got "
                             f"{type(optimizer).__name__}")
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        names = {id(p): n for n, p in model.named_parameters()}
        missing = [names.get(id(p), "?") for params in self.params for p in params
                   if id(p) not in held]
        if missing:
            raise UsageError(f"the optimizer does not hold {len(missing)} parameter(s) that will "
                             f"be unfrozen (e.g. {', '.join(missing[:3])}): they would never "
                             "train. Build the optimizer from all of them, frozen or not, e.g. "
                             "AdamW(model.parameters())")

    def _apply(self, step: int) -> list[int]:
        changed = []
        for index, params in enumerate(self.params):
            train = step >= self.starts[index]
            if train == self.trainable[index]:
                continue
            for param in params:
                param.requires_grad_(train)
                if not train:
                    param.grad = None  # a stale gradient would still be applied
            changed.append(index)
            self.trainable[index] = train
        return changed

    def step(self, step: int | None = None) -> list[int]:
        """Apply the state for `step` (default: the next step); return the groups that changed.

        Returned indices are positions in `groups` (bottom = 0); `labels[i]` names group i.
        Stepping backwards (e.g. to a restored step) re-freezes groups as needed.
        """
        if step is None:
            step = self.current_step + 1
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise UsageError(f"step must be an integer >= 0, got {step!r}")
        self.current_step = step
        return self._apply(step)

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.current_step, "starts": list(self.starts)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a saved step (and its schedule) and apply it to the parameters."""
        if not isinstance(state, dict) or not isinstance(state.get("starts"), list) or \
                not isinstance(state.get("step"), int):
            raise UsageError("not an unfreezer state: expected the dict returned by "
                             "ProgressiveUnfreezer.state_dict()")
        starts = state["starts"]
        if len(starts) != len(self.params):
            raise UsageError(f"the saved unfreezer state has {len(starts)} group(s), this "
                             f"unfreezer has {len(self.params)}: it was saved for other groups")
        self.starts = [int(s) for s in starts]
        self.step(state["step"])


def layer_groups(model: nn.Module, *, stack: str | None = None) -> list[list[str]]:
    """Groups for a transformer: [embeddings], one per block, [final norm + head], bottom to top.

    For GPT-2: [["transformer.wte", "transformer.wpe"], ["transformer.h.0"], ...,
    ["transformer.ln_f", "lm_head"]].

    The block stack is the `nn.ModuleList` named `stack` (e.g. "transformer.h" for GPT-2,
    "bert.encoder.layer" for BERT), found automatically as the ModuleList holding the most
    parameters. Parameters registered before the stack form the bottom group, after it the top
    group. Names include tied duplicates (GPT-2's lm_head.weight), so a tied head trains first.
    """
    if not isinstance(model, nn.Module):
        raise UsageError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    modules = dict(model.named_modules())
    if stack is None:
        lists = [(sum(p.numel() for p in m.parameters()), name) for name, m in modules.items()
                 if isinstance(m, nn.ModuleList) and len(m) > 0]
        if not lists:
            raise ConfigError("stack: the model has no nn.ModuleList of blocks; build the groups "
                              "by hand (a list of module-name prefixes, bottom to top)")
        stack = max(lists)[1]
    elif not isinstance(modules.get(stack), nn.ModuleList):
        raise ConfigError(f"stack: {stack!r} is not an nn.ModuleList of the model")
    blocks = [f"{stack}.{i}" for i, block in enumerate(modules[stack])
              if any(True for _ in block.parameters())]
    before: list[str] = []
    after: list[str] = []
    seen_stack = False
    for name, _ in model.named_parameters(remove_duplicate=False):
        if name.startswith(stack + "."):
            seen_stack = True
            continue
        # Name the owning module ("transformer.wte"), unless that module also holds the stack.
        owner = name.rpartition(".")[0]
        prefix = owner if owner and not stack.startswith(owner + ".") else name
        side = after if seen_stack else before
        if prefix not in side:
            side.append(prefix)
    groups = [[block] for block in blocks]
    return ([before] if before else []) + groups + ([after] if after else [])
