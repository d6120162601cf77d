"""Counterfactual replay proves causes on real small runs: the plain replay stays bad, the one
intervention that changes the cause heals the step, and everything is put back afterwards."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from trainguard.diagnose.counterfactual import (
    Baseline,
    Setup,
    WindowStep,
    flagged_samples,
    interventions,
    prove,
    recorded_window,
)

from ..conftest import make_setup


def mse(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return nn.functional.mse_loss(model(batch["x"]), batch["y"])


def regression(seed: int = 0, size: int = 16) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(size, 8, generator=g)
    return {"x": x, "y": x[:, :2] * 0.5 + 0.1 * torch.randn(size, 2, generator=g)}


def mlp(seed: int = 0, dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(dropout), nn.Linear(32, 2))


def typical(model: nn.Module, loss_fn, batches) -> Baseline:
    """The healthy loss and gradient norm of the model on clean batches."""
    losses, norms = [], []
    for batch in batches:
        model.zero_grad(set_to_none=True)
        loss = loss_fn(model, batch)
        loss.backward()
        losses.append(float(loss.detach()))
        norms.append(float(torch.linalg.vector_norm(torch.stack(
            [p.grad.norm() for p in model.parameters() if p.grad is not None]))))
    model.zero_grad(set_to_none=True)
    return Baseline.of(losses, norms)


def test_lr_x01_confirms_an_lr_too_high() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=3.0)  # far beyond this problem's stable LR
    batch = regression()
    base = typical(model, mse, [regression(1)])
    proof = prove(Setup(model, opt, mse, batch, step=50, baseline=base),
                  likely=["lr_too_high", "missing_warmup"])
    assert proof.reproduced and "raised the batch's loss" in proof.why_bad
    # no warm-up at step 50, and no LR x0.01 once x0.1 healed
    assert [i.name for i, _, _ in proof.trials] == ["lr_x0.1", "clip"]
    assert list(proof.confirmed) == ["lr_too_high"] and proof.ruled_out == {}
    assert proof.confirmed["lr_too_high"].startswith("confirmed by replay: with LR x0.1 the loss "
                                                     "after the update is")
    assert f"(run's typical {base.loss:.3g})" in proof.confirmed["lr_too_high"]


def test_a_warmup_ramp_confirms_missing_warmup_in_the_first_steps() -> None:
    setup = make_setup(lr=0.3, warmup=0, seed=0)  # Adam's first full-LR step on fresh moments

    def lm(m: nn.Module, b: torch.Tensor) -> torch.Tensor:
        return m.loss(b)

    batch = setup.batch(16)
    proof = prove(Setup(setup.model, setup.optimizer, lm, batch, step=0, no_warmup=True),
                  likely=["missing_warmup", "lr_too_high"])
    assert proof.reproduced, proof.summary()
    assert "with the LR a 20-step warm-up gives at step 0 (x0.05)" in proof.confirmed[
        "missing_warmup"]
    # a schedule that warms up has no warm-up to replay
    proof = prove(Setup(setup.model, setup.optimizer, lm, batch, step=0, no_warmup=False),
                  likely=["missing_warmup", "lr_too_high"])
    assert "warmup" not in [i.name for i, _, _ in proof.trials]
    assert "missing_warmup" not in proof.confirmed


def test_dropping_the_nan_sample_confirms_nonfinite_input() -> None:
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    base = typical(model, mse, [regression(1)])
    batch = regression()
    batch["x"][5, 3] = float("nan")
    assert flagged_samples(batch, model) == {5: "nonfinite"}
    proof = prove(Setup(model, opt, mse, batch, baseline=base, original_finite=False),
                  likely=["nonfinite_input", "numerical_op"])
    assert math.isnan(proof.plain.loss)
    assert list(proof.confirmed) == ["nonfinite_input"]
    assert "without the flagged sample 5" in proof.confirmed["nonfinite_input"]
    assert proof.confirmed["nonfinite_input"].endswith("instead of NaN")
    # float64 does not heal a NaN in the data, but a NaN that survives float64 may still be an
    # unsafe operation (log(0)): nothing is ruled out by it
    assert "numerical_op" not in proof.confirmed and "numerical_op" not in proof.ruled_out


def test_the_previous_batch_confirms_the_data_not_one_data_cause() -> None:
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    base = typical(model, mse, [regression(1), regression(2)])
    batch = regression()
    batch["x"] = batch["x"] * 1000  # every sample: nothing to drop, the batch itself is bad
    assert flagged_samples(batch, model) == {}
    setup = Setup(model, opt, mse, batch, previous_batch=regression(3), baseline=base,
                  batch_causes=("outlier_batch",))
    proof = prove(setup, likely=["outlier_batch", "lr_too_high"])
    # float inputs and targets: an outlier, a shifted scale or wrong labels; no NaN, no tokens
    assert list(proof.confirmed) == ["outlier_batch", "input_scale", "label_problem"]
    assert set(proof.confirmed_by.values()) == {"previous_batch"}
    assert proof.confirmed["input_scale"].startswith(
        "confirmed by replay: the data — on the previous good batch the step's loss is")
    # the step is bad before its update: a smaller LR can neither heal nor clear it, and is
    # not even tried (the budget goes to what can answer)
    assert "lr_x0.1" not in [i.name for i, _, _ in proof.trials]
    assert "lr_too_high" not in proof.ruled_out
    # the data is confirmed whatever the votes said so far (they order the causes later)
    proof = prove(Setup(model, opt, mse, batch, previous_batch=regression(3), baseline=base),
                  likely=["tokenizer_mismatch", "lr_too_high"])
    assert list(proof.confirmed) == ["outlier_batch", "input_scale", "label_problem"]


def test_a_previous_batch_that_no_longer_trains_the_model_confirms_nothing() -> None:
    """Dead units: the previous good batch gives a zero gradient on the broken state, which a
    good batch that trained the model a step ago does not: the state is at fault, not the
    batch."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    base = typical(model, mse, [regression(1), regression(2)])
    with torch.no_grad():
        model[0].bias.fill_(-100.0)  # every hidden unit dead for every input
        model[3].bias.copy_(regression(3)["y"].mean(0))
    previous = regression(3)
    previous["y"] = model(previous["x"]).detach()  # its loss is 0: only its gradient tells
    batch = regression()
    batch["y"] = batch["y"] * 30
    proof = prove(Setup(model, opt, mse, batch, previous_batch=previous, baseline=base),
                  likely=["outlier_batch"])
    assert proof.reproduced, proof.summary()
    assert next(h for i, _, h in proof.trials if i.name == "previous_batch") is False
    assert proof.confirmed == {}
    assert "outlier_batch" in proof.ruled_out


