"""The driver shared by the framework callbacks, run by hand the way a trainer runs it."""

from __future__ import annotations

import copy
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from lightning.pytorch.core.optimizer import LightningOptimizer

from trainguard import GuardConfig, TrainingDiverged, UsageError, load_snapshot
from trainguard.integrations import scale_learning_rate
from trainguard.integrations._driver import (
    ScheduleRewind,
    StepDriver,
    callback_config,
    unwrap_optimizer,
)

from ..conftest import Setup, make_setup

QUIET = {"console": False}


def lambda_setup() -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    param = torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.SGD([param], lr=0.1)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 / (1 + s))


def advance(optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler,
            ) -> None:
    optimizer.step()  # no gradients: changes nothing, but keeps the scheduler's order check quiet
    scheduler.step()


def lrs(optimizer: torch.optim.Optimizer) -> list[float]:
    return [float(g["lr"]) for g in optimizer.param_groups]


def trainer_step(driver: StepDriver, setup: Setup, loss: torch.Tensor) -> None:
    """What a trainer does around its optimizer step, with the driver's two calls."""
    loss.backward()
    driver.before_step(loss)
    setup.optimizer.step()
    if setup.scheduler is not None:
        setup.scheduler.step()
    driver.after_step()
    setup.optimizer.zero_grad(set_to_none=True)


def test_schedule_rewind_undoes_a_scheduler_step() -> None:
    optimizer, scheduler = lambda_setup()
    advance(optimizer, scheduler)
    before = (copy.deepcopy(scheduler.state_dict()), lrs(optimizer))
    rewind = ScheduleRewind(optimizer, [scheduler])
    rewind.remember()
    advance(optimizer, scheduler)
    assert lrs(optimizer) != before[1]
    rewind.restore()
    assert lrs(optimizer) == before[1]
    assert scheduler.state_dict() == before[0]
    advance(optimizer, scheduler)  # the schedule goes on from where it was
    assert lrs(optimizer) == pytest.approx([0.1 / 3])


def test_schedule_rewind_restores_a_tensor_learning_rate_in_place() -> None:
    param = torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.Adam([param], lr=torch.tensor(0.01))
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    lr_tensor = optimizer.param_groups[0]["lr"]
    rewind = ScheduleRewind(optimizer, [scheduler])
    rewind.remember()
    advance(optimizer, scheduler)
    rewind.restore()
    assert optimizer.param_groups[0]["lr"] is lr_tensor
    assert float(lr_tensor) == pytest.approx(0.01)


def test_scale_learning_rate_survives_the_next_lambda_step() -> None:
    optimizer, scheduler = lambda_setup()
    advance(optimizer, scheduler)
    scale_learning_rate(optimizer, [scheduler], 0.5)
    assert lrs(optimizer) == pytest.approx([0.5 * 0.1 / 2])
    advance(optimizer, scheduler)
    assert lrs(optimizer) == pytest.approx([0.5 * 0.1 / 3])

    unscaled_optimizer, unscaled = lambda_setup()
    advance(unscaled_optimizer, unscaled)
    unscaled_optimizer.param_groups[0]["lr"] *= 0.5  # what a naive change does
    advance(unscaled_optimizer, unscaled)
    assert lrs(unscaled_optimizer) == pytest.approx([0.1 / 3]), "LambdaLR undid the change"


@pytest.mark.parametrize("factor", [0.0, -1.0, math.nan, math.inf, True, "0.5"])
def test_scale_learning_rate_rejects_bad_factors(factor: object) -> None:
    optimizer, scheduler = lambda_setup()
    with pytest.raises(UsageError, match="factor"):
        scale_learning_rate(optimizer, [scheduler], factor)  # type: ignore[arg-type]


def test_unwrap_optimizer_finds_the_torch_optimizer_inside_framework_wrappers(
        fresh_accelerate: None) -> None:
    optimizer, _ = lambda_setup()
    assert unwrap_optimizer(optimizer) is optimizer
    prepared = Accelerator(cpu=True).prepare(optimizer)
    assert prepared is not optimizer
    assert unwrap_optimizer(prepared) is optimizer
    assert unwrap_optimizer(LightningOptimizer(optimizer)) is optimizer
    with pytest.raises(UsageError, match=r"torch\.optim\.Optimizer"):
        unwrap_optimizer(object())


