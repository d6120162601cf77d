"""The Guard driving real small models through real training loops."""

from __future__ import annotations

import copy
import math
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import trainguard
from trainguard import Guard, GuardConfig, TrainingDiverged, UsageError
from trainguard.sinks import Sink
from trainguard.transfer import blocking_transfer_count, transfer_count

from .conftest import make_setup

QUIET = {"sinks": {"console": False}}
PACKAGE = Path(trainguard.__file__).resolve().parent


def ours(filename: str) -> bool:
    """Whether code in `filename` is trainguard's own: by where the package really is, not by a
    folder named trainguard in the path (a clone is one, and may hold the venv with torch)."""
    return Path(filename).resolve().is_relative_to(PACKAGE)


def train(guard: Guard, setup, steps: int, *, poison: dict[int, float] | None = None,
          autocast: torch.dtype | None = None, scaler=None) -> list[trainguard.StepReport]:
    """Run `steps` steps; `poison` maps a step to a value written into that step's embedding."""
    reports = []
    for step in range(steps):
        batch = setup.batch()
        with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
            logits_loss = setup.model.loss(batch)
            if poison and step in poison:
                logits_loss = logits_loss * poison[step]
        (scaler.scale(logits_loss) if scaler else logits_loss).backward()
        reports.append(guard.step(logits_loss, batch=batch))
        setup.optimizer.zero_grad(set_to_none=True)
    return reports


def optimizer_state(optimizer: torch.optim.Optimizer) -> dict:
    return copy.deepcopy(optimizer.state_dict()["state"])


def assert_same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        for name, value in a[key].items():
            other = b[key][name]
            if isinstance(value, torch.Tensor):
                assert torch.equal(value, other), (key, name)
            else:
                assert value == other, (key, name)


@pytest.mark.slow
def test_healthy_run_of_300_steps_raises_no_event() -> None:
    setup = make_setup(lr=3e-3, warmup=20, total=300)
    guard = Guard(setup.model, setup.optimizer, setup.scheduler, config=GuardConfig(**QUIET))
    reports = train(guard, setup, 300)
    guard.close()
    assert guard.events == []
    assert all(r.action in ("applied", "clipped") for r in reports)
    first = sum(r.loss for r in reports[:10]) / 10
    last = sum(r.loss for r in reports[-10:]) / 10
    assert last < 0.5 * first, "the loss must really fall on this task"


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_nan_batch_is_detected_and_skipped_without_touching_optimizer_state(dtype) -> None:
    setup = make_setup()
    guard = Guard(setup.model, setup.optimizer, setup.scheduler, config=GuardConfig(**QUIET))
    train(guard, setup, 12, autocast=dtype)
    before_state = optimizer_state(setup.optimizer)
    before_weights = copy.deepcopy(setup.model.state_dict())
    before_lr = setup.optimizer.param_groups[0]["lr"]

    batch = setup.batch()
    with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        loss = setup.model.loss(batch) * float("nan")
    loss.backward()
    report = guard.step(loss, batch=batch)

    assert report.action == "skipped"
    assert report.step == 12
    kinds = {e.kind for e in report.events}
    assert {"nonfinite_loss", "nonfinite_grad"} <= kinds
    grad_event = next(e for e in report.events if e.kind == "nonfinite_grad")
    assert grad_event.param in dict(setup.model.named_parameters())
    assert_same_state(before_state, optimizer_state(setup.optimizer))
    for name, value in setup.model.state_dict().items():
        assert torch.equal(value, before_weights[name]), name
    assert setup.optimizer.param_groups[0]["lr"] == before_lr, "scheduler must not advance"
    assert all(p.grad is None for p in setup.model.parameters())

    # the run carries on and stays finite
    reports = train(guard, setup, 5, autocast=dtype)
    assert all(r.action in ("applied", "clipped") for r in reports)
    assert all(torch.isfinite(p).all() for p in setup.model.parameters())
    guard.close()


