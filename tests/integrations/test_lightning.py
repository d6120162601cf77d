"""TrainguardCallback driving real Lightning Trainers, under both Lightning namespaces."""

from __future__ import annotations

import importlib
import math
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from torch import nn

from tests.diffusion_models import tiny_unet
from trainguard import GuardConfig, RecoveryConfig, RunReader, TrainingDiverged, UsageError
from trainguard.events import StepReport
from trainguard.lightning import NAMESPACES, TrainguardCallback
from trainguard.sinks import Sink

QUIET = {"sinks": {"console": False}}
LR = 1e-2


class Recorder(Sink):
    def __init__(self) -> None:
        self.reports: list[StepReport] = []

    def on_step(self, report: StepReport) -> None:
        self.reports.append(report)


@pytest.fixture(params=["lightning.pytorch", "pytorch_lightning"])
def pl(request: pytest.FixtureRequest) -> ModuleType:
    if request.param not in NAMESPACES:
        pytest.skip(f"{request.param} is not installed")
    return importlib.import_module(request.param)


def regression_module(pl: ModuleType, *, poison_at: set[int] | None = None,
                      manual: bool = False) -> Any:
    """A small regression model; `poison_at` are micro-batch indices whose loss becomes NaN."""

    class Regression(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
            self.micro_losses: list[float] = []
            self.automatic_optimization = not manual

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            self.micro_losses.append(float(loss.detach()))
            if poison_at and len(self.micro_losses) - 1 in poison_at:
                loss = loss * float("nan")
            return loss

        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.AdamW(self.parameters(), lr=LR)
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 / (1 + s))
            return {"optimizer": optimizer,
                    "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    return Regression()


def loader(batches: int = 16) -> torch.utils.data.DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(8 * batches, 8, generator=generator)
    y = x.sum(1, keepdim=True)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)


def make_trainer(pl: ModuleType, tmp_path: Path, callback: Any, **overrides: Any) -> Any:
    options: dict[str, Any] = {
        "max_steps": 8, "accelerator": "cpu", "logger": False, "enable_checkpointing": False,
        "enable_progress_bar": False, "enable_model_summary": False,
        "default_root_dir": str(tmp_path), "callbacks": [callback]}
    options.update(overrides)
    return pl.Trainer(**options)


def all_finite(module: nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in module.parameters())


def test_one_class_is_a_callback_of_every_installed_namespace() -> None:
    callback = TrainguardCallback(GuardConfig(**QUIET))
    assert NAMESPACES, "at least one Lightning namespace is installed for these tests"
    for name in NAMESPACES:
        assert isinstance(callback, importlib.import_module(name).Callback)


def test_nan_step_is_detected_skipped_and_training_continues(pl: ModuleType,
                                                             tmp_path: Path) -> None:
    module = regression_module(pl, poison_at={3})
    recorder = Recorder()
    callback = TrainguardCallback(GuardConfig(**QUIET), sinks=[recorder])
    trainer = make_trainer(pl, tmp_path, callback)
    trainer.fit(module, loader())

    assert [r.step for r in recorder.reports] == list(range(8))
    assert recorder.reports[3].action == "skipped"
    assert math.isnan(recorder.reports[3].loss)
    assert {"nonfinite_loss", "nonfinite_grad"} <= {e.kind for e in callback.events}
    assert all(e.step == 3 for e in callback.events)
    grad_event = next(e for e in callback.events if e.kind == "nonfinite_grad")
    assert grad_event.param == "net.0.weight"
    assert all(r.action == "applied" for i, r in enumerate(recorder.reports) if i != 3)
    assert all_finite(module)
    # 8 optimizer steps, one skipped: the step-interval schedule advanced 7 times, not 8
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(LR / (1 + 7))
    assert recorder.reports[4].lr == pytest.approx(recorder.reports[3].lr)
    assert callback.run is not None and callback.run.closed


def test_without_the_callback_the_same_run_ends_with_nan_weights(pl: ModuleType,
                                                                 tmp_path: Path) -> None:
    module = regression_module(pl, poison_at={3})
    options = {"max_steps": 8, "accelerator": "cpu", "logger": False,
               "enable_checkpointing": False, "enable_progress_bar": False,
               "enable_model_summary": False, "default_root_dir": str(tmp_path)}
    pl.Trainer(**options).fit(module, loader())
    assert not all_finite(module)


