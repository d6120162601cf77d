"""The `logit_growth` family with its seed fixed, the probes on by default: the log Z precursor
warns at least 5 steps before the loss spikes under an output head whose LR never stops rising,
stays silent on the healthy twins (one of them trained with a z-loss), and under `protect` the
brake it pulls prevents the spike. Ground truth: the run under `observe` (which trains exactly
as an unguarded run) and `benchmarks.precursors.spike_step`."""

from __future__ import annotations

from benchmarks.precursors import spike_step
from benchmarks.scenarios import scenario
from benchmarks.scenarios.runner import RunResult, run_scenario

from trainguard import GuardConfig

OBSERVE = GuardConfig(policy="observe", sinks={"console": False})
SEED = 2


def warnings(result: RunResult) -> list[tuple[int, str]]:
    return [(e["step"], e["details"]["signal"]) for e in result.events
            if e["kind"] == "instability_precursor"]


def test_log_z_warns_at_least_5_steps_before_the_spike() -> None:
    fault = scenario("logit_growth_head_lr_ramp")
    result = run_scenario(fault, "trainguard", seed=SEED, config=OBSERVE, steps=195)
    spike = spike_step(result.train_losses)
    assert spike is not None and fault.onset_step is not None and spike > fault.onset_step + 50
    warned = warnings(result)
    assert warned and warned[0][1] == "logz_max"
    assert fault.onset_step <= warned[0][0] <= spike - 5
    event = next(e for e in result.events if e["kind"] == "instability_precursor")
    assert event["param"] == "logits" and event["details"]["ratio"] > 1.0
    assert any("z-loss" in fix for fix in event["details"]["fixes"])


def test_silent_on_the_healthy_twin_whose_head_lr_rises_then_holds() -> None:
    twin = scenario("logit_growth_healthy_capped_head_ramp")
    result = run_scenario(twin, "trainguard", seed=0, config=OBSERVE)
    assert spike_step(result.train_losses) is None
    assert warnings(result) == [] and result.events == []


def test_silent_on_the_healthy_twin_at_the_sane_lr() -> None:
    twin = scenario("logit_growth_healthy")
    result = run_scenario(twin, "trainguard", seed=0, config=OBSERVE)
    assert spike_step(result.train_losses) is None
    assert warnings(result) == [] and result.events == []


def test_silent_on_the_healthy_twin_trained_with_a_z_loss() -> None:
    """The capped head ramp with log Z^2 in the loss: log Z held near 0, the run healthy."""
    twin = scenario("logit_growth_healthy_z_loss")
    result = run_scenario(twin, "trainguard", seed=1, config=OBSERVE)
    assert spike_step(result.train_losses) is None
    assert warnings(result) == [] and result.events == []
    assert result.final_eval_loss < 0.25


def test_under_protect_the_brake_the_log_z_warning_pulls_prevents_the_spike() -> None:
    fault = scenario("logit_growth_head_lr_ramp")
    result = run_scenario(fault, "trainguard", seed=SEED,
                          config=GuardConfig(policy="protect", sinks={"console": False}))
    assert warnings(result)[0][1] == "logz_max"
    assert spike_step(result.train_losses) is None
    assert result.final_eval_loss < 0.5  # unguarded, it ends above 1


def test_under_protect_log_z_still_growing_after_the_brake_sets_a_ceiling() -> None:
    """Seed 0: log Z warns one step before the spike; the brake's halved LR rises again 5% a
    step, log Z climbs a further 3 nats within the same episode, and that second report holds
    the head's LR under a ceiling: no spike (before the second report there was one, at 199)."""
    fault = scenario("logit_growth_head_lr_ramp")
    result = run_scenario(fault, "trainguard", seed=0,
                          config=GuardConfig(policy="protect", sinks={"console": False}))
    events = [e for e in result.events if e["kind"] == "instability_precursor"]
    assert len(events) >= 2 and events[1]["details"]["signal"] == "logz_max"
    assert events[1]["details"]["since_step"] == events[0]["step"]
    assert "still growing" in events[1]["message"]
    # (a warning that comes back sets the ceiling: tests/recovery/test_brake.py)
    assert spike_step(result.train_losses) is None
    assert result.final_eval_loss < 0.5
