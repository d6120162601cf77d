"""An LR fault whose cause has gone is rolled back without a lasting LR cut; one that stays is
still backed off.

A small GPT-2 trained from its random initialisation with AdamW, its loop writing a warmup +
cosine LR into the optimizer every step (as nanoGPT does), multiplies that LR by 100 at step 60:
for 6 steps and then writes its usual LR again (transient), or for good (persistent). Under
`recover` the trouble right after the raise rolls the run back at once to a state from before
it; the transient run then trains on at its own LR and ends as the healthy run does, while the
persistent one is held far below the LR that failed.
"""

from __future__ import annotations

import functools
import math
import tempfile
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

import trainguard
from trainguard import Guard, GuardConfig
from trainguard.demo import MarkovLanguage

LR = 3e-3
WARMUP = 20
STEPS = 200
RAISE_AT = 60
RAISED_STEPS = 6
RAISE = 100.0
VOCAB = 64


pytestmark = pytest.mark.usefixtures("quiet_log")


def loop_lr(step: int, raised_steps: int | None) -> float:
    """The LR the loop writes at `step`: warmup + cosine, times RAISE from RAISE_AT for
    `raised_steps` steps (0: never; None: for good)."""
    lr = LR * min(1.0, (step + 1) / WARMUP) * 0.5 * (1 + math.cos(math.pi * step / STEPS))
    end = math.inf if raised_steps is None else RAISE_AT + raised_steps
    return lr * RAISE if RAISE_AT <= step < end else lr


def next_token_loss(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=tokens[:, :-1]).logits
    return F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


@dataclass
class Result:
    eval_loss: float
    events: list[trainguard.Event]
    lrs: list[float | None]
    """The LR each step's update used, as reported (None without a Guard)."""
    fixed_clip: float | None = None
    """The fixed clipping limit in force at the end (None: none, the adaptive default's)."""

    @property
    def rollbacks(self) -> list[trainguard.Event]:
        return [e for e in self.events if e.kind == "rollback"]


@functools.cache
def train(policy: str | None, raised_steps: int | None, steps: int = STEPS) -> Result:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=64, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None, eos_token_id=None))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    guard = None
    if policy is not None:
        guard = Guard(model, optimizer, config=GuardConfig(
            policy=policy, sinks={"console": False},
            checkpoints={"snapshot_dir": tempfile.mkdtemp()}))  # type: ignore[arg-type]
    language = MarkovLanguage(vocab_size=VOCAB, seed=0)
    held_out = [language.batch(16, 33) for _ in range(4)]
    lrs: list[float | None] = []
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = loop_lr(step, raised_steps)
        tokens = language.batch(16, 33)
        loss = next_token_loss(model, tokens)
        loss.backward()
        if guard is not None:
            lrs.append(guard.step(loss, batch=tokens).lr)
        else:
            optimizer.step()
            lrs.append(None)
        optimizer.zero_grad(set_to_none=True)
    events = []
    fixed_clip = None
    if guard is not None:
        fixed_clip = guard.run.state.clip.fixed_limit
        guard.close()
        events = list(guard.events)
    model.eval()
    with torch.no_grad():
        eval_loss = sum(float(next_token_loss(model, b)) for b in held_out) / len(held_out)
    return Result(eval_loss, events, lrs, fixed_clip)


def test_an_lr_raise_the_loop_took_back_costs_a_rollback_and_no_lasting_cut() -> None:
    healthy = train(None, 0)
    assert train(None, RAISED_STEPS).eval_loss > 2 * healthy.eval_loss  # a fault unprotected
    result = train("recover", RAISED_STEPS)
    (rollback,) = result.rollbacks
    # at once after the raise (not after the loss failed to settle), to a state from before it
    assert RAISE_AT < rollback.step <= RAISE_AT + 5
    assert rollback.details["to_step"] <= RAISE_AT
    # once the loop wrote its own LR again, the updates used it: no backoff held it down
    back = RAISE_AT + RAISED_STEPS
    assert result.lrs[back:] == pytest.approx([loop_lr(s, RAISED_STEPS)
                                               for s in range(back, STEPS)])
    assert result.eval_loss <= 1.05 * healthy.eval_loss
    # nor a tighter clip: the LR was the cause, and it has gone
    assert result.fixed_clip is None
    assert "clipping at" not in rollback.message


def test_an_lr_raise_the_loop_left_in_place_is_still_backed_off() -> None:
    result = train("recover", None, steps=RAISE_AT + 30)
    first = result.rollbacks[0]
    assert RAISE_AT < first.step <= RAISE_AT + 5
    assert first.details["lr_factor"] <= 0.1
    raised = loop_lr(first.step, None)
    ceiling = first.details["lr_ceiling"]
    assert ceiling < raised
    # every update after the rollback stayed under the ceiling, a tenth of the LR that failed
    # or less at first, though the loop kept writing the raised LR
    after = [lr for lr in result.lrs[first.step + 1:] if lr is not None]
    assert after and max(after) <= ceiling * (1 + 1e-9)
    assert after[0] <= 0.1 * raised