def test_callback_config_validates() -> None:
    assert callback_config(None) == GuardConfig()
    config = GuardConfig(policy="halt")
    assert callback_config(config) is config
    with pytest.raises(UsageError, match="GuardConfig"):
        callback_config({"policy": "halt"})
    with pytest.raises(UsageError, match="recover"):
        callback_config(GuardConfig(policy="recover"))


def test_skipped_step_leaves_weights_optimizer_and_schedule_untouched() -> None:
    setup = make_setup()
    driver = StepDriver(setup.model, setup.optimizer, config=GuardConfig(**QUIET),
                        schedulers=[setup.scheduler])
    for _ in range(3):
        trainer_step(driver, setup, setup.model.loss(setup.batch()))
    weights = copy.deepcopy(setup.model.state_dict())
    state = copy.deepcopy(setup.optimizer.state_dict())
    lr = lrs(setup.optimizer)
    schedule = copy.deepcopy(setup.scheduler.state_dict())

    loss = setup.model.loss(setup.batch()) * float("nan")
    loss.backward()
    decision = driver.before_step(loss)
    assert decision is not None and decision.action == "skipped"
    assert all(p.grad is None for p in setup.model.parameters())
    setup.optimizer.step()  # the trainer steps anyway: nothing to apply
    setup.scheduler.step()
    report = driver.after_step()

    assert report is not None and report.step == 3 and report.action == "skipped"
    for name, value in setup.model.state_dict().items():
        assert torch.equal(value, weights[name]), name
    assert setup.optimizer.state_dict()["state"].keys() == state["state"].keys()
    for key, entry in setup.optimizer.state_dict()["state"].items():
        for name, value in entry.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(state["state"][key][name]))
    assert lrs(setup.optimizer) == lr
    assert setup.scheduler.state_dict() == schedule
    assert driver.after_step() is None, "one report per checked step"
    driver.close()


def test_a_monitoring_failure_leaves_the_step_to_the_trainer_clipped() -> None:
    setup = make_setup(warmup=0)
    driver = StepDriver(setup.model, setup.optimizer,
                        config=GuardConfig(max_grad_norm=1e-3, **QUIET))
    loss = setup.model.loss(setup.batch())
    loss.backward()
    setup.optimizer.param_groups[0]["lr"] = "not a number"  # measure() cannot read it
    assert driver.before_step(loss) is None
    total = torch.linalg.vector_norm(
        torch.stack([p.grad.norm() for p in setup.model.parameters()]))
    assert float(total) == pytest.approx(1e-3, rel=1e-3)
    assert [e.kind for e in driver.events] == ["monitor_error"]
    assert driver.after_step() is None
    assert driver.engine.step == 1
    driver.close()


def test_halt_writes_a_snapshot_from_before_the_update(tmp_path: Path) -> None:
    setup = make_setup()
    driver = StepDriver(setup.model, setup.optimizer, run_dir=tmp_path,
                        config=GuardConfig(policy="halt", **QUIET), schedulers=[setup.scheduler])
    trainer_step(driver, setup, setup.model.loss(setup.batch()))
    weights = copy.deepcopy(setup.model.state_dict())
    batch = setup.batch()
    loss = setup.model.loss(batch) * float("inf")
    loss.backward()
    with pytest.raises(TrainingDiverged) as caught:
        driver.before_step(loss, batch=batch)
    assert caught.value.snapshot_path == str(tmp_path / "crash_step1.pt")
    snapshot = load_snapshot(tmp_path / "crash_step1.pt")
    assert snapshot["step"] == 1
    assert torch.equal(snapshot["batch"], batch)
    for name, value in snapshot["model"].items():
        assert torch.equal(value, weights[name]), name
    assert all(p.grad is None for p in setup.model.parameters())
    assert driver.engine.closed
    with pytest.raises(UsageError, match="closed"):
        driver.before_step(loss)


def test_importing_the_integrations_package_imports_no_framework() -> None:
    code = ("import sys, trainguard.integrations; "
            "print(sorted(m for m in ('transformers', 'lightning', 'pytorch_lightning') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == "[]"