def test_nonfinite_grad_names_the_offending_parameter() -> None:
    setup = make_setup()
    guard = Guard(setup.model, setup.optimizer, config=GuardConfig(**QUIET))
    train(guard, setup, 3)
    loss = setup.model.loss(setup.batch())
    loss.backward()
    setup.model.head.weight.grad[0, 0] = float("inf")
    report = guard.step(loss)
    event = next(e for e in report.events if e.kind == "nonfinite_grad")
    assert event.param == "head.weight"
    assert "inf" in event.message
    assert report.action == "skipped"
    assert not any(e.kind == "nonfinite_loss" for e in report.events)


def test_learning_rate_1000x_too_high_is_detected_within_a_few_steps() -> None:
    setup = make_setup(lr=3.0, warmup=0)  # 1000x the 3e-3 that trains this model well
    guard = Guard(setup.model, setup.optimizer, config=GuardConfig(**QUIET))
    reports = train(guard, setup, 40)
    guard.close()
    first_loss = reports[0].loss
    takeoff = next(r.step for r in reports if r.loss > 3 * first_loss)
    detected = [e for e in guard.events if e.severity in ("warning", "error", "critical")]
    assert detected, "the explosion must be detected"
    assert detected[0].step - takeoff <= 3
    # the first update measured (step 0, told in step order) may already say the LR is too high
    assert detected[0].kind in ("update_too_large", "loss_spike", "grad_explosion",
                                "nonfinite_loss")


def test_one_device_to_host_transfer_per_step_and_no_item_calls(monkeypatch) -> None:
    setup = make_setup()
    guard = Guard(setup.model, setup.optimizer, setup.scheduler,
                  config=GuardConfig(sinks={"console": False}, probes={"sample_every": 5}))
    train(guard, setup, 3)
    items = []
    original_item = torch.Tensor.item

    def counting_item(self):
        caller = sys._getframe(1).f_code.co_filename
        if ours(caller):  # the optimizer's own .item() calls are not ours
            items.append(caller)
        return original_item(self)

    for step in range(3, 23):  # includes sampled steps 5, 10, 15, 20 (batch inspected there)
        batch = setup.batch()
        loss = setup.model.loss(batch)
        loss.backward()
        before = transfer_count()
        monkeypatch.setattr(torch.Tensor, "item", counting_item)
        report = guard.step(loss, batch={"input_ids": batch})
        monkeypatch.setattr(torch.Tensor, "item", original_item)
        assert transfer_count() - before == 1, f"step {step}"
        assert report.sampled == (step % 5 == 0)
        setup.optimizer.zero_grad(set_to_none=True)
    assert items == [], "no .item() on the hot path"
    guard.close()


def test_the_frame_filter_knows_trainguard_by_its_location(tmp_path) -> None:
    import trainguard.guard

    assert ours(trainguard.guard.__file__) and not ours(torch.__file__)
    clone = tmp_path / "trainguard" / ".venv" / "lib" / "python3.11" / "site-packages"
    assert not ours(str(clone / "torch" / "optim" / "optimizer.py"))


def test_sampled_steps_record_weights_update_ratio_activations_and_adam_state(tmp_path) -> None:
    setup = make_setup()
    guard = Guard(setup.model, setup.optimizer, config=GuardConfig(sinks={"console": False},
                                                                   probes={"sample_every": 4}),
                  run_dir=tmp_path / "run")
    train(guard, setup, 9)
    guard.close()
    reader = trainguard.RunReader(tmp_path / "run")
    steps, ratio = reader.param_metric("update_ratio")
    assert list(steps) == [0, 4, 8]
    assert (ratio > 0).all() and (ratio <= 1).all()  # zero-initialised biases move 100% at step 0
    assert (ratio[1:] < 0.5).all()
    names = reader.param_names()
    _, maxabs = reader.param_metric("weight_maxabs")
    expected = setup.model.head.weight.detach().abs().max().item()
    assert maxabs[-1, names.index("head.weight")] == pytest.approx(expected, rel=1e-6)
    _, exp_avg_sq = reader.param_metric("optstate_exp_avg_sq_norm")
    assert (exp_avg_sq[1:] > 0).all()
    activations = reader.module_metric("act_maxabs")
    assert [step for step, _, _ in activations] == [0, 4, 8]
    _, modules, values = activations[0]
    assert "tok" in modules and "head" in modules
    assert (values > 0).all()