def test_a_previous_batch_far_above_the_typical_loss_confirms_nothing() -> None:
    """A state that diverged: the previous good batch's loss is 1.75x the run's typical one (a
    finite, quiet step, but not a healthy one), so a swap of the data cannot prove the data."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    base = typical(model, mse, [regression(1), regression(2)])
    with torch.no_grad():
        model[3].bias.add_(0.7)  # the run's state has drifted off: every batch's loss is up
    previous = regression(3)
    assert 1.5 * base.loss < float(mse(model, previous).detach()) < 3 * base.loss
    batch = regression()
    batch["y"] = batch["y"] * 30
    proof = prove(Setup(model, opt, mse, batch, previous_batch=previous, baseline=base),
                  likely=["outlier_batch"])
    assert proof.reproduced, proof.summary()
    assert next(h for i, _, h in proof.trials if i.name == "previous_batch") is False
    assert proof.confirmed == {}
    assert "outlier_batch" in proof.ruled_out


def test_dropping_foreign_token_ids_confirms_a_tokenizer_mismatch() -> None:
    setup = make_setup(seed=1)
    batch = setup.batch(8)
    batch[2, 4] = 40  # beyond the 32-row embedding table: the forward raises

    def lm(m: nn.Module, b: torch.Tensor) -> torch.Tensor:
        return m.loss(b)

    assert flagged_samples(batch, setup.model) == {2: "token_id"}
    proof = prove(Setup(setup.model, setup.optimizer, lm, batch),
                  likely=["tokenizer_mismatch"])
    assert proof.plain.error is not None and "IndexError" in proof.plain.error
    assert list(proof.confirmed) == ["tokenizer_mismatch"]


class Amplify(nn.Module):
    """A checkpoint whose hidden activations are large: fine in fp32 and bf16, beyond float16's
    65504."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up = nn.Linear(8, 64)
        self.down = nn.Linear(64, 2)
        with torch.no_grad():
            self.up.weight.mul_(2e5)
            self.down.weight.div_(2e5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def test_bf16_confirms_a_float16_overflow() -> None:
    model = Amplify()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = regression()
    proof = prove(Setup(model, opt, mse, batch, autocast=torch.float16),
                  likely=["fp16_overflow", "lr_too_high"])
    assert not proof.plain.finite
    assert "fp16_overflow" in proof.confirmed and "in bf16" in proof.confirmed["fp16_overflow"]
    assert "lr_too_high" not in proof.confirmed


def test_float64_confirms_a_numerical_op() -> None:
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def logsumexp_by_hand(m: nn.Module, b: dict[str, torch.Tensor]) -> torch.Tensor:
        z = m(b["x"]) * 50 + 100  # exp(100+) overflows float32, not float64
        return torch.log(torch.exp(z).sum()) / 100

    proof = prove(Setup(model, opt, logsumexp_by_hand, regression()),
                  likely=["numerical_op", "nonfinite_input"])
    assert math.isinf(proof.plain.loss)
    assert list(proof.confirmed) == ["numerical_op"]
    assert "float64" in proof.confirmed["numerical_op"]


def test_guarded_log_confirms_a_numerical_op_float64_cannot_heal() -> None:
    """p * log(p) of a softmax at temperature 1e-3: the small entries are exactly 0 in float64
    too, so only guarding the log heals the step."""
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def regularised(m: nn.Module, b: dict[str, torch.Tensor]) -> torch.Tensor:
        out = m(b["x"])
        p = torch.softmax(out * 1000, dim=-1)
        return nn.functional.mse_loss(out, b["y"]) + 0.01 * (p * torch.log(p)).sum(-1).mean()

    base = typical(model, mse, [regression(1)])
    proof = prove(Setup(model, opt, regularised, regression(), baseline=base),
                  likely=["numerical_op", "nonfinite_input"])
    assert math.isnan(proof.plain.loss)
    assert next(h for i, _, h in proof.trials if i.name == "float64") is False
    assert proof.confirmed_by == {"numerical_op": "safe_ops"}
    assert "log(max(x, tiny))" in proof.confirmed["numerical_op"]


def test_a_zero_divisor_made_1_confirms_a_numerical_op() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def masked_mean(m: nn.Module, b: dict[str, torch.Tensor]) -> torch.Tensor:
        keep = b["y"][:, 0] > 100  # no row kept: 0 / 0
        per_row = ((m(b["x"]) - b["y"]) ** 2).mean(-1)
        return (per_row * keep).sum() / keep.sum()

    base = typical(model, mse, [regression(1)])
    proof = prove(Setup(model, opt, masked_mean, regression(), baseline=base),
                  likely=["numerical_op"])
    assert proof.confirmed_by == {"numerical_op": "safe_ops"}
    # the guard touched only the forward: everything is put back
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_lora_alpha_over_r_of_2_confirms_lora_scaling() -> None:
    peft = pytest.importorskip("peft")
    base_model = mlp()
    pretrain = torch.optim.AdamW(base_model.parameters(), lr=1e-2)
    for seed in range(30):
        pretrain.zero_grad()
        mse(base_model, regression(seed)).backward()
        pretrain.step()
    model = peft.get_peft_model(base_model, peft.LoraConfig(
        r=8, lora_alpha=2048, target_modules=["0", "3"], lora_dropout=0.0))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-3)
    base = typical(model, mse, [regression(40), regression(41)])
    proof = prove(Setup(model, opt, mse, regression(42), step=50, baseline=base),
                  likely=["lora_scaling", "lr_too_high"])
    assert proof.reproduced, proof.summary()
    assert next(iter(proof.confirmed)) == "lora_scaling", proof.summary()
    assert "with LoRA alpha/r 2 (was 256)" in proof.confirmed["lora_scaling"]
    # x0.1 of a 256x scaling is still 25x too much; only x0.01 makes up for it
    assert [h for i, _, h in proof.trials if i.name == "lr_x0.1"] == [False]
    assert "with LR x0.01" in proof.confirmed.get("lr_too_high", "with LR x0.01")
    scalings = {float(v) for m in model.modules() if isinstance(getattr(m, "scaling", None), dict)
                for v in m.scaling.values()}
    assert scalings == {256.0}  # put back