def test_gradient_accumulation_checks_once_per_optimizer_step(pl: ModuleType,
                                                              tmp_path: Path) -> None:
    module = regression_module(pl, poison_at={5})  # second half of optimizer step 2
    recorder = Recorder()
    callback = TrainguardCallback(GuardConfig(**QUIET), sinks=[recorder])
    trainer = make_trainer(pl, tmp_path, callback, max_steps=4, accumulate_grad_batches=2)
    trainer.fit(module, loader())

    assert len(module.micro_losses) == 8
    assert [r.step for r in recorder.reports] == [0, 1, 2, 3]
    assert [r.action for r in recorder.reports] == ["applied", "applied", "skipped", "applied"]
    losses = module.micro_losses
    for step in (0, 1, 3):  # the loss Lightning minimises: the mean over the micro-batches
        expected = (losses[2 * step] + losses[2 * step + 1]) / 2
        assert recorder.reports[step].loss == pytest.approx(expected, rel=1e-5)
    assert all_finite(module)


def test_clipping_follows_the_trainer_gradient_clip_val(pl: ModuleType, tmp_path: Path) -> None:
    recorder = Recorder()
    callback = TrainguardCallback(GuardConfig(**QUIET), sinks=[recorder])
    trainer = make_trainer(pl, tmp_path, callback, max_steps=4, gradient_clip_val=0.1)
    trainer.fit(regression_module(pl), loader())
    assert callback.run is not None and callback.run.config.clip.max_grad_norm == 0.1
    assert all(r.grad_norm > 0.1 for r in recorder.reports)
    assert [r.action for r in recorder.reports] == ["clipped"] * 4
    assert [r.clip_coef for r in recorder.reports] == pytest.approx(
        [0.1 / (r.grad_norm + 1e-6) for r in recorder.reports])

    # without gradient_clip_val (Lightning's default: no clipping) the config's adaptive clip
    # applies, which leaves healthy steps alone; max_grad_norm=None turns it off
    for clip in ("auto", None):
        recorder = Recorder()
        callback = TrainguardCallback(GuardConfig(clip={"max_grad_norm": clip}, **QUIET),
                                      sinks=[recorder])
        make_trainer(pl, tmp_path, callback, max_steps=4).fit(regression_module(pl), loader())
        assert callback.run is not None and callback.run.config.clip.max_grad_norm == clip
        assert (callback.run.state.clip.adaptive is not None) == (clip == "auto")
        assert [r.action for r in recorder.reports] == ["applied"] * 4


def plain_trainer(pl: ModuleType, tmp_path: Path, **overrides: Any) -> Any:
    """`make_trainer` without any callback."""
    options: dict[str, Any] = {
        "max_steps": 8, "accelerator": "cpu", "logger": False, "enable_checkpointing": False,
        "enable_progress_bar": False, "enable_model_summary": False,
        "default_root_dir": str(tmp_path)}
    options.update(overrides)
    return pl.Trainer(**options)


@pytest.mark.parametrize("policy", ["observe", "protect"])
@pytest.mark.parametrize("clip", [None, 0.1])
def test_a_healthy_run_trains_exactly_as_the_trainer_alone(
        pl: ModuleType, tmp_path: Path, policy: str, clip: float | None) -> None:
    """Lightning's clipping as configured (none by default) is kept: the final weights are bit
    for bit those of the Trainer without the callback, and `gradient_clip_val` is given back."""
    options = {"max_steps": 12, "gradient_clip_val": clip}
    reference = regression_module(pl)
    plain_trainer(pl, tmp_path, **options).fit(reference, loader())
    module = regression_module(pl)
    callback = TrainguardCallback(GuardConfig(policy=policy, **QUIET))  # type: ignore[arg-type]
    trainer = make_trainer(pl, tmp_path, callback, **options)
    trainer.fit(module, loader())
    for (name, ours), theirs in zip(module.named_parameters(), reference.parameters(),
                                    strict=True):
        assert torch.equal(ours, theirs), name
    assert trainer.gradient_clip_val == clip