def test_clipping_matches_clip_grad_norm() -> None:
    reference = make_setup(lr=1e-2, warmup=0)
    guarded = make_setup(lr=1e-2, warmup=0)
    guarded.model.load_state_dict(reference.model.state_dict())
    guard = Guard(guarded.model, guarded.optimizer,
                  config=GuardConfig(sinks={"console": False}, clip={"max_grad_norm": 0.1}))
    batch = reference.batch()
    for setup in (reference, guarded):
        setup.model.loss(batch).backward()
    expected = torch.nn.utils.clip_grad_norm_(reference.model.parameters(), 0.1)
    reference.optimizer.step()
    report = guard.step(guarded.model.loss(batch).detach())
    assert report.action == "clipped"
    assert report.grad_norm == pytest.approx(expected.item(), rel=1e-5)
    for a, b in zip(reference.model.parameters(), guarded.model.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_grad_scaler_overflow_is_skipped_silently_and_lowers_the_scale() -> None:
    setup = make_setup()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    guard = Guard(setup.model, setup.optimizer, scaler=scaler, config=GuardConfig(**QUIET))
    train(guard, setup, 3, autocast=torch.float16, scaler=scaler)
    state = optimizer_state(setup.optimizer)
    scale = scaler.get_scale()
    with torch.autocast("cpu", dtype=torch.float16):
        loss = setup.model.loss(setup.batch())
    scaler.scale(loss).backward()
    setup.model.head.weight.grad.fill_(float("inf"))  # what an fp16 overflow looks like
    report = guard.step(loss)
    assert report.action == "skipped"
    assert report.events == [], "a scaler overflow with a finite loss is routine"
    assert scaler.get_scale() == scale / 2
    assert_same_state(state, optimizer_state(setup.optimizer))
    assert report.loss_scale == scale
    guard.close()


def test_observe_applies_every_step() -> None:
    setup = make_setup()
    guard = Guard(setup.model, setup.optimizer, config=GuardConfig(policy="observe",
                                                                   sinks={"console": False}))
    train(guard, setup, 3)
    loss = setup.model.loss(setup.batch()) * float("nan")
    loss.backward()
    report = guard.step(loss)
    assert report.action == "applied"
    assert any(e.kind == "nonfinite_loss" for e in report.events)
    assert not torch.isfinite(setup.model.head.weight).all(), "observe does not interfere"


def test_halt_writes_a_snapshot_that_loads_with_weights_only(tmp_path) -> None:
    setup = make_setup()
    guard = Guard(setup.model, setup.optimizer, setup.scheduler,
                  config=GuardConfig(policy="halt",
                                     sinks={"console": False}), run_dir=tmp_path / "run")
    train(guard, setup, 4)
    weights = copy.deepcopy(setup.model.state_dict())
    batch = setup.batch()
    loss = setup.model.loss(batch) * float("nan")
    loss.backward()
    with pytest.raises(TrainingDiverged) as info:
        guard.step(loss, batch={"input_ids": batch, "note": "step 4"})
    error = info.value
    assert error.snapshot_path is not None
    assert {e.kind for e in error.events} >= {"nonfinite_loss"}
    assert error.report is not None and error.report.action == "halted"
    snapshot = torch.load(error.snapshot_path, weights_only=True)
    assert {"model", "optimizer", "scheduler", "scaler", "rng", "step", "batch", "events",
            "config"} <= snapshot.keys()
    assert snapshot["step"] == 4
    assert torch.equal(snapshot["batch"]["input_ids"], batch)
    for name, value in weights.items():
        assert torch.equal(snapshot["model"][name], value), "state from before the bad update"
    assert snapshot["optimizer"]["state"], "optimizer state is included"
    assert trainguard.load_snapshot(error.snapshot_path)["step"] == 4
    reader = trainguard.RunReader(tmp_path / "run")
    assert reader.meta()["status"] == "halted"
    assert reader.summary()["snapshot"] == error.snapshot_path
    assert reader.steps()[-1]["action"] == "halted"


def test_the_crash_snapshot_holds_the_rng_its_step_started_its_forward_from(tmp_path) -> None:
    """So that replaying the snapshot's batch draws the step's dropout masks: the RNG as the
    step's forward found it, not as it stood after the forward and the loop drew from it."""
    setup = make_setup()
    guard = Guard(setup.model, setup.optimizer, setup.scheduler,
                  config=GuardConfig(policy="halt",
                                     sinks={"console": False}), run_dir=tmp_path / "run")
    train(guard, setup, 4)
    batch = setup.batch()
    before = torch.get_rng_state()
    loss = setup.model(batch).float().mean() * float("nan")
    torch.rand(3)  # the loop draws from the RNG after the forward
    loss.backward()
    with pytest.raises(TrainingDiverged) as info:
        guard.step(loss, batch={"input_ids": batch})
    snapshot = torch.load(info.value.snapshot_path, weights_only=True)
    assert torch.equal(snapshot["rng"]["torch"], before)
    assert not torch.equal(snapshot["rng"]["torch"], torch.get_rng_state())


def test_a_halt_on_a_nan_sample_says_it_in_sentences(tmp_path) -> None:
    """The halt's message joins the events' own sentences: no doubled full stop before the
    snapshot's path, the parameters listed once."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    guard = Guard(model, optimizer, config=GuardConfig(policy="halt", sinks={"console": False}),
                  run_dir=tmp_path / "run")
    with pytest.raises(TrainingDiverged) as info:
        for step in range(30):
            x, y = torch.randn(32, 20), torch.randint(0, 4, (32,))
            if step == 20:
                x[3, 5] = float("nan")
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            guard.step(loss, batch=(x, y))
            optimizer.zero_grad(set_to_none=True)
    said = str(info.value)
    assert ". Crash snapshot: " in said and ".." not in said
    assert "(in the model's order): 0.weight, 0.bias" in said
    guard.close()


def test_protect_halts_after_too_many_consecutive_skips(tmp_path) -> None:
    setup = make_setup()
    guard = Guard(setup.model, setup.optimizer,
                  config=GuardConfig(sinks={"console": False},
                                     recovery={"max_consecutive_skips": 3}),
                  run_dir=tmp_path / "run")
    train(guard, setup, 2)
    with pytest.raises(TrainingDiverged) as info:
        train(guard, setup, 5, poison={0: math.nan, 1: math.nan, 2: math.nan, 3: math.nan})
    assert info.value.report.step == 4
    assert any(e.kind == "skip_limit" for e in info.value.events)


def test_state_dict_round_trip_keeps_baselines() -> None:
    setup = make_setup()
    guard = Guard(setup.model, setup.optimizer, config=GuardConfig(**QUIET))
    train(guard, setup, 30)
    state = guard.state_dict()
    resumed = Guard(setup.model, setup.optimizer, config=GuardConfig(**QUIET))
    resumed.load_state_dict(state)
    assert resumed.global_step == 30
    assert resumed.state_dict() == state
    # a resumed guard judges the next spike against the restored baseline
    loss = setup.model.loss(setup.batch()) * 50
    loss.backward()
    report = resumed.step(loss)
    assert any(e.kind == "loss_spike" for e in report.events)


def test_a_failing_sink_does_not_stop_training() -> None:
    class Broken(Sink):
        def on_step(self, report):
            raise OSError("disk full")

    setup = make_setup()
    guard = Guard(setup.model, setup.optimizer, config=GuardConfig(**QUIET), sinks=[Broken()])
    reports = train(guard, setup, 5)
    assert len(reports) == 5
    assert "Broken" in guard.run.sinks.failures
    guard.close()


def test_context_manager_closes_the_store(tmp_path) -> None:
    setup = make_setup()
    with Guard(setup.model, setup.optimizer, config=GuardConfig(**QUIET),
               run_dir=tmp_path / "run") as guard:
        train(guard, setup, 3)
    assert guard.run.closed
    assert trainguard.RunReader(tmp_path / "run").meta()["status"] == "finished"
    with pytest.raises(UsageError, match="closed"):
        guard.step(torch.tensor(1.0))


# -- bad input ---------------------------------------------------------------------------------

def test_model_without_trainable_parameters() -> None:
    model = nn.Linear(4, 4).requires_grad_(False)
    optimizer = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)
    with pytest.raises(UsageError, match="no trainable parameters"):
        Guard(model, optimizer)


def test_a_lazy_module_before_its_first_forward_is_a_clear_error() -> None:
    model = nn.Sequential(nn.LazyLinear(8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with pytest.raises(UsageError, match=r"parameter 0\.weight is not initialised yet.*one "
                                         "forward pass"):
        Guard(model, optimizer)
    model(torch.randn(2, 5))  # the dry run that gives its parameters their shapes
    Guard(model, optimizer).close()


def test_optimizer_with_parameters_not_in_the_model() -> None:
    model = nn.Linear(4, 4)
    stranger = nn.Parameter(torch.zeros(3, 2))
    optimizer = torch.optim.SGD([*model.parameters(), stranger], lr=0.1)
    with pytest.raises(UsageError, match=r"shape \(3, 2\) that is not in the model"):
        Guard(model, optimizer)


def test_non_scalar_loss() -> None:
    model = nn.Linear(4, 1)
    guard = Guard(model, torch.optim.SGD(model.parameters(), lr=0.1), config=GuardConfig(**QUIET))
    loss = model(torch.randn(8, 4)).squeeze(1) ** 2
    loss.mean().backward()
    with pytest.raises(UsageError, match=r"scalar.*shape \(8,\).*loss.mean\(\)"):
        guard.step(loss)
    with pytest.raises(UsageError, match="scalar tensor or a number"):
        guard.step("0.5")


def test_unknown_policy_and_wrong_types() -> None:
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(trainguard.ConfigError, match="unknown policy 'panic'"):
        Guard(model, optimizer, config=GuardConfig(policy="panic"))  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=r"torch\.optim\.Optimizer"):
        Guard(model, "adam")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=r"torch\.nn\.Module"):
        Guard("model", optimizer)  # type: ignore[arg-type]


def test_a_scheduler_that_needs_a_metric_is_refused_at_construction() -> None:
    """ReduceLROnPlateau.step(metrics) used to fail with a TypeError inside the first
    guard.step, after the update; it is the loop's to step, and the Guard says so up front."""
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
    with pytest.raises(UsageError, match=r"ReduceLROnPlateau\.step\(\) needs metrics.*"
                                         r"scheduler\.step\(metrics\)"):
        Guard(model, optimizer, scheduler=plateau)
    with pytest.raises(UsageError, match="must have a step"):
        Guard(model, optimizer, scheduler=object())
    per_step = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)
    Guard(model, optimizer, scheduler=per_step).close()  # epoch=None is optional: accepted

