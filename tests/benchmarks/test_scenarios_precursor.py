"""The precursor family with its seed fixed, the probe on by default: `instability_precursor`
warns at least 5 steps before the loss spikes under an LR that never stops rising, stays silent
on the healthy twins, and under `protect` the brake and the ceiling the returning warning sets
prevent the spike. Ground truth: the run under `observe` (which trains exactly as an unguarded
run) and `benchmarks.precursors.spike_step`."""

from __future__ import annotations

from functools import cache

import torch
import torch.nn.functional as F
from benchmarks.precursors import spike_step
from benchmarks.scenarios import scenario
from benchmarks.scenarios.families.tiny_lm import SANE_LR, VOCAB_SIZE, TinyLM, _sequences
from benchmarks.scenarios.runner import RunResult, run_scenario

from trainguard import Guard, GuardConfig
from trainguard.demo.data import MarkovLanguage

OBSERVE = GuardConfig(policy="observe", sinks={"console": False})


def warnings(result: RunResult) -> list[int]:
    return [e["step"] for e in result.events if e["kind"] == "instability_precursor"]


def test_the_warning_comes_at_least_5_steps_before_the_spike() -> None:
    fault = scenario("tiny_lm_lr_ramp")
    result = run_scenario(fault, "trainguard", seed=0, config=OBSERVE, steps=185)
    spike = spike_step(result.train_losses)
    assert spike is not None and fault.onset_step is not None and spike > fault.onset_step
    warned = warnings(result)
    assert warned and fault.onset_step <= warned[0] <= spike - 5
    loss_events = [e["step"] for e in result.events
                   if e["kind"] in ("loss_spike", "loss_divergence", "nonfinite_loss")]
    assert loss_events and warned[0] <= min(loss_events) - 5


def test_silent_on_the_healthy_twin_whose_lr_rises_then_holds() -> None:
    twin = scenario("tiny_lm_healthy_capped_ramp")
    result = run_scenario(twin, "trainguard", seed=0, config=OBSERVE)
    assert spike_step(result.train_losses) is None
    assert warnings(result) == [] and result.events == []


def test_silent_on_the_healthy_twin_at_the_sane_lr() -> None:
    twin = scenario("tiny_lm_healthy")
    result = run_scenario(twin, "trainguard", seed=0, config=OBSERVE)
    assert warnings(result) == [] and result.events == []


@cache
def under_protect(prove: str = "auto") -> RunResult:
    """`tiny_lm_lr_ramp` under `protect` (run once per `prove`, shared by the tests below). The
    proof budget is 3x the default: the good states a proof can start from are kept at a
    wall-clock cadence, and on a machine busy with other tests the default budget may reach
    none of them."""
    return run_scenario(scenario("tiny_lm_lr_ramp"), "trainguard", seed=0,
                        config=GuardConfig(policy="protect", prove={"mode": prove,
                                                                    "budget_steps": 60.0},
                                                                    sinks={"console": False}))


def test_under_protect_the_ceiling_a_returning_warning_sets_prevents_the_spike() -> None:
    result = under_protect()
    assert len(warnings(result)) >= 2  # the brake, then the ceiling
    assert spike_step(result.train_losses) is None
    assert result.final_eval_loss < 2.0  # unguarded, it ends near 80


def test_a_loop_that_raises_the_lr_by_hand_without_warmup_is_told_the_lr() -> None:
    """A stranger's loop: no warmup (the preflight sees the first steps at one LR) and, from
    step 50, `param_group["lr"] *= 1.03` written by the loop each step, a warmup that never
    stops. The warning comes from the LR the loop raised, so the diagnosis names the LR, not
    the missing warmup; under `protect` the loss never doubles."""
    torch.manual_seed(0)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=SANE_LR, weight_decay=0.0)
    guard = Guard(model, optimizer, config=GuardConfig(policy="protect", sinks={"console": False}))
    transition = MarkovLanguage(VOCAB_SIZE, branching=3, seed=7).transition
    losses = []
    for step in range(200):
        if step >= 50:
            for group in optimizer.param_groups:
                group["lr"] *= 1.03
        tokens = _sequences(transition, torch.Generator().manual_seed(step))
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB_SIZE), tokens[:, 1:].reshape(-1))
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    guard.close()
    warned = [e for e in guard.events if e.kind == "instability_precursor"]
    assert warned and warned[0].details["lr"] > 2 * SANE_LR
    assert any(f.cause == "missing_warmup" for f in guard.findings)
    assert guard.diagnose()[0].code == "lr_too_high"
    assert spike_step(losses) is None


def test_under_prove_on_the_first_warning_is_proved_by_a_window_and_the_run_is_unchanged() -> None:
    """No bad step to replay: the steps from a good state to the warning, replayed, take the
    warned signal over the warning's bound again; with the LR x0.1 it stays under it. The run
    trains as it would have without the proof."""
    proved, plain = under_protect("on"), under_protect()  # `auto` proves no warning
    first = warnings(proved)[0]
    (proof,) = [e for e in proved.events if e["kind"] == "proof"]
    details = proof["details"]
    assert proof["step"] == first and details["reproduced"] and details["window"] > 0
    assert details["warned"].startswith("Adam's g/sqrt(v) RMS of ")
    assert list(details["confirmed"]) == ["lr_too_high"]
    (trial,) = details["trials"]  # the likeliest fix healed it: nothing more is replayed
    warned = next(e for e in proved.events if e["step"] == first
                  and e["kind"] == "instability_precursor")
    assert trial["name"] == "lr_x0.1" and trial["signal"] < warned["details"]["bound"]
    assert proved.diagnosis[0] == "lr_too_high"
    assert proved.train_losses == plain.train_losses
    # the same events (their likely causes aside, which the proof puts right)
    assert [(e["kind"], e["step"], e["message"]) for e in proved.events
            if e["kind"] != "proof"] == [(e["kind"], e["step"], e["message"])
                                         for e in plain.events]
