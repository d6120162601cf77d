"""The run's verdict: a run that ends worse than before its trouble is `degraded`, stored, shown
and printed; a healthy or recovered run is said to be so; noise decides nothing."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import trainguard
from trainguard import Guard, GuardConfig
from trainguard.report import build_report
from trainguard.verdict import LossTrack


def track(losses: list[float], trouble_at: int | None = None) -> LossTrack:
    t = LossTrack()
    for step, loss in enumerate(losses):
        t.observe(step, loss, trouble=step == trouble_at)
    return t


def test_samples_still_broken_at_the_end_degrade_a_run_whose_loss_fell() -> None:
    falling = track(list(np.linspace(1.0, 0.2, 100)))
    verdict = falling.verdict(broken_output=(40, "colour noise (roughness 0.9)"))
    assert verdict is not None and verdict.verdict == "degraded"
    assert verdict.message.startswith("its samples were broken from step 40 to the last check")
    assert falling.verdict().verdict == "healthy"  # type: ignore[union-attr]


def test_a_falling_loss_is_healthy() -> None:
    verdict = track(list(np.linspace(3.0, 1.0, 100))).verdict()
    assert verdict is not None and verdict.verdict == "healthy"


def test_a_stalled_verdict_repeats_what_the_run_showed_of_why() -> None:
    track = LossTrack()
    for step in range(150):
        track.observe(step, 4.7 + 0.01 * (-1) ** step, trouble=False)
    result = track.verdict(stall_reason="the LR was 0 at every one of those 100 steps")
    assert result is not None and result.verdict == "stalled"
    assert result.message.endswith("the run did not learn; the LR was 0 at every one of those "
                                   "100 steps")
    plain = track.verdict()
    assert plain is not None and plain.message.endswith("the run did not learn")


def test_noise_around_a_flat_loss_is_not_degraded() -> None:
    """Heavy-tailed noise around a loss that never moves: never degraded (a loss that did not
    come down in 200 steps is `stalled`, unless its noise happens to trend)."""
    for seed in range(20):
        rng = np.random.default_rng(seed)
        losses = list(2.0 + rng.standard_t(3, size=200) * 0.3)
        verdict = track(losses).verdict()
        assert verdict is not None and verdict.verdict in ("healthy", "stalled"), seed


def test_ending_above_the_level_before_the_trouble_is_degraded() -> None:
    losses = [6.2 - 0.01 * i for i in range(60)] + [8.6] * 60
    verdict = track(losses, trouble_at=60).verdict()
    assert verdict is not None and verdict.verdict == "degraded"
    assert verdict.trouble_step == 60 and verdict.final == 8.6
    assert "before the first trouble (step 60)" in verdict.message


def test_a_run_back_below_its_level_recovered() -> None:
    losses = [3.0 - 0.01 * i for i in range(60)] + [9.0] * 5 + [2.0] * 40
    verdict = track(losses, trouble_at=60).verdict()
    assert verdict is not None and verdict.verdict == "recovered"


def test_a_recovery_within_its_swings_says_how_far_above_it_ended() -> None:
    """A final median 1.6x the level before the trouble, within the swings of the last losses,
    is recovered by the rule; the words say the ratio and the swings, not "within 10%"."""
    rng = np.random.default_rng(0)
    losses = [3.0 - 0.033 * i for i in range(60)] + [9.0] * 3 + list(
        1.7 + 1.5 * rng.uniform(-1, 1, size=40))
    verdict = track(losses, trouble_at=60).verdict()
    assert verdict is not None and verdict.verdict == "recovered", verdict
    assert "before the first trouble (step 60), within the swings of its last" in verdict.message
    assert verdict.final is not None and verdict.final > 1.1 * verdict.before_trouble
    assert "10%" not in verdict.message


def test_with_no_finite_loss_only_what_the_run_showed_is_a_verdict() -> None:
    """No loss judged (a GRPO surrogate passed as None, or every loss non-finite): no verdict,
    unless the run halted (degraded) or a stretch that learned nothing lasted to the end
    (stalled)."""
    empty = LossTrack()
    assert empty.verdict() is None
    stalled = empty.verdict(untrained=(4, "every group of completions scored alike"))
    assert stalled is not None and stalled.verdict == "stalled"
    assert stalled.message.startswith("every group of completions scored alike from step 4 "
                                      "to the end of the run")
    nan = track([math.nan] * 5)
    halted = nan.verdict(halted=True, halt_step=4, untrained=(0, "steps all skipped"))
    assert halted is not None and halted.verdict == "degraded"
    assert halted.message == "the run was halted at step 4 on a non-finite loss"


def test_a_run_that_ends_in_nan_is_degraded() -> None:
    verdict = track([2.0] * 30 + [math.nan] * 15, trouble_at=30).verdict()
    assert verdict is not None and verdict.verdict == "degraded"
    assert "not finite" in verdict.message


def test_a_loss_whose_level_is_zero_still_gets_a_verdict() -> None:
    """A loss that starts at exactly 0 (a penalty such as a KL term) and grows: no ratio can be
    taken against a level of 0, and the verdict says so in words instead of failing."""
    verdict = track([0.0] * 20 + [1e-3] * 20).verdict()
    assert verdict is not None and verdict.verdict == "degraded"
    assert "above the 0 it was" in verdict.message


def test_the_state_round_trips() -> None:
    t = track([3.0, 2.5, 2.0, 9.0, 8.0], trouble_at=3)
    again = LossTrack()
    again.load_state_dict(json.loads(json.dumps(t.state_dict())))
    assert again.verdict() == t.verdict()


def _bad_lr_run(run_dir: Path, console: bool) -> Guard:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    guard = Guard(model, optimizer, config=GuardConfig(sinks={"console": console},
                                                       probes={"preflight": False}),
                  run_dir=run_dir)
    generator = torch.Generator().manual_seed(1)
    for step in range(120):
        if step == 60:  # the user's code raises the LR and leaves it there
            for group in optimizer.param_groups:
                group["lr"] = 1.0
        x = torch.randn(32, 8, generator=generator)
        loss = nn.functional.mse_loss(model(x), x[:, :1] * 2)
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    return guard


def test_a_degraded_run_is_stored_shown_and_printed(tmp_path: Path, capsys) -> None:
    guard = _bad_lr_run(tmp_path / "run", console=True)
    assert guard.verdict is not None and guard.verdict.verdict == "degraded"
    assert "verdict: DEGRADED" in capsys.readouterr().err
    reader = trainguard.RunReader(tmp_path / "run")
    assert reader.summary()["verdict"]["verdict"] == "degraded"
    assert reader.meta()["status"] == "finished"  # how it ended; the verdict says how it went
    cli = [sys.executable, "-m", "trainguard", "show", str(tmp_path / "run")]
    shown = subprocess.run(cli, capture_output=True, text=True, check=True).stdout
    assert "verdict    DEGRADED: the loss ended at" in shown
    as_json = json.loads(subprocess.run([*cli, "--json"], capture_output=True, text=True,
                                        check=True).stdout)
    assert as_json["verdict"]["verdict"] == "degraded"
    listing = subprocess.run([sys.executable, "-m", "trainguard", "runs", str(tmp_path / "run")],
                             capture_output=True, text=True, check=True).stdout
    assert "DEGRADED" in listing


def test_a_healthy_run_prints_no_verdict(tmp_path: Path, capsys) -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    guard = Guard(model, optimizer, config=GuardConfig(probes={"preflight": False}),
                  run_dir=tmp_path / "r")
    for _ in range(60):
        x = torch.randn(16, 4)
        loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    assert guard.verdict is not None and guard.verdict.verdict == "healthy"
    assert "verdict" not in capsys.readouterr().err


def test_a_run_halted_on_a_nan_is_degraded_not_recovered(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import pytest
    import torch

    import trainguard

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    guard = trainguard.Guard(model, optimizer, run_dir=tmp_path / "run",
                             config=trainguard.GuardConfig(policy="halt", sinks={"console": False}))
    with pytest.raises(trainguard.TrainingDiverged) as halted:
        for step in range(60):
            x = torch.randn(8, 4)
            if step == 40:
                x[0, 0] = float("nan")
            loss = torch.nn.functional.mse_loss(model(x), x[:, :1])
            loss.backward()
            guard.step(loss)
            optimizer.zero_grad(set_to_none=True)
    guard.close()
    assert guard.verdict is not None and guard.verdict.verdict == "degraded"
    step = halted.value.report.step
    assert f"halted at step {step} on a non-finite loss" in guard.verdict.message


def _observed_run(tmp_path: Path, *, nan_steps: range = range(0), policy: str = "protect",
                  steps: int = 60, no_backward: range = range(0)) -> Guard:
    """`steps` steps of a small regression; the batches of `nan_steps` carry a NaN input, and
    the loop forgets `backward()` on the steps of `no_backward`."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    guard = Guard(model, optimizer, run_dir=tmp_path / policy,
                  config=GuardConfig(policy=policy, sinks={"console": False},
                                     probes={"preflight": False}))  # type: ignore[arg-type]
    for step in range(steps):
        x = torch.randn(16, 4)
        target = x.sum(1, keepdim=True)
        if step in nan_steps:
            x[0, 0] = float("nan")
        loss = nn.functional.mse_loss(model(x), target)
        if step not in no_backward:
            loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    return guard