def test_parameters_unfrozen_later_are_watched() -> None:
    setup = make_setup()
    for param in setup.model.blocks.parameters():
        param.requires_grad_(False)
    guard = Guard(setup.model, setup.optimizer, config=GuardConfig(**QUIET))
    train(guard, setup, 2)
    for param in setup.model.blocks.parameters():
        param.requires_grad_(True)
    loss = setup.model.loss(setup.batch())
    loss.backward()
    name = "blocks.layers.0.linear1.weight"
    dict(setup.model.named_parameters())[name].grad[0, 0] = float("nan")
    report = guard.step(loss)
    assert report.action == "skipped"
    assert next(e for e in report.events if e.kind == "nonfinite_grad").param == name


def test_the_same_monitoring_failure_on_every_step_is_recorded_once(monkeypatch, caplog,
                                                                   tmp_path) -> None:
    """A failure that recurs on every step (a probe bug, a broken collective) used to add one
    `monitor_error` per step, thousands in the store: it is one event, then one count."""
    setup = make_setup()
    guard = Guard(setup.model, setup.optimizer, config=GuardConfig(**QUIET), run_dir=tmp_path)
    train(guard, setup, 2)

    def broken(*args, **kwargs):
        raise RuntimeError("probe bug")

    monkeypatch.setattr(guard.run.grad_probe, "measure", broken)
    with caplog.at_level("ERROR", logger="trainguard"):
        reports = train(guard, setup, 50)
    assert all(r.action == "applied" and [e.kind for e in r.events] == ["monitor_error"]
               and r.events[0].step == r.step for r in reports), "each step still says so"
    assert caplog.text.count("probe bug") == 1
    assert [(e.kind, e.step) for e in guard.events] == [("monitor_error", 2)]
    guard.close()
    assert [(e.kind, e.step) for e in guard.events] == [("monitor_error", 2), ("monitor_error", 51)]
    assert guard.events[1].details == {"repeats": 49, "first_step": 2}
    assert "recurred on 49 more step(s), through step 51" in guard.events[1].message
    with trainguard.RunReader(tmp_path) as reader:
        assert [e.kind for e in reader.events()] == ["monitor_error"] * 2