def test_a_new_head_redrawn_at_std_002_confirms_bad_init() -> None:
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    base = typical(model, mse, [regression(1), regression(2)])
    with torch.no_grad():
        model[3].weight.normal_(0, 100.0)
    proof = prove(Setup(model, opt, mse, regression(), baseline=base),
                  likely=["bad_init", "lr_too_high"])
    assert "3.weight" in next(i.label for i in interventions(Setup(model, opt, mse, regression()))
                              if i.name == "head_init")
    assert list(proof.confirmed) == ["bad_init"]
    assert "re-drawn at std 0.02" in proof.confirmed["bad_init"]


def test_a_healthy_step_has_nothing_to_heal() -> None:
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    base = typical(model, mse, [regression(1), regression(2)])
    setup = Setup(model, opt, mse, regression(), previous_batch=regression(3), baseline=base,
                  incident=False)
    proof = prove(setup)
    assert not proof.reproduced and proof.confirmed == {} and proof.trials == []
    assert proof.summary().startswith("nothing to heal")


def test_a_step_that_replays_as_it_ran_but_is_not_bad_points_at_older_damage() -> None:
    """An incident step (a divergence judged over many steps) whose replay gives the loss it had
    when it ran, but whose own update is fine: replayed faithfully, not a transient."""
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = regression()
    with torch.no_grad():
        ran = float(mse(model, batch))
    proof = prove(Setup(model, opt, mse, batch, step=30, original_loss=ran,
                        original_finite=True))
    assert not proof.reproduced and proof.faithful is True and proof.confirmed == {}
    assert proof.summary().startswith("step 30 replays as it ran")
    assert "transient" not in proof.summary()
    # a loss 10% away from the recorded one did not replay as it ran; nor did a step that ran
    # non-finite and replays finite, whatever its loss
    for recorded, finite in ((ran * 1.1, True), (ran, False)):
        other = prove(Setup(model, opt, mse, batch, step=30, original_loss=recorded,
                            original_finite=finite))
        assert not other.reproduced and other.faithful is False
        assert other.summary().startswith("not reproducible")


