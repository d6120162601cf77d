"""TrainguardCallback driving real transformers.Trainer runs on a tiny GPT-2 (and a PEFT LoRA)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import peft
import pytest
import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from tests.diffusion_models import tiny_unet
from trainguard import (
    GuardConfig,
    RecoveryConfig,
    RunReader,
    TrainingDiverged,
    UsageError,
    load_snapshot,
)
from trainguard.events import ActionRecord, StepReport
from trainguard.hf import TrainguardCallback
from trainguard.sinks import Sink

QUIET = {"sinks": {"console": False}}


class Recorder(Sink):
    def __init__(self) -> None:
        self.reports: list[StepReport] = []
        self.actions: list[ActionRecord] = []

    def on_step(self, report: StepReport) -> None:
        self.reports.append(report)

    def on_action(self, action: ActionRecord) -> None:
        self.actions.append(action)


class PoisonForward:
    """Forward hook on a module: multiplies its output by NaN on chosen training forwards."""

    def __init__(self, module: nn.Module, at: set[int]) -> None:
        self.at = at
        self.calls = 0
        module.register_forward_hook(self)

    def __call__(self, module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor | None:
        if not module.training:
            return None
        index, self.calls = self.calls, self.calls + 1
        return output * float("nan") if index in self.at else None


def tiny_gpt2(seed: int = 0) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config)


def token_data(n: int = 64, length: int = 16, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    items = []
    for _ in range(n):
        ids = torch.randint(0, 64, (length,), generator=generator)
        items.append({"input_ids": ids, "labels": ids.clone()})
    return items


def make_args(tmp_path: Path, **overrides: Any) -> TrainingArguments:
    options: dict[str, Any] = {
        "output_dir": str(tmp_path / "out"), "per_device_train_batch_size": 4, "max_steps": 8,
        "learning_rate": 1e-3, "report_to": "none", "save_strategy": "no", "logging_steps": 1,
        "use_cpu": True, "disable_tqdm": True, "seed": 0}
    options.update(overrides)
    return TrainingArguments(**options)


def all_finite(model: nn.Module) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


def trainer_losses(trainer: Trainer) -> list[float]:
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def test_nan_step_is_detected_skipped_and_training_continues(tmp_path: Path) -> None:
    model = tiny_gpt2()
    PoisonForward(model.transformer.wte, at={5})
    recorder = Recorder()
    callback = TrainguardCallback(GuardConfig(**QUIET), sinks=[recorder])
    args = make_args(tmp_path)
    trainer = Trainer(model=model, args=args, train_dataset=token_data(), callbacks=[callback])
    trainer.train()

    assert [r.step for r in recorder.reports] == list(range(8))
    bad = recorder.reports[5]
    assert bad.action == "skipped"
    assert math.isnan(bad.loss), "the loss comes from the model output, not the Trainer's log"
    assert {"nonfinite_loss", "nonfinite_grad"} <= {e.kind for e in bad.events}
    assert all(e.step == 5 for e in callback.events)
    assert all(r.action in ("applied", "clipped") for i, r in enumerate(recorder.reports) if i != 5)
    assert all(math.isfinite(r.loss) for i, r in enumerate(recorder.reports) if i != 5)
    assert all_finite(model)
    # the scheduler was rewound: the step after the skip runs at the skipped step's LR
    assert recorder.reports[6].lr == pytest.approx(recorder.reports[5].lr)
    assert recorder.reports[5].lr < recorder.reports[4].lr
    # the Trainer gets its clipping setting back
    assert args.max_grad_norm == 1.0
    assert callback.run is not None and callback.run.closed


def test_recover_policy_rolls_the_trainer_back_and_training_goes_on(tmp_path: Path) -> None:
    model = tiny_gpt2()
    PoisonForward(model.transformer.wte, at={9, 10, 11})
    recorder = Recorder()
    config = GuardConfig(policy="recover", recovery=RecoveryConfig(ring_every=4, confirm_steps=1),
                         **QUIET)
    callback = TrainguardCallback(config, sinks=[recorder])
    args = make_args(tmp_path, max_steps=16, lr_scheduler_type="constant")
    trainer = Trainer(model=model, args=args, train_dataset=token_data(), callbacks=[callback])
    trainer.train()

    actions = [r.action for r in recorder.reports]
    assert actions[9:12] == ["skipped", "skipped", "rolled_back"]
    rollback = next(e for e in callback.events if e.kind == "rollback")
    assert rollback.details["to_step"] == 8
    assert all(a in ("applied", "clipped") for a in actions[12:])
    assert all(math.isfinite(r.loss) for r in recorder.reports[12:])
    assert all_finite(model)
    # backed off to x0.1 of the constant LR under the ceiling (below the LR in force when the
    # NaNs began), ramping back one step at a time
    ceiling = rollback.details["lr_ceiling"]
    assert ceiling == pytest.approx(config.recovery.lr_ceiling * 1e-3)
    assert recorder.reports[12].lr == pytest.approx(0.1 * ceiling)
    assert 0.1 * ceiling < recorder.reports[15].lr < ceiling
    assert callback.run is not None and callback.run.state.clip.fixed_limit == 0.5


def test_the_same_run_without_the_callback_ends_with_nan_weights(tmp_path: Path) -> None:
    model = tiny_gpt2()
    PoisonForward(model.transformer.wte, at={5})
    trainer = Trainer(model=model, args=make_args(tmp_path), train_dataset=token_data())
    trainer.train()

    assert not all_finite(model)
    # with logging_nan_inf_filter (the default) the Trainer logs only finite losses meanwhile
    assert len(trainer_losses(trainer)) == 8
    assert all(math.isfinite(loss) for loss in trainer_losses(trainer))


def test_clipping_is_taken_over_at_the_trainer_limit(tmp_path: Path) -> None:
    """trainguard clips where the Trainer would have: same limit, same weights."""
    reference = tiny_gpt2()
    Trainer(model=reference, args=make_args(tmp_path, max_grad_norm=0.5, max_steps=6),
            train_dataset=token_data()).train()

    model = tiny_gpt2()
    recorder = Recorder()
    callback = TrainguardCallback(GuardConfig(clip={"max_grad_norm": 3.0}, **QUIET),
                                  sinks=[recorder])
    args = make_args(tmp_path, max_grad_norm=0.5, max_steps=6)
    trainer = Trainer(model=model, args=args, train_dataset=token_data(), callbacks=[callback])
    trainer.train()

    assert args.max_grad_norm == 0.5
    assert callback.run is not None and callback.run.config.clip.max_grad_norm == 0.5
    norms = [h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h]
    assert [r.grad_norm for r in recorder.reports] == pytest.approx(norms, rel=1e-5)
    assert all(r.grad_norm > 0.5 and r.action == "clipped" for r in recorder.reports)
    assert [r.clip_coef for r in recorder.reports] == pytest.approx(
        [0.5 / (n + 1e-6) for n in norms], rel=1e-6)
    for (name, ours), theirs in zip(model.named_parameters(), reference.parameters(),
                                    strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("policy", ["observe", "protect"])
@pytest.mark.parametrize("max_grad_norm", [None, 0.0, 0.5])
def test_a_healthy_run_trains_exactly_as_the_trainer_alone(
        tmp_path: Path, policy: str, max_grad_norm: float | None) -> None:
    """The Trainer's clipping as configured (its default 1.0 included, `None` here) is kept:
    the final weights are bit for bit those of the Trainer without the callback."""
    clip = {} if max_grad_norm is None else {"max_grad_norm": max_grad_norm}
    reference = tiny_gpt2()
    Trainer(model=reference, args=make_args(tmp_path, max_steps=12, learning_rate=1e-2, **clip),
            train_dataset=token_data()).train()
    model = tiny_gpt2()
    recorder = Recorder()
    callback = TrainguardCallback(GuardConfig(policy=policy, **QUIET),  # type: ignore[arg-type]
                                  sinks=[recorder])
    args = make_args(tmp_path, max_steps=12, learning_rate=1e-2, **clip)
    Trainer(model=model, args=args, train_dataset=token_data(), callbacks=[callback]).train()
    for (name, ours), theirs in zip(model.named_parameters(), reference.parameters(),
                                    strict=True):
        assert torch.equal(ours, theirs), name
    assert args.max_grad_norm == (1.0 if max_grad_norm is None else max_grad_norm)
    if max_grad_norm is None:  # clipped at the Trainer's 1.0 wherever the norm is above it
        assert [r.action for r in recorder.reports] == [
            "clipped" if r.grad_norm > 1.0 else "applied" for r in recorder.reports]
        assert any(r.action == "clipped" for r in recorder.reports)
        takeover = [a for a in recorder.actions if a.kind == "clip_takeover"]
        assert len(takeover) == 1 and "as the Trainer would" in takeover[0].message


def test_the_config_limit_replaces_the_trainers_default_only_when_set(tmp_path: Path) -> None:
    """A number in the config replaces the Trainer's default 1.0 (not chosen there)."""
    recorder = Recorder()
    callback = TrainguardCallback(GuardConfig(clip={"max_grad_norm": 4.0}, **QUIET),
                                  sinks=[recorder])
    Trainer(model=tiny_gpt2(), args=make_args(tmp_path, max_steps=4),
            train_dataset=token_data(), callbacks=[callback]).train()
    assert callback.run is not None and callback.run.config.clip.max_grad_norm == 4.0
    for report in recorder.reports:
        expected = 1.0 if report.grad_norm <= 4.0 else 4.0 / (report.grad_norm + 1e-6)
        assert report.clip_coef == pytest.approx(expected)