def test_a_monitoring_bug_does_not_stop_training(monkeypatch, caplog) -> None:
    setup = make_setup()
    guard = Guard(setup.model, setup.optimizer, setup.scheduler, config=GuardConfig(**QUIET))
    train(guard, setup, 2)

    def broken(*args, **kwargs):
        raise RuntimeError("probe bug")

    monkeypatch.setattr(guard.run.grad_probe, "measure", broken)
    weights = setup.model.head.weight.detach().clone()
    lr = setup.optimizer.param_groups[0]["lr"]
    with caplog.at_level("ERROR", logger="trainguard"):
        [report] = train(guard, setup, 1)
    assert report.action == "applied" and report.events[0].kind == "monitor_error"
    assert not torch.equal(weights, setup.model.head.weight), "the step was still applied"
    assert setup.optimizer.param_groups[0]["lr"] != lr, "and the schedule advanced"
    assert "probe bug" in caplog.text
    monkeypatch.undo()
    assert train(guard, setup, 1)[0].step == 3, "and guarding resumes"


def test_a_regression_converged_to_float_noise_is_not_halted() -> None:
    """A float32 linear regression on exact targets converges to ~1e-14 and then wobbles by 10x
    from batch to batch: rounding. Its loss_divergence used to fire at error and halt it."""
    torch.manual_seed(1)
    x = torch.randn(64, 8)
    y = x @ torch.randn(8, 1) + 0.5
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    guard = Guard(model, optimizer, config=GuardConfig(policy="halt", **QUIET))
    generator = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(1000):
        rows = torch.randint(0, 64, (16,), generator=generator)
        loss = nn.functional.mse_loss(model(x[rows]), y[rows])
        loss.backward()
        guard.step(loss)
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    guard.close()
    assert max(losses[-100:]) < 1e-11 and max(losses[-100:]) > 10 * min(losses[-100:])
    assert guard.events == []
    assert guard.run.verdict is not None and guard.run.verdict.verdict == "healthy"