def test_a_module_that_clips_in_its_own_hook_keeps_its_clipping(pl: ModuleType,
                                                                tmp_path: Path) -> None:
    calls: list[Any] = []
    module = regression_module(pl)

    def configure_gradient_clipping(optimizer: Any, gradient_clip_val: Any = None,
                                    gradient_clip_algorithm: Any = None) -> None:
        calls.append(gradient_clip_val)
        module.clip_gradients(optimizer, gradient_clip_val=gradient_clip_val,
                              gradient_clip_algorithm=gradient_clip_algorithm)

    type(module).configure_gradient_clipping = (  # type: ignore[method-assign]
        lambda self, *a, **k: configure_gradient_clipping(*a, **k))
    callback = TrainguardCallback(GuardConfig(**QUIET))
    make_trainer(pl, tmp_path, callback, max_steps=3, gradient_clip_val=0.1).fit(module, loader())
    assert calls == [0.1] * 3
    assert callback.run is not None and callback.run.config.clip.max_grad_norm == "auto"


def test_state_round_trips_through_a_lightning_checkpoint(pl: ModuleType,
                                                          tmp_path: Path) -> None:
    first = TrainguardCallback(GuardConfig(**QUIET))
    trainer = make_trainer(pl, tmp_path, first, max_steps=6)
    trainer.fit(regression_module(pl), loader(batches=6))  # the checkpoint ends an epoch
    path = tmp_path / "last.ckpt"
    trainer.save_checkpoint(path)
    saved = first.state_dict()
    assert saved["step"] == 6
    stored = torch.load(path, weights_only=True)["callbacks"]["TrainguardCallback"]
    assert stored == saved

    second = TrainguardCallback(GuardConfig(**QUIET))
    recorder = Recorder()
    second.sinks.append(recorder)
    resumed = make_trainer(pl, tmp_path, second, max_steps=9)
    resumed.fit(regression_module(pl), loader(batches=6), ckpt_path=str(path))

    assert [r.step for r in recorder.reports] == [6, 7, 8]
    state = second.state_dict()
    assert state["step"] == 9
    for kind in ("grad_explosion", "loss_spike"):
        before = saved["detectors"][kind]["baseline"]["values"]
        after = state["detectors"][kind]["baseline"]["values"]
        assert len(before) == 6 and len(after) == 9
        assert after[:6] == before, f"the {kind} baseline was carried over"


def test_halt_policy_raises_through_fit(pl: ModuleType, tmp_path: Path) -> None:
    callback = TrainguardCallback(GuardConfig(policy="halt", **QUIET), run_dir=tmp_path / "run")
    trainer = make_trainer(pl, tmp_path, callback)
    with pytest.raises(TrainingDiverged) as caught:
        trainer.fit(regression_module(pl, poison_at={2}), loader())
    assert caught.value.report is not None and caught.value.report.step == 2
    assert caught.value.snapshot_path is not None and Path(caught.value.snapshot_path).is_file()
    assert callback.run is not None and callback.run.closed


def test_an_exception_in_fit_records_the_crash_and_its_type(pl: ModuleType,
                                                            tmp_path: Path) -> None:
    module = regression_module(pl)
    steps = module.training_step

    def failing_step(batch: Any, batch_idx: int) -> torch.Tensor:
        if batch_idx == 3:
            raise ValueError("a sample with no label")
        return steps(batch, batch_idx)

    module.training_step = failing_step
    callback = TrainguardCallback(GuardConfig(**QUIET), run_dir=tmp_path / "run")
    with pytest.raises(ValueError):
        make_trainer(pl, tmp_path, callback).fit(module, loader())
    with RunReader(tmp_path / "run") as reader:
        summary = reader.summary()
    assert summary["status"] == "crashed"
    assert summary["error"] == {"type": "ValueError", "message": "a sample with no label"}


def test_manual_optimization_is_a_clear_error(pl: ModuleType, tmp_path: Path) -> None:
    callback = TrainguardCallback(GuardConfig(**QUIET))
    trainer = make_trainer(pl, tmp_path, callback)
    with pytest.raises(UsageError, match="manual optimization"):
        trainer.fit(regression_module(pl, manual=True), loader())