def test_a_fixed_clip_at_the_trainers_default_when_the_config_asks(tmp_path: Path) -> None:
    recorder = Recorder()
    callback = TrainguardCallback(GuardConfig(clip={"max_grad_norm": 1.0}, **QUIET),
                                  sinks=[recorder])
    Trainer(model=tiny_gpt2(), args=make_args(tmp_path, max_steps=4),
            train_dataset=token_data(), callbacks=[callback]).train()
    assert callback.run is not None and callback.run.config.clip.max_grad_norm == 1.0
    assert all(r.action == "clipped" and r.clip_coef == pytest.approx(1 / (r.grad_norm + 1e-6))
               for r in recorder.reports)


def test_where_the_trainer_does_not_clip_the_config_applies(tmp_path: Path) -> None:
    """`max_grad_norm=0`: nothing is taken over; the config's limit applies (by default the
    adaptive clip, which leaves healthy steps alone; None: no clipping at all)."""
    for clip in ("auto", None):
        recorder = Recorder()
        callback = TrainguardCallback(GuardConfig(clip={"max_grad_norm": clip}, **QUIET),
                                      sinks=[recorder])
        args = make_args(tmp_path, max_grad_norm=0.0, max_steps=3, learning_rate=1e-2)
        Trainer(model=tiny_gpt2(), args=args, train_dataset=token_data(),
                callbacks=[callback]).train()
        assert callback.run is not None and callback.run.config.clip.max_grad_norm == clip
        assert [r.action for r in recorder.reports] == ["applied"] * 3
        assert not [a for a in recorder.actions if a.kind == "clip_takeover"]
        assert args.max_grad_norm == 0.0


