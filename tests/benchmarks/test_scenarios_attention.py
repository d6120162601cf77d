"""The attention family with its seed fixed, every probe on by default: `instability_precursor`
warns from the attention logits long before the loss spikes under a high LR without QK-norm,
stays silent on the healthy twins (the same LR with QK-norm, a safe LR without), and names
`attention_logit_growth` among the first causes, after the LR the preflight flagged. Ground
truth: the run under `observe` (which trains exactly as an unguarded run) and
`benchmarks.precursors.spike_step`."""

from __future__ import annotations

from benchmarks.precursors import spike_step
from benchmarks.scenarios import scenario
from benchmarks.scenarios.runner import RunResult, run_scenario

from trainguard import GuardConfig

OBSERVE = GuardConfig(policy="observe", sinks={"console": False})
SPIKE_WITHIN = 400
"""Steps run: the spike's step is chaotic, set by the float rounding of the machine's kernels
(at step 191 on one CPU, 324 on another, both with one thread), so the run is long enough for
both."""


def attention_warnings(result: RunResult) -> list[dict]:
    return [e for e in result.events if e["kind"] == "instability_precursor"
            and e["details"].get("signal") == "attn_logit_max"]


def test_the_attention_warning_comes_long_before_the_spike() -> None:
    fault = scenario("tiny_attn_no_qk_norm")
    result = run_scenario(fault, "trainguard", seed=0, config=OBSERVE, steps=SPIKE_WITHIN)
    spike = spike_step(result.train_losses)
    assert spike is not None and spike > 150
    warned = attention_warnings(result)
    assert warned and warned[0]["step"] <= spike - 5
    first = warned[0]
    assert first["param"] == first["details"]["layer"] and first["value"] >= 100
    assert first["details"]["trend"] in ("rising", "flat", "falling")
    loss_events = [e["step"] for e in result.events
                   if e["kind"] in ("loss_spike", "loss_divergence", "nonfinite_loss")]
    assert loss_events and first["step"] <= min(loss_events) - 5
    # the preflight's warning that AdamW at 0.1 is far too high puts the LR first, and the
    # mechanism the warning measured second
    assert result.voted_diagnosis[:2] == ["lr_too_high", "attention_logit_growth"]


def test_silent_on_the_twin_with_qk_norm_at_the_same_lr() -> None:
    result = run_scenario(scenario("tiny_attn_healthy_qk_norm"), "trainguard", seed=0,
                          config=OBSERVE)
    assert spike_step(result.train_losses) is None
    assert attention_warnings(result) == []


def test_silent_on_the_twin_at_the_safe_lr() -> None:
    result = run_scenario(scenario("tiny_attn_healthy_safe_lr"), "trainguard", seed=0,
                          config=OBSERVE)
    assert spike_step(result.train_losses) is None
    assert result.events == []