def test_recover_policy_rolls_back_inside_fit(pl: ModuleType, tmp_path: Path) -> None:
    """Three NaN steps in a row: the state is restored, the LR backed off, training goes on."""
    module = regression_module(pl, poison_at={9, 10, 11})
    recorder = Recorder()
    config = GuardConfig(policy="recover", recovery=RecoveryConfig(ring_every=4, confirm_steps=1),
                         **QUIET)
    callback = TrainguardCallback(config, sinks=[recorder])
    trainer = make_trainer(pl, tmp_path, callback, max_steps=16)
    trainer.fit(module, loader())

    actions = [r.action for r in recorder.reports]
    assert actions[9:12] == ["skipped", "skipped", "rolled_back"]
    rollback = next(e for e in callback.events if e.kind == "rollback")
    assert rollback.details["to_step"] == 8
    assert all(a in ("applied", "clipped") for a in actions[12:])  # clipping now at 0.5
    assert all_finite(module)
    # the schedule stayed at its 9th step (the trainer's own scheduler steps of the skipped and
    # rolled-back steps were rewound), under a backoff ramping from x0.1: LambdaLR gives LR / 10,
    # under a ceiling below the highest LR of the undone updates (LR / 9, at step 8)
    ceiling = rollback.details["lr_ceiling"]
    assert ceiling == pytest.approx(config.recovery.lr_ceiling * LR / 9, rel=1e-6)
    assert recorder.reports[12].lr == pytest.approx(0.1 * min(LR / 10, ceiling), rel=1e-6)
    assert recorder.reports[15].lr < LR / 13


def test_bad_configs_are_clear_errors() -> None:
    with pytest.raises(UsageError, match="GuardConfig"):
        TrainguardCallback(config={"policy": "protect"})  # type: ignore[arg-type]


def test_validation_metrics_reach_trainguard_without_user_code(pl: ModuleType,
                                                              tmp_path: Path) -> None:
    module = regression_module(pl)

    def validation_step(batch: Any, batch_idx: int) -> None:
        x, y = batch
        module.log("val_loss", nn.functional.mse_loss(module.net(x), y))

    module.validation_step = validation_step  # type: ignore[method-assign]
    callback = TrainguardCallback(GuardConfig(sinks={"console": False},
                                              probes={"preflight": False}),
                                  run_dir=tmp_path / "run")
    trainer = make_trainer(pl, tmp_path, callback, val_check_interval=4,
                           num_sanity_val_steps=2)
    trainer.fit(module, loader(), loader(2))
    reader = RunReader(tmp_path / "run")
    evals = reader.meta()["eval"]
    reader.close()
    assert [e["step"] for e in evals] == [3, 7], "after 4 and 8 steps; not the sanity check"
    assert set(evals[0]["metrics"]) == {"val_loss"}