def test_a_fault_the_replay_does_not_show_is_not_reproducible() -> None:
    """The step went NaN when it ran (a flaky device), its replay is finite: a transient."""
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    proof = prove(Setup(model, opt, mse, regression(), original_finite=False))
    assert not proof.reproduced and proof.confirmed == {} and proof.ruled_out == {}
    assert proof.summary().startswith("not reproducible")


def test_a_replay_that_does_not_give_the_recorded_loss_says_the_trouble_is_outside_it(
) -> None:
    """The run recorded the step's loss a million times what the replay's loss function gives
    from the same state and batch (the loop scaled it outside that function): the replay does
    not reproduce the step, says so with both losses, and tries no fix, even in the run's first
    steps, where a healthy replay is otherwise judged against its fixes."""
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = regression()
    with torch.no_grad():
        ran = float(mse(model, batch))
    for base in (typical(model, mse, [regression(1)]), Baseline()):
        proof = prove(Setup(model, opt, mse, batch, step=30, baseline=base,
                            original_loss=ran * 1e6, original_finite=True,
                            previous_batch=regression(3)))
        assert not proof.reproduced and proof.replay_differs
        assert proof.trials == [] and proof.confirmed == {} and proof.ruled_out == {}
        assert proof.recorded_loss == ran * 1e6 and proof.plain.loss == pytest.approx(ran)
        assert proof.summary().startswith(
            f"the replay does not reproduce step 30 as it ran: the run recorded its loss as "
            f"{ran * 1e6:.3g}, the replay of the same state and batch gives {ran:.3g}")
        assert "the trouble lies outside what the replay computes" in proof.summary()
    # the loss it recorded, or one a few percent off (other dropout masks): no such claim
    for recorded in (ran, ran * 1.1):
        proof = prove(Setup(model, opt, mse, batch, step=30, original_loss=recorded,
                            original_finite=True))
        assert not proof.replay_differs and "outside what the replay" not in proof.summary()