def test_a_run_whose_weights_end_non_finite_is_degraded(tmp_path: Path) -> None:
    """Three NaN losses at the end are too few for the losses alone to decide (the verdict's
    window is 20), but under observe the NaN reached the weights: the model is broken."""
    guard = _observed_run(tmp_path, nan_steps=range(57, 60), policy="observe")
    assert not all(torch.isfinite(p).all() for p in guard.model.parameters())
    assert guard.verdict is not None and guard.verdict.verdict == "degraded"
    assert "weights are not all finite" in guard.verdict.message
    assert "the last 3 losses were not finite" in guard.verdict.message


def test_skipped_nan_steps_at_the_end_leave_a_finite_model_recovered(tmp_path: Path) -> None:
    """The same NaN batches under protect: skipped, the weights stay finite and the run keeps the
    verdict its losses give."""
    guard = _observed_run(tmp_path, nan_steps=range(57, 60), policy="protect")
    assert all(torch.isfinite(p).all() for p in guard.model.parameters())
    assert guard.verdict is not None and guard.verdict.verdict == "recovered"


def test_a_run_halted_on_a_finite_spike_is_not_called_recovered(tmp_path: Path) -> None:
    """The halting step's loss is huge but finite, and the losses before it were fine: the run
    still stopped at the trouble, which is no recovery."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    guard = trainguard.Guard(model, optimizer, run_dir=tmp_path / "run",
                             config=trainguard.GuardConfig(policy="halt", sinks={"console": False}))
    with pytest.raises(trainguard.TrainingDiverged) as halted:
        for step in range(60):
            x = torch.randn(8, 4)
            if step == 40:
                x = x * 1e4
            loss = torch.nn.functional.mse_loss(model(x), x[:, :1])
            loss.backward()
            guard.step(loss)
            optimizer.zero_grad(set_to_none=True)
    guard.close()
    step = halted.value.report.step
    assert guard.verdict is not None and guard.verdict.verdict == "degraded"
    assert f"halted at step {step}" in guard.verdict.message




def test_a_run_too_short_to_judge_gets_no_verdict(tmp_path: Path) -> None:
    """Six steps: the start level and the end level are the same losses, so "healthy: 5.1 to
    5.1" would say nothing. No verdict, and every place that shows one says why; a run long
    enough gets its verdict."""
    guard = _observed_run(tmp_path / "short", steps=6)
    assert guard.verdict is not None and guard.verdict.verdict is None
    assert guard.verdict.message.startswith("too short to judge: 6 finite loss(es), where the "
                                            "verdict needs 20"), guard.verdict.message
    reader = trainguard.RunReader(tmp_path / "short" / "protect")
    assert reader.summary()["verdict"]["verdict"] is None
    cli = [sys.executable, "-m", "trainguard", "show", str(tmp_path / "short" / "protect")]
    shown = subprocess.run(cli, capture_output=True, text=True, check=True).stdout
    assert "verdict    too short to judge: 6 finite loss(es)" in shown, shown
    html, _ = build_report(tmp_path / "short" / "protect")
    assert '<p class="verdict">too short to judge: 6 finite loss(es)' in html
    judged = _observed_run(tmp_path / "judged", steps=20)
    assert judged.verdict is not None and judged.verdict.verdict == "healthy"


def test_a_short_run_that_shows_its_trouble_is_still_judged(tmp_path: Path) -> None:
    """What needs no comparison of levels is known however short the run: a halt, weights that
    are not finite."""
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    guard = Guard(model, optimizer, config=GuardConfig(policy="halt", sinks={"console": False}))
    with pytest.raises(trainguard.TrainingDiverged):
        for step in range(6):
            x = torch.randn(16, 4)
            if step == 3:
                x[0, 0] = float("nan")
            loss = nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))
            loss.backward()
            guard.step(loss)
            optimizer.zero_grad(set_to_none=True)
    assert guard.verdict is not None and guard.verdict.verdict == "degraded"
    observed = _observed_run(tmp_path, nan_steps=range(3, 6), policy="observe", steps=6)
    assert observed.verdict is not None and observed.verdict.verdict == "degraded"
    assert "weights are not all finite" in observed.verdict.message

def test_a_halted_run_is_said_halted_at_the_step_that_halted(tmp_path: Path) -> None:
    """The demo's exploding run: the loss spikes at step 1 and the run halts many steps later,
    when the divergence is confirmed. The verdict names the halting step as the halt, and the
    step its trouble began at as such."""
    from trainguard.demo.run import DemoRun, train

    result = train(DemoRun("exploding", lr=1.0, warmup=0, policy="halt"), steps=60,
                   out_dir=tmp_path, seed=0, stream=io.StringIO())
    assert result.halted
    halt_step = result.steps - 1
    with trainguard.RunReader(result.run_dir) as reader:
        verdict = reader.summary()["verdict"]
    trouble = verdict["trouble_step"]
    assert trouble is not None and trouble < halt_step, verdict
    assert verdict["message"].startswith(
        f"the run was halted at step {halt_step} and did not go past the trouble that began at "
        f"step {trouble}"), verdict["message"]
    assert verdict["halt_step"] == halt_step

def test_a_run_whose_last_steps_had_no_gradient_stalled(tmp_path: Path) -> None:
    """backward() went missing from step 50: the loss stays where the last update left it, no
    worse than before, yet nothing trained after it."""
    guard = _observed_run(tmp_path, steps=80, no_backward=range(50, 80))
    assert guard.verdict is not None and guard.verdict.verdict == "stalled"
    assert "no gradients from step 50 to the end" in guard.verdict.message
    # a gap that ended is no stall of the run's end
    guard = _observed_run(tmp_path / "gap", steps=80, no_backward=range(30, 40))
    assert guard.verdict is not None and guard.verdict.verdict != "stalled"


def _track(losses: list[float], trouble: set[int]) -> LossTrack:
    track = LossTrack()
    for step, loss in enumerate(losses):
        track.observe(step, loss, trouble=step in trouble)
    return track


def test_a_run_that_ends_inside_trouble_is_judged_by_the_losses_since_it_began() -> None:
    """Stopped (Ctrl-C, or the last step) 9 steps into a blow-up: the median of the last 20
    losses still sits on the 11 from before it, but the run did not come back."""
    rng = np.random.default_rng(0)
    calm = list(np.linspace(3.0, 1.7, 150) + 0.05 * rng.standard_normal(150))
    track = _track(calm + [1000.0] * 9, trouble={150, 152, 155})
    verdict = track.verdict()
    assert verdict is not None and verdict.verdict == "degraded"
    assert verdict.final == 1000.0
    # the state, kept and restored, judges the same
    again = LossTrack()
    again.load_state_dict(json.loads(json.dumps(track.state_dict())))
    assert again.verdict() == verdict
    # one spike 10 steps before the end, and the losses after it back on their level
    back = _track([*calm, 1000.0, *calm[-9:]], trouble={150})
    assert back.verdict() is not None and back.verdict().verdict == "recovered"
    # trouble on the very last steps leaves too few losses after it to judge by
    last = _track([*calm, 1000.0, 900.0], trouble={150})
    assert last.verdict() is not None and last.verdict().verdict == "recovered"


def test_trouble_from_the_first_steps_and_back_to_the_start_says_it_ended_no_lower() -> None:
    """An LR far too high from step 0: the loss blows up at once and comes back to where the
    model started. Recovered, and said to have ended no lower than where it started; a run
    whose trouble came after it had learned is told as before."""
    early = LossTrack()
    for step, loss in enumerate([5.1, 9.0, 24.0] + [5.2 + 15 * math.exp(-i / 8)
                                                    for i in range(100)]):
        early.observe(step, loss, trouble=1 <= step <= 2)
    verdict = early.verdict()
    assert verdict is not None and verdict.verdict == "recovered"
    assert verdict.message.endswith("(step 1), where it started: it ended no lower")
    later = LossTrack()
    losses = [5.1 - 0.02 * i for i in range(40)] + [24.0, 10.0] + [4.3] * 100
    for step, loss in enumerate(losses):
        later.observe(step, loss, trouble=40 <= step <= 41)
    told = later.verdict()
    assert told is not None and told.verdict == "recovered"
    assert "where it started" not in told.message


def test_trouble_at_the_very_first_step_adds_no_clause() -> None:
    """Trouble before any loss: the level before it is unknown and the run is judged against
    its start, told once."""
    track = LossTrack()
    for step, loss in enumerate([5.1] + [5.3] * 30):
        track.observe(step, loss, trouble=step == 0)
    verdict = track.verdict()
    assert verdict is not None and verdict.verdict == "recovered"
    assert "where it started" not in verdict.message