def test_fit_proves_its_halt_on_the_module_optimizer_and_batch(pl: ModuleType,
                                                              tmp_path: Path) -> None:
    """One NaN sample in batch 3: the replay without it heals the step, with the batch
    Lightning handed over (an (x, y) tuple)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(8 * 16, 8, generator=generator)
    x[8 * 3 + 5, 2] = float("nan")
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)

    def loss(module: Any, batch: Any) -> torch.Tensor:
        inputs, target = batch
        return nn.functional.mse_loss(module.net(inputs), target)

    callback = TrainguardCallback(GuardConfig(policy="halt", **QUIET), replay_fn=loss)
    trainer = make_trainer(pl, tmp_path, callback)
    with pytest.raises(TrainingDiverged):
        trainer.fit(regression_module(pl), data)
    proof = next(e for e in callback.events if e.kind == "proof")
    assert proof.step == 3 and list(proof.details["confirmed"]) == ["nonfinite_input"]
    assert "without the flagged sample 5" in proof.details["confirmed"]["nonfinite_input"]


def test_a_sample_fn_is_judged_and_leaves_the_training_as_it_was(pl: ModuleType,
                                                                  tmp_path: Path) -> None:
    """`sample_fn` under Lightning: the reference before the first update, then on its cadence,
    on the module being fit; the weights bit for bit those of the Trainer alone."""
    reference = regression_module(pl)
    plain_trainer(pl, tmp_path).fit(reference, loader())
    module = regression_module(pl)
    seen: list[Any] = []

    def surface(m: Any) -> torch.Tensor:
        seen.append(m)
        grid = torch.randn(64, 8)  # the global generator, on purpose
        return m.net(grid).reshape(1, 1, 8, 8)

    config = GuardConfig(probes={"samples_every": 4, "samples_budget": 1.0}, **QUIET)
    callback = TrainguardCallback(config, sample_fn=surface)
    make_trainer(pl, tmp_path, callback).fit(module, loader())
    for (name, ours), theirs in zip(module.named_parameters(), reference.parameters(),
                                    strict=True):
        assert torch.equal(ours, theirs), name
    assert len(seen) == 3 and all(m is module for m in seen)  # before step 0, after 3 and 7
    assert callback.samples is not None and callback.samples.shape == (1, 1, 8, 8)


def test_a_diffusion_target_the_scheduler_does_not_name_is_found(pl: ModuleType,
                                                                 tmp_path: Path) -> None:
    """`noise_scheduler` under Lightning: a module scoring its UNet against the velocity while
    its scheduler says epsilon is named at the first step; the same module on the noise is
    quiet."""
    diffusers = pytest.importorskip("diffusers")

    class Denoising(pl.LightningModule):  # type: ignore[name-defined,misc]
        def __init__(self, velocity: bool) -> None:
            super().__init__()
            self.unet = tiny_unet(channels=1)
            self.scheduler = diffusers.DDPMScheduler(num_train_timesteps=50)
            self.velocity = velocity

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            clean = batch[0][:, :1].reshape(-1, 1, 1, 1).expand(-1, 1, 8, 8).tanh()
            noise = torch.randn_like(clean)
            timesteps = torch.randint(0, 50, (clean.shape[0],))
            noisy = self.scheduler.add_noise(clean, noise, timesteps)
            target = (self.scheduler.get_velocity(clean, noise, timesteps) if self.velocity
                      else noise)
            return nn.functional.mse_loss(self.unet(noisy, timesteps).sample, target)

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    for velocity in (True, False):
        module = Denoising(velocity)
        callback = TrainguardCallback(GuardConfig(**QUIET),
                                      noise_scheduler=module.scheduler)
        make_trainer(pl, tmp_path, callback, max_steps=3).fit(module, loader())
        assert callback.run is not None
        found = [f.cause for f in callback.run.findings if f.check == "diffusion_target"]
        assert found == (["prediction_type_mismatch"] if velocity else [])
        assert "add_noise" not in vars(module.scheduler)


@pytest.mark.parametrize("bound", ["max_steps", "epochs"])
def test_a_one_cycle_shorter_than_the_fit_is_told_before_it_stops_it(pl: ModuleType,
                                                                     tmp_path: Path,
                                                                     bound: str) -> None:
    """The fit's length, from `max_steps` or from its epochs and the loader's length, against
    a OneCycleLR sized for fewer steps: told before the first step, as the fit then stops."""

    class OneCycle(regression_module(pl).__class__):  # type: ignore[misc]
        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.AdamW(self.parameters(), lr=LR)
            scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=LR, total_steps=10)
            return {"optimizer": optimizer,
                    "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    callback = TrainguardCallback(GuardConfig(**QUIET))
    length = {"max_steps": 24} if bound == "max_steps" else {"max_steps": -1, "max_epochs": 2}
    trainer = make_trainer(pl, tmp_path, callback, **length)
    with pytest.raises(ValueError, match="Tried to step 11 times"):
        trainer.fit(OneCycle(), loader(12))
    assert callback.run is not None
    [finding] = [f for f in callback.run.findings if f.check == "schedule_end"]
    assert "sized for 10 optimizer steps and the run takes 24" in finding.message
    assert "after 11 optimizer steps" in finding.message


def test_a_one_cycle_sized_as_lightning_says_is_not_told(pl: ModuleType, tmp_path: Path) -> None:
    """Lightning's own recipe, `total_steps=trainer.estimated_stepping_batches`, under a
    `max_steps` the epochs end before: the fit takes the epochs' steps."""

    class OneCycle(regression_module(pl).__class__):  # type: ignore[misc]
        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.AdamW(self.parameters(), lr=LR)
            scheduler = torch.optim.lr_scheduler.OneCycleLR(
                optimizer, max_lr=LR, total_steps=int(self.trainer.estimated_stepping_batches))
            return {"optimizer": optimizer,
                    "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    callback = TrainguardCallback(GuardConfig(**QUIET))
    make_trainer(pl, tmp_path, callback, max_steps=1000, max_epochs=2).fit(OneCycle(), loader(10))
    assert callback.run is not None
    assert [f for f in callback.run.findings if f.check == "schedule_end"] == []