class PlainLoss(nn.Module):
    """A model whose forward takes no **kwargs: the Trainer averages its micro-batch losses."""

    def __init__(self) -> None:
        super().__init__()
        self.gpt = tiny_gpt2()

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": self.gpt(input_ids=input_ids, labels=labels).loss}


@pytest.mark.parametrize("kind", ["token_normalised", "averaged"])
def test_gradient_accumulation_checks_once_per_optimizer_step(tmp_path: Path, kind: str) -> None:
    model: nn.Module = tiny_gpt2() if kind == "token_normalised" else PlainLoss()
    embedding = model.transformer.wte if kind == "token_normalised" else model.gpt.transformer.wte
    poison = PoisonForward(embedding, at={5})  # micro-batch 5 = second half of optimizer step 2
    recorder = Recorder()
    callback = TrainguardCallback(GuardConfig(**QUIET), sinks=[recorder])
    args = make_args(tmp_path, gradient_accumulation_steps=2, max_steps=4)
    trainer = Trainer(model=model, args=args, train_dataset=token_data(), callbacks=[callback])
    trainer.train()

    assert poison.calls == 8
    assert [r.step for r in recorder.reports] == [0, 1, 2, 3]
    assert [r.action for r in recorder.reports][2] == "skipped"
    assert all(e.step == 2 for e in callback.events)
    # the reported loss is the step's accumulated loss, the one the Trainer logs
    logged = trainer_losses(trainer)
    for i in (0, 1, 3):
        assert recorder.reports[i].loss == pytest.approx(logged[i], rel=1e-5)
    assert all_finite(model)