@pytest.mark.parametrize("sync", ["blocking", "deferred"])
def test_a_plain_loop_hands_its_rl_metrics_with_the_step(sync: str) -> None:
    """A loop that computes its own DPO loss hands the step's metrics to `Guard.step`: a NaN
    reward under a finite loss is told by `nonfinite_metric`, under `sync="deferred"` too (judged
    with its step, a call late); the metrics may be one-value tensors, read in the step's
    transfer budget rather than one `.item()` each."""
    setup = make_setup(warmup=0)
    optimizer = torch.optim.AdamW(setup.model.parameters(), lr=1e-3, fused=sync == "deferred")
    guard = Guard(setup.model, optimizer, config=GuardConfig(sync=sync, **QUIET))
    blocking = []
    for step in range(8):
        loss = setup.model.loss(setup.batch())
        loss.backward()
        chosen = torch.tensor(math.nan if step == 5 else 0.1)
        before = blocking_transfer_count()
        guard.step(loss, metrics={"rewards/chosen": chosen, "rewards/rejected": -0.1})
        blocking.append(blocking_transfer_count() - before)
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    told = [(e.step, e.details["metrics"]) for e in guard.events if e.kind == "nonfinite_metric"]
    assert told == [(5, ["rewards/chosen"])]
    # the tensor metric rides the step's own transfer: no second one (blocking: one a step;
    # deferred: none, its transfer is not blocking)
    assert max(blocking) == (1 if sync == "blocking" else 0), blocking