def test_a_fix_that_leaves_the_bad_value_as_it_was_confirms_nothing() -> None:
    """A fix is judged in what the plain replay is bad in, against the plain replay: a loss
    moved from just above the spike threshold to just under it is the same loss (a replay of
    the same step moves that much), and a step bad in its gradient norm is healed by a fix that
    brings the norm down, said in norms, not in the loss both replays share."""
    from trainguard.diagnose.counterfactual import Outcome, Proof, _conclude, _heals

    model = mlp()
    setup = Setup(model, torch.optim.SGD(model.parameters(), lr=1e-3), mse, regression(),
                  step=50, baseline=Baseline(1.0, 1.0))
    float64 = next(i for i in interventions(setup) if i.name == "float64")
    spiked = Outcome("as_it_happened", "as it happened", loss=3.1, grad_norm=1.0, after=3.0)
    proof = Proof(50, spiked, setup.baseline, True, spiked.bad(setup.baseline))
    assert spiked.bad(setup.baseline) and not Outcome("f", "", 2.9, 1.0, 2.8).bad(
        setup.baseline)
    assert _heals(float64, proof, Outcome("f", "", 2.9, 1.0, 2.8)) is False
    assert _heals(float64, proof, Outcome("f", "", 1.2, 1.0, 1.1)) is True
    steep = Outcome("as_it_happened", "as it happened", loss=1.0, grad_norm=12.0, after=0.9)
    proof = Proof(50, steep, setup.baseline, True, steep.bad(setup.baseline))
    calm = Outcome("f", "", loss=1.0, grad_norm=1.0, after=0.9)
    proof.trials = [(float64, calm, _heals(float64, proof, calm))]
    _conclude(proof, ["numerical_op"])
    assert proof.confirmed == {"numerical_op": "confirmed by replay: with the loss computed in "
                               "float64 the gradient norm is 1 (run's typical 1) instead of 12"}
    # a warned signal is judged by its warning's bound, on its own scale: log Z from 14.2 to
    # 11.2, under the bound 13.5, is a fix (a fifth of a logarithm is a large change)
    warned = Baseline(1.0, 1.0, signal_bound=13.5, signal_what="log Z")
    high = Outcome("as_it_happened", "as it happened", 1.0, 1.0, 0.9, window=5, signal=14.2)
    proof = Proof(50, high, warned, True, high.bad(warned))
    assert _heals(float64, proof, Outcome("f", "", 1.0, 1.0, 0.9, window=5, signal=11.2))