def test_halt_policy_writes_a_snapshot_and_raises(tmp_path: Path) -> None:
    model = tiny_gpt2()
    PoisonForward(model.transformer.wte, at={3})
    callback = TrainguardCallback(GuardConfig(policy="halt", **QUIET), run_dir=tmp_path / "run")
    args = make_args(tmp_path)
    trainer = Trainer(model=model, args=args, train_dataset=token_data(), callbacks=[callback])
    with pytest.raises(TrainingDiverged) as caught:
        trainer.train()

    assert caught.value.report is not None and caught.value.report.step == 3
    assert caught.value.snapshot_path is not None
    snapshot = load_snapshot(caught.value.snapshot_path)
    assert snapshot["step"] == 3
    assert tuple(snapshot["batch"]["input_ids"].shape) == (4, 16)
    assert all(torch.isfinite(v).all() for v in snapshot["model"].values()
               if v.is_floating_point())
    assert args.max_grad_norm == 1.0, "the Trainer's clipping is given back on halt too"
    reader = RunReader(tmp_path / "run")
    assert reader.meta()["status"] == "halted"
    assert reader.meta()["integration"] == "transformers.Trainer"
    reader.close()


def test_run_store_records_every_step(tmp_path: Path) -> None:
    callback = TrainguardCallback(GuardConfig(**QUIET), run_dir=tmp_path / "run")
    Trainer(model=tiny_gpt2(), args=make_args(tmp_path, max_steps=4), train_dataset=token_data(),
            callbacks=[callback]).train()
    reader = RunReader(tmp_path / "run")
    assert [s["step"] for s in reader.steps()] == [0, 1, 2, 3]
    assert reader.meta()["status"] == "finished"
    reader.close()


class FailingForward:
    """Forward hook on a module: raises on the chosen training forward (a data or device error
    the Trainer does not catch)."""

    def __init__(self, module: nn.Module, at: int) -> None:
        self.at = at
        self.calls = 0
        module.register_forward_hook(self)

    def __call__(self, module: nn.Module, args: Any, output: torch.Tensor) -> None:
        self.calls += 1
        if self.calls - 1 == self.at:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")


def test_a_close_in_finally_after_the_trainer_raised_records_the_crash(tmp_path: Path) -> None:
    model = tiny_gpt2()
    FailingForward(model.transformer.wte, at=3)
    callback = TrainguardCallback(GuardConfig(**QUIET), run_dir=tmp_path / "run")
    trainer = Trainer(model=model, args=make_args(tmp_path), train_dataset=token_data(),
                      callbacks=[callback])
    with pytest.raises(RuntimeError):
        try:
            trainer.train()
        finally:
            callback.close()
    with RunReader(tmp_path / "run") as reader:
        summary = reader.summary()
    assert summary["status"] == "crashed"
    assert summary["error"] == {"type": "RuntimeError", "message": "CUDA error: an illegal "
                                                                   "memory access was encountered"}


def test_peft_lora_names_adapter_parameters_and_watches_only_them(tmp_path: Path) -> None:
    base = tiny_gpt2()
    frozen_before = {n: p.detach().clone() for n, p in base.named_parameters()}
    model = peft.get_peft_model(base, peft.LoraConfig(
        r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["c_attn"], fan_in_fan_out=True,
        task_type="CAUSAL_LM"))
    PoisonForward(base.transformer.wte, at={3})
    recorder = Recorder()
    callback = TrainguardCallback(GuardConfig(**QUIET), sinks=[recorder])
    trainer = Trainer(model=model, args=make_args(tmp_path, max_steps=6),
                      train_dataset=token_data(), callbacks=[callback])
    trainer.train()

    assert callback.run is not None
    watched = callback.run.watched.names
    assert len(watched) == 4
    assert all(("lora_A" in n or "lora_B" in n) for n in watched)
    assert recorder.reports[3].action == "skipped"
    grad_event = next(e for e in callback.events if e.kind == "nonfinite_grad")
    assert grad_event.step == 3
    assert grad_event.param is not None and "lora_A" in grad_event.param
    assert grad_event.details["params"] == watched
    assert "lora_" in grad_event.message
    assert all_finite(model)
    for name, param in base.named_parameters():
        if "lora_" not in name:
            assert torch.equal(param, frozen_before[name.replace("base_layer.", "")]), name