@pytest.mark.parametrize("nan_at", [None, 5])
def test_recover_skips_the_update_of_a_step_whose_metrics_went_nan(nan_at: int | None) -> None:
    """Under `recover` a NaN reward under a finite loss keeps its step's update out, as a NaN
    loss would; the healthy twin (no NaN) has every update applied."""
    setup = make_setup(warmup=0)
    guard = Guard(setup.model, setup.optimizer, config=GuardConfig(policy="recover", **QUIET))
    actions = {}
    for step in range(8):
        loss = setup.model.loss(setup.batch())
        loss.backward()
        before = copy.deepcopy(setup.model.state_dict())
        chosen = math.nan if step == nan_at else 0.1
        report = guard.step(loss, metrics={"rewards/chosen": chosen, "rewards/rejected": -0.1})
        actions[step] = report.action
        if step == nan_at:
            assert all(torch.equal(v, before[k]) for k, v in setup.model.state_dict().items())
        setup.optimizer.zero_grad(set_to_none=True)
    guard.close()
    skipped = [step for step, action in actions.items() if action == "skipped"]
    assert skipped == ([] if nan_at is None else [nan_at]), actions


def test_step_metrics_that_are_not_a_mapping_are_a_usage_error() -> None:
    setup = make_setup(warmup=0)
    guard = Guard(setup.model, setup.optimizer, config=GuardConfig(**QUIET))
    loss = setup.model.loss(setup.batch())
    loss.backward()
    with pytest.raises(UsageError, match="mapping"):
        guard.step(loss, metrics=[0.1])  # type: ignore[arg-type]


@pytest.mark.parametrize("sync", ["blocking", "deferred"])
def test_a_surrogate_loop_hands_no_loss_and_is_judged_on_its_metrics(sync: str) -> None:
    """A GRPO loop passes `None` for its surrogate loss: no loss event on a level that means
    nothing, and its dead rewards are told at the step the streak reaches 5, deferred too."""
    setup = make_setup(warmup=0)
    optimizer = torch.optim.AdamW(setup.model.parameters(), lr=1e-3, fused=sync == "deferred")
    guard = Guard(setup.model, optimizer, config=GuardConfig(sync=sync, **QUIET))
    for _ in range(8):
        surrogate = setup.model.loss(setup.batch()) * 1e-9  # near 0, as GRPO's is
        surrogate.backward()
        guard.step(None, metrics={"reward": torch.tensor(0.0), "reward_std": 0.0,
                                  "frac_reward_zero_std": torch.tensor(1.0)})
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    assert [(e.step, e.kind) for e in guard.events if e.severity != "info"] == [
        (4, "reward_dead")]