def test_the_fixes_of_the_update_a_damaged_state_cannot_try_are_named() -> None:
    """The batch is fine but the state already broken (its loss far above the run's): a
    changed update cannot heal the step, so the LR fixes are not tried, and the proof says
    which and what would let them be tried."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    base = typical(model, mse, [regression(1)])
    with torch.no_grad():
        model[0].weight.mul_(300.0)  # damage from updates before this state
    proof = prove(Setup(model, opt, mse, regression(), step=60, baseline=base,
                        earlier="a state from step 50"), likely=["lr_too_high"])
    assert proof.reproduced and proof.plain.forward_bad(base)
    assert proof.cannot_try == ["lr_x0.1", "lr_x0.01", "clip"] and proof.trials == []
    assert proof.summary().startswith(
        f"step 60 is bad ({proof.why_bad}); could not try lr_x0.1, lr_x0.01, clip (testing "
        "lr_too_high) from this state: step 60 is bad before its update")
    assert proof.summary().endswith("a state from step 50 would let them be tried")
    assert "lr_too_high" not in proof.ruled_out


def test_the_time_budget_is_honoured() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=3.0)
    setup = Setup(model, opt, mse, regression(), step=0, previous_batch=regression(3))
    none = prove(setup, budget_s=0.0)
    assert none.reproduced and none.trials == [] and len(none.not_tried) == len(
        interventions(setup))
    assert "not tried for lack of time" in none.summary()
    plain_s = none.plain.seconds
    some = prove(setup, budget_s=plain_s * 3)
    # the budget, the replay under way when it ran out, and room for a busy machine's jitter
    assert some.seconds <= plain_s * 5 + 0.5
    unlimited = prove(setup, budget_s=None)
    assert not unlimited.not_tried and unlimited.trials


def test_a_gentler_fix_that_healed_spares_the_stronger_one() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=3.0)
    tried = [i.name for i, _, _ in prove(Setup(model, opt, mse, regression(), step=50)).trials]
    assert "lr_x0.1" in tried and "lr_x0.01" not in tried
    opt = torch.optim.SGD(model.parameters(), lr=30.0)  # x0.1 is still far too high
    proof = prove(Setup(model, opt, mse, regression(), step=50), likely=["lr_too_high"])
    assert [(i.name, h) for i, _, h in proof.trials if i.name.startswith("lr_")] == [
        ("lr_x0.1", False), ("lr_x0.01", True)]
    assert "with LR x0.01" in proof.confirmed["lr_too_high"]


def snapshot_of(model: nn.Module, opt: torch.optim.Optimizer) -> dict:
    return {"params": [p.detach().clone() for p in model.parameters()],
            "grads": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
            "state": {i: {k: v.clone() if isinstance(v, torch.Tensor) else v
                          for k, v in s.items()}
                      for i, s in enumerate(opt.state.values())},
            "groups": [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups],
            "rng": torch.get_rng_state().clone(), "training": model.training}


def same(a: dict, b: dict) -> bool:
    def eq(x, y) -> bool:
        if isinstance(x, torch.Tensor):
            return isinstance(y, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y)
        if isinstance(x, dict):
            return x.keys() == y.keys() and all(eq(x[k], y[k]) for k in x)
        if isinstance(x, list):
            return len(x) == len(y) and all(eq(u, v) for u, v in zip(x, y, strict=True))
        return x == y
    return eq(a, b)


def test_model_optimizer_grads_and_rng_are_put_back_exactly() -> None:
    model = mlp(dropout=0.3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for seed in range(3):  # optimizer state to keep
        opt.zero_grad()
        mse(model, regression(seed)).backward()
        opt.step()
    opt.zero_grad()
    batch = regression(7)
    mse(model, batch).backward()  # the bad step's own gradients, as the Guard holds them
    params = list(model.parameters())
    before = snapshot_of(model, opt)
    proof = prove(Setup(model, opt, mse, batch, previous_batch=regression(8),
                        autocast=torch.float16, baseline=Baseline(1e-3, 1e-3)))
    assert proof.trials  # the interventions ran (a tiny baseline makes the step "bad")
    assert same(before, snapshot_of(model, opt))
    assert list(model.parameters()) == params and all(p.dtype == torch.float32 for p in params)


def test_a_batch_a_guarded_operation_trains_on_is_not_the_data_s_fault() -> None:
    """A batch with no target left breaks an unguarded 0 / 0: the previous batch heals the step,
    but so does the guarded division on this very batch, so the operation is confirmed and the
    data is not."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def masked_mean(m: nn.Module, b: dict[str, torch.Tensor]) -> torch.Tensor:
        keep = b["y"][:, 0] < 100
        per_row = ((m(b["x"]) - b["y"]) ** 2).mean(-1)
        return (per_row * keep).sum() / keep.sum()

    batch = regression()
    batch["y"][:, 0] = 200.0  # no row kept
    base = typical(model, mse, [regression(1)])
    proof = prove(Setup(model, opt, masked_mean, batch, previous_batch=regression(3),
                        baseline=base), likely=["numerical_op", "outlier_batch"])
    assert next(h for i, _, h in proof.trials if i.name == "previous_batch") is True
    assert list(proof.confirmed) == ["numerical_op"]


def test_a_batch_with_every_label_ignored_confirms_the_data_with_empty_loss() -> None:
    setup = make_setup(seed=1)

    def lm(m: nn.Module, b: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = m(b["input_ids"])
        return nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                           b["labels"].reshape(-1))

    tokens = setup.batch(8)
    previous = {"input_ids": tokens, "labels": tokens}
    batch = {"input_ids": tokens, "labels": torch.full_like(tokens, -100)}  # mean over no label
    proof = prove(Setup(setup.model, setup.optimizer, lm, batch, previous_batch=previous),
                  likely=["empty_loss", "numerical_op"])
    assert math.isnan(proof.plain.loss)
    assert set(proof.confirmed) == {"outlier_batch", "tokenizer_mismatch", "label_problem",
                                    "empty_loss"}
    assert "numerical_op" not in proof.confirmed  # the NaN is inside cross_entropy's own mean