def test_bad_config_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="GuardConfig"):
        TrainguardCallback(config={"policy": "protect"})  # type: ignore[arg-type]


def test_resumed_training_continues_the_step_count_and_the_baselines(tmp_path: Path) -> None:
    first = TrainguardCallback(GuardConfig(**QUIET))
    args = make_args(tmp_path, max_steps=4, save_strategy="steps", save_steps=4)
    Trainer(model=tiny_gpt2(), args=args, train_dataset=token_data(),
            callbacks=[first]).train()
    saved = first.state_dict()
    assert saved["step"] == 4
    checkpoint = tmp_path / "out" / "checkpoint-4"
    assert checkpoint.is_dir()

    # the Trainer's own checkpoint: the step count follows its global step
    recorder = Recorder()
    plain = TrainguardCallback(GuardConfig(**QUIET), sinks=[recorder])
    Trainer(model=tiny_gpt2(), args=make_args(tmp_path, max_steps=6), train_dataset=token_data(),
            callbacks=[plain]).train(resume_from_checkpoint=str(checkpoint))
    assert [r.step for r in recorder.reports] == [4, 5]

    # with the guard's state restored too, the detectors keep their baselines
    restored = TrainguardCallback(GuardConfig(**QUIET))
    restored.load_state_dict(saved)
    assert restored.state_dict() == saved
    Trainer(model=tiny_gpt2(), args=make_args(tmp_path, max_steps=6), train_dataset=token_data(),
            callbacks=[restored]).train(resume_from_checkpoint=str(checkpoint))
    values = restored.state_dict()["detectors"]["loss_spike"]["baseline"]["values"]
    assert len(values) == 6
    assert values[:4] == saved["detectors"]["loss_spike"]["baseline"]["values"]


def test_a_second_train_call_keeps_the_baselines_and_gives_clipping_back(tmp_path: Path) -> None:
    recorder = Recorder()
    callback = TrainguardCallback(GuardConfig(**QUIET), sinks=[recorder])
    args = make_args(tmp_path, max_steps=3, max_grad_norm=0.7)
    trainer = Trainer(model=tiny_gpt2(), args=args, train_dataset=token_data(),
                      callbacks=[callback])
    trainer.train()
    first = callback.state_dict()
    trainer.train()

    assert args.max_grad_norm == 0.7
    assert callback.run is not None and callback.run.config.clip.max_grad_norm == 0.7
    assert [r.step for r in recorder.reports] == [0, 1, 2, 3, 4, 5]
    values = callback.state_dict()["detectors"]["loss_spike"]["baseline"]["values"]
    assert values[:3] == first["detectors"]["loss_spike"]["baseline"]["values"]


def test_evaluation_metrics_reach_trainguard_without_user_code(tmp_path: Path) -> None:
    callback = TrainguardCallback(GuardConfig(**QUIET), run_dir=tmp_path / "run")
    args = make_args(tmp_path, max_steps=8, eval_strategy="steps", eval_steps=4,
                     per_device_eval_batch_size=4)
    Trainer(model=tiny_gpt2(), args=args, train_dataset=token_data(),
            eval_dataset=token_data(8, seed=1), callbacks=[callback]).train()
    reader = RunReader(tmp_path / "run")
    evals = reader.meta()["eval"]
    reader.close()
    assert [e["step"] for e in evals] == [3, 7]
    assert all(math.isfinite(e["metrics"]["eval_loss"]) for e in evals)


def test_the_trainer_proves_its_halt_and_a_transient_nan_is_not_reproducible(
        tmp_path: Path) -> None:
    """The NaN comes from one forward only (a flaky op): replayed with the Trainer's model,
    optimizer and batch, the step is healthy."""
    from trainguard.hf import model_loss

    model = tiny_gpt2()
    PoisonForward(model.transformer.wte, at={3})
    callback = TrainguardCallback(GuardConfig(policy="halt", **QUIET), run_dir=tmp_path / "run",
                                  replay_fn=model_loss)
    trainer = Trainer(model=model, args=make_args(tmp_path), train_dataset=token_data(),
                      callbacks=[callback])
    with pytest.raises(TrainingDiverged) as caught:
        trainer.train()
    proof = next(e for e in callback.events if e.kind == "proof")
    assert proof.step == 3 and not proof.details["reproduced"]
    assert "not reproducible" in proof.message
    assert any(e["kind"] == "proof" for e in load_snapshot(caught.value.snapshot_path)["events"])