@pytest.mark.parametrize("agrees", [True, False])
def test_the_run_s_record_stands_for_a_window_whose_first_step_replays_alike(
        agrees: bool) -> None:
    """A window the run recorded as bad is not replayed as it happened when its first step
    replays to the recorded loss; when it does not (a loss function unlike the run's), it is."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=3.0)  # far beyond this problem's stable LR
    base = typical(model, mse, [regression(1)])
    with torch.no_grad():
        first = float(mse(model, regression(10)))
    window = tuple(WindowStep(10 + i, regression(10 + i), (3.0,), loss=(first if i == 0 else 50.0))
                   for i in range(6))
    if not agrees:
        window = (WindowStep(10, regression(10), (3.0,), loss=2 * first + 1), *window[1:])
    recorded = recorded_window(window, 80.0, 5.0)
    assert recorded is not None and recorded.recorded and recorded.loss == 50.0
    proof = prove(Setup(model, opt, mse, regression(0), step=16, baseline=base, window=window,
                        recorded=recorded, update_seconds=0.0), likely=["lr_too_high"])
    assert proof.reproduced and proof.plain.recorded is agrees
    assert ("as the run recorded it" in proof.confirmed.get("lr_too_high", "")) is agrees
    assert "lr_too_high" in proof.confirmed
    assert recorded_window((*window[:-1], WindowStep(15, None, (3.0,))), 80.0, 5.0) is None


def test_a_cause_whose_stronger_fix_was_left_out_is_not_ruled_out() -> None:
    """LR x0.1 left the step bad and x0.01 was not tried for lack of time: the LR stays open."""
    from trainguard.diagnose.counterfactual import Outcome, Proof, _conclude

    model = mlp()
    setup = Setup(model, torch.optim.SGD(model.parameters(), lr=3.0), mse, regression(),
                  step=50, baseline=Baseline(0.3, 1.0))
    x01 = next(i for i in interventions(setup) if i.name == "lr_x0.1")
    plain = Outcome("as_it_happened", "as it happened", 0.3, 1.0, 9.0)
    still = Outcome(x01.name, x01.label, 0.3, 1.0, 8.0)
    proof = Proof(50, plain, setup.baseline, True, "raised", trials=[(x01, still, False)])
    _conclude(proof, ["lr_too_high"])
    assert "lr_too_high" in proof.ruled_out
    proof.untested = {"lr_too_high"}
    _conclude(proof, ["lr_too_high"])
    assert not proof.ruled_out and not proof.confirmed


def test_a_good_batch_that_heals_an_update_a_lower_lr_heals_too_does_not_confirm_the_data(
) -> None:
    """A step whose loss and gradients are typical but whose update is too big (a glitch of the
    LR): LR x0.01 heals it, and so, by chance, does the previous good batch, whose own loss
    after the same oversized update says nothing of the data. The LR is confirmed, not the
    data."""
    from trainguard.diagnose.counterfactual import Outcome, Proof, _conclude

    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=3.0)
    setup = Setup(model, opt, mse, regression(), previous_batch=regression(3),
                  baseline=Baseline(1.0, 1.0))
    by_name = {i.name: i for i in interventions(setup)}
    plain = Outcome("as_it_happened", "", loss=1.0, grad_norm=1.0, after=50.0)
    fine = Outcome("fix", "", loss=1.0, grad_norm=1.0, after=0.5)
    proof = Proof(step=81, plain=plain, baseline=setup.baseline, reproduced=True,
                  why_bad="the update raised the batch's loss from 1 to 50")
    proof.trials = [(by_name["lr_x0.1"], fine, False), (by_name["lr_x0.01"], fine, True),
                    (by_name["previous_batch"], fine, True)]
    _conclude(proof, likely=["outlier_batch", "lr_too_high"])
    assert list(proof.confirmed) == ["lr_too_high"]
    # without the LR's heal the same good batch confirms the data
    proof.trials = [(by_name["previous_batch"], fine, True)]
    _conclude(proof, likely=["outlier_batch", "lr_too_high"])
    assert "outlier_batch" in proof.confirmed and "lr_too_high" not in proof.confirmed


@pytest.mark.parametrize("damage", [None, "typical", "high"])
def test_a_window_s_lr_heal_counts_only_when_the_model_is_damaged(damage: str | None) -> None:
    """The LR x0.1 window heals; the model the window left, on data from before the trouble, at
    the run's typical loss: it is not damaged, so the heal proves nothing of the LR (the window's
    data may be what went wrong). Far above it, or unmeasured: the LR is confirmed."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=3.0)
    base = typical(model, mse, [regression(1)])
    with torch.no_grad():
        first = float(mse(model, regression(10)))
    window = tuple(WindowStep(10 + i, regression(10 + i), (3.0,), loss=(first if i == 0 else 50.0))
                   for i in range(6))
    damage_loss = {None: None, "typical": base.loss, "high": 10 * base.loss}[damage]
    proof = prove(Setup(model, opt, mse, regression(0), step=16, baseline=base, window=window,
                        recorded=recorded_window(window, 80.0, 5.0), update_seconds=0.0,
                        damage_loss=damage_loss), likely=["lr_too_high"])
    assert proof.reproduced and proof.damage_loss == damage_loss
    if damage == "typical":
        assert proof.undamaged and not proof.confirmed and not proof.ruled_out
        assert "does well on data from before the trouble" in proof.summary()
    else:
        assert not proof.undamaged and "lr_too_high" in proof.confirmed