def test_a_layer_unfrozen_mid_run_that_the_trainers_optimizer_lacks_is_a_warning(
        tmp_path: Path) -> None:
    """The Trainer builds its optimizer from the parameters trainable at the start: the
    embedding a callback unfreezes at step 10 is computed gradients that never train it."""
    from transformers import TrainerCallback

    class Unfreeze(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                          **kwargs: Any) -> None:
            if state.global_step == 10:
                model.transformer.wte.weight.requires_grad_(True)

    model = tiny_gpt2()
    model.transformer.wte.weight.requires_grad_(False)
    frozen = model.transformer.wte.weight.detach().clone()
    callback = TrainguardCallback(GuardConfig(probes={"sample_every": 10}, **QUIET))
    trainer = Trainer(model=model, args=make_args(tmp_path, max_steps=25),
                      train_dataset=token_data(), callbacks=[Unfreeze(), callback])
    trainer.train()
    assert torch.equal(model.transformer.wte.weight, frozen)  # it never trained
    assert callback.run is not None
    [unheld] = [f for f in callback.run.findings if f.check == "unheld_params"]
    assert unheld.severity == "warning" and unheld.evidence == {
        "params": ["transformer.wte.weight"], "step": 10}
    assert not [e for e in callback.events if e.severity != "info"]  # no trouble: a finding


def test_a_sample_fn_is_judged_and_kept_and_leaves_the_training_as_it_was(
        tmp_path: Path) -> None:
    """`sample_fn` under the Trainer: called with the Trainer's model before the first update
    (the reference) and then on its cadence, its samples kept in the run store, and the
    training bit for bit that of the Trainer alone (the sampler draws from the global RNG)."""
    reference = tiny_gpt2()
    Trainer(model=reference, args=make_args(tmp_path, max_steps=8),
            train_dataset=token_data()).train()
    model = tiny_gpt2()
    seen: list[nn.Module] = []

    def token_heatmap(m: nn.Module) -> torch.Tensor:
        seen.append(m)
        prompt = torch.randint(0, 64, (2, 8))  # the global generator, on purpose
        return m(input_ids=prompt).logits.softmax(-1).unsqueeze(1)  # 2 x 1 x 8 x 64 "images"

    config = GuardConfig(probes={"samples_every": 3, "samples_budget": 1.0}, **QUIET)
    callback = TrainguardCallback(config, run_dir=tmp_path / "run", sample_fn=token_heatmap)
    Trainer(model=model, args=make_args(tmp_path, max_steps=8), train_dataset=token_data(),
            callbacks=[callback]).train()
    for (name, ours), theirs in zip(model.named_parameters(), reference.parameters(),
                                    strict=True):
        assert torch.equal(ours, theirs), name
    assert seen and all(m is model for m in seen) and model.training
    assert callback.samples is not None and callback.samples.shape == (2, 1, 8, 64)
    with RunReader(tmp_path / "run") as reader:
        kept = reader.meta()["samples"]
    assert [s["step"] for s in kept] == [-1, 2, 5]
    assert kept[0]["first"] and not any(s["degraded"] for s in kept)


def test_a_diffusion_target_the_scheduler_does_not_name_is_found(tmp_path: Path) -> None:
    """`noise_scheduler` under the Trainer: a model whose forward scores its UNet against the
    velocity while the scheduler says epsilon is named at the first step; on the noise, quiet."""
    diffusers = pytest.importorskip("diffusers")

    class Denoising(nn.Module):
        def __init__(self, velocity: bool) -> None:
            super().__init__()
            self.unet = tiny_unet(channels=1)
            self.scheduler = diffusers.DDPMScheduler(num_train_timesteps=50)
            self.velocity = velocity

        def forward(self, pixel_values: torch.Tensor) -> dict[str, torch.Tensor]:
            noise = torch.randn_like(pixel_values)
            timesteps = torch.randint(0, 50, (pixel_values.shape[0],))
            noisy = self.scheduler.add_noise(pixel_values, noise, timesteps)
            target = (self.scheduler.get_velocity(pixel_values, noise, timesteps)
                      if self.velocity else noise)
            return {"loss": nn.functional.mse_loss(self.unet(noisy, timesteps).sample, target)}

    generator = torch.Generator().manual_seed(0)
    images = [{"pixel_values": torch.rand(1, 8, 8, generator=generator) * 2 - 1}
              for _ in range(32)]
    for velocity in (True, False):
        model = Denoising(velocity)
        callback = TrainguardCallback(GuardConfig(**QUIET), noise_scheduler=model.scheduler)
        Trainer(model=model, args=make_args(tmp_path, max_steps=3), train_dataset=images,
                callbacks=[callback]).train()
        assert callback.run is not None
        found = [f.cause for f in callback.run.findings if f.check == "diffusion_target"]
        assert found == (["prediction_type_mismatch"] if velocity else [])