def _label_shift_window(model: nn.Module, shift_from: int) -> tuple[WindowStep, ...]:
    """Steps 10-19, whose targets are shifted by +5 from `shift_from` on (a wrong shard of
    labels), with the losses the run recorded for them."""
    steps = []
    with torch.no_grad():
        typical_loss = float(mse(model, regression(10)))
    for step in range(10, 20):
        batch = regression(step)
        if step >= shift_from:
            batch["y"] = batch["y"] + 5.0
        steps.append(WindowStep(step, batch, (1e-2,),
                                loss=typical_loss if step < shift_from else 25.0))
    return tuple(steps)


def test_good_data_in_a_window_confirms_the_data_and_a_lower_lr_s_heal_does_not_count(
) -> None:
    """Wrong targets from step 14 on: the window replayed with the batches of steps 10-13 in
    their place heals at the run's own LR, which confirms the data; a lower LR that heals the
    window too (it learns less from the wrong targets) is not confirmed."""
    from trainguard.diagnose.counterfactual import Outcome, _conclude

    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    base = typical(model, mse, [regression(1), regression(2)])
    window = _label_shift_window(model, 14)
    bad = regression(20)
    bad["y"] = bad["y"] + 5.0
    setup = Setup(model, opt, mse, bad, step=20, baseline=base, window=window)
    swap = next(i for i in interventions(setup) if i.name == "good_data")
    assert swap.data and "label_problem" in swap.causes
    assert "batches of steps 10-13 in place of those from step 14 on" in swap.label
    proof = prove(setup, likely=["label_problem", "lr_too_high"])
    assert proof.reproduced and "label_problem" in proof.confirmed, proof.summary()
    assert proof.confirmed_by["label_problem"] == "good_data"
    assert "lr_too_high" not in proof.confirmed
    # both heal: the data is kept, the LR is not confirmed
    x01 = next(i for i in interventions(setup) if i.name == "lr_x0.1")
    fine = Outcome("fix", "", loss=base.loss, grad_norm=1.0, after=base.loss, window=10)
    proof.trials = [(x01, fine, True), (swap, fine, True)]
    _conclude(proof, likely=["label_problem", "lr_too_high"])
    assert "label_problem" in proof.confirmed and "lr_too_high" not in proof.confirmed


def test_good_data_does_not_heal_a_window_whose_lr_is_at_fault() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=3.0)  # far beyond this problem's stable LR
    base = typical(model, mse, [regression(1)])
    with torch.no_grad():
        first = float(mse(model, regression(10)))
    window = tuple(WindowStep(10 + i, regression(10 + i), (3.0,), loss=(first if i < 2 else 50.0))
                   for i in range(8))
    proof = prove(Setup(model, opt, mse, regression(0), step=18, baseline=base, window=window),
                  likely=["lr_too_high", "outlier_batch"])
    assert next(h for i, _, h in proof.trials if i.name == "good_data") is False
    assert "lr_too_high" in proof.confirmed and "outlier_batch" not in proof.confirmed