def test_a_slow_learner_warned_of_no_progress_ends_healthy_not_recovered(tmp_path: Path) -> None:
    """The Trainer's default LR (5e-5) on a GPT-2 built from scratch: the loss falls 2% in its
    first 100 steps (`no_progress` warns, rightly) and goes on falling. It never had trouble
    to come back from: its verdict says how the loss went, not `recovered`."""
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256,
                                       n_positions=64))
    data = []
    for i in range(512):
        ids = (torch.arange(32) * (1 + i % 5) + i) % 256
        data.append({"input_ids": ids, "labels": ids.clone()})
    args = make_args(tmp_path, max_steps=300, per_device_train_batch_size=8,
                     learning_rate=5e-5, logging_steps=50)
    callback = TrainguardCallback(GuardConfig(sinks={"console": False}))
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    trainer.train()
    run = callback.run
    assert run is not None and run.verdict is not None
    assert [e.kind for e in callback.events if e.severity == "warning"] == ["no_progress"]
    assert run.verdict.verdict == "healthy", run.verdict.message


def test_the_trainers_max_grad_norm_is_its_own_between_steps(tmp_path: Path) -> None:
    """0 inside each step only: the checkpoint a save writes, and a train() stopped by an
    exception between two steps, keep the value the user set; the steps are still clipped at
    it, by trainguard."""
    from transformers import TrainerCallback

    seen_in_steps: list[float] = []

    class Stop(TrainerCallback):
        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            seen_in_steps.append(args.max_grad_norm)  # after trainguard's: given back

        def on_step_end(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            if state.global_step == 5:
                raise KeyboardInterrupt

    recorder = Recorder()
    callback = TrainguardCallback(GuardConfig(**QUIET), sinks=[recorder])
    args = make_args(tmp_path, max_steps=8, save_strategy="steps", save_steps=2,
                     max_grad_norm=0.3)
    trainer = Trainer(model=tiny_gpt2(), args=args, train_dataset=token_data(),
                      callbacks=[callback, Stop()])
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert args.max_grad_norm == 0.3
    saved = torch.load(tmp_path / "out" / "checkpoint-4" / "training_args.bin",
                       weights_only=False)
    assert saved.max_grad_norm == 0.3
    assert seen_in_steps == [0.3] * 5
    assert any(r.action == "clipped" for r in recorder.reports)  # trainguard clipped at 0.3
    callback.close()


def test_a_loss_the_trainer_makes_outside_the_model_is_the_one_judged(tmp_path: Path) -> None:
    """A Trainer subclass whose `compute_loss` turns the loss NaN at one step (the model's own
    output still finite): the step's loss is NaN and told as such, not the model's; the other
    steps report the loss the subclass minimises (here twice the model's)."""

    class Doubled(Trainer):
        def compute_loss(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
            loss = 2.0 * model(**inputs).loss
            return loss * math.nan if self.state.global_step == 5 else loss

    recorder = Recorder()
    callback = TrainguardCallback(GuardConfig(**QUIET), sinks=[recorder])
    model = tiny_gpt2()
    Doubled(model=model, args=make_args(tmp_path), train_dataset=token_data(),
            callbacks=[callback]).train()
    bad = recorder.reports[5]
    assert math.isnan(bad.loss) and bad.action == "skipped"
    assert "nonfinite_loss" in {e.kind for e in bad.events}
    first = recorder.reports[0].loss
    assert first == pytest.approx(2.0 * math.log(64), rel=0.05)  # the doubled loss, not ln 64
    assert all_finite(model)
