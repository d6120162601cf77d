"""The registry of event kinds and metric keys is complete, and the middle of trainguard reads it.

Conformance: every kind any part of trainguard raises is registered (and nothing registered is
raised nowhere); every key the probes and the step measurement produce is registered with its
scope and cross-rank reduction. Behaviour: a kind registered from outside (a new detector's own
module, or a user) changes the ranking and the recovery without touching either.
"""

from __future__ import annotations

import ast
import types
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import trainguard
from trainguard import registry
from trainguard.config import DetectorConfig, GuardConfig, RecoveryConfig
from trainguard.detect import DETECTOR_TYPES
from trainguard.diagnose.causes import CAUSES
from trainguard.diagnose.ranking import rank_causes
from trainguard.distributed import RankAgreement
from trainguard.errors import UsageError
from trainguard.events import SEVERITY_RANK, Event
from trainguard.params import watched_params
from trainguard.probes.activations import ActivationProbe
from trainguard.probes.gradients import GradientProbe
from trainguard.probes.optimizer_state import OptimizerStateProbe
from trainguard.probes.packing import DevicePack
from trainguard.probes.weights import WeightProbe
from trainguard.recovery import RecoveryController
from trainguard.registry import (
    CauseVote,
    Onset,
    Reaction,
    Reduction,
    Scope,
    Tag,
    event_kind,
    is_rank_local,
    kinds_reacting,
    kinds_tagged,
    metric_key,
    recovery_reaction,
    register_event_kind,
    register_metric_key,
)
from trainguard.signals import StepSignals

SRC = Path(trainguard.__file__).parent


@pytest.fixture
def scratch_registry() -> Iterator[None]:
    """Registrations made by a test are forgotten after it."""
    kinds, metrics, patterns = (dict(registry._KINDS), dict(registry._METRICS),
                                list(registry._PATTERNS))
    yield
    registry._KINDS.clear()
    registry._KINDS.update(kinds)
    registry._METRICS.clear()
    registry._METRICS.update(metrics)
    registry._PATTERNS[:] = patterns
    registry._cache.clear()


# -- every kind raised is registered ---------------------------------------------------------------
def _sources() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(SRC.rglob("*.py")):
        yield path, ast.parse(path.read_text(), filename=str(path))


def _call_name(node: ast.Call) -> str | None:
    func = node.func
    return func.id if isinstance(func, ast.Name) else (
        func.attr if isinstance(func, ast.Attribute) else None)


def raised_kinds() -> dict[str, str]:
    """Kind literals in trainguard's source: `Event(kind="...")`, a detector's `kind = "..."`,
    and the checks of the batch inspector's findings (each becomes an event of that kind)."""
    found: dict[str, str] = {}
    for path, tree in _sources():
        where = str(path.relative_to(SRC))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _call_name(node) == "Event":
                for kw in node.keywords:
                    if kw.arg == "kind" and isinstance(kw.value, ast.Constant):
                        found[kw.value.value] = where
            elif isinstance(node, ast.Call) and _call_name(node) == "Finding" \
                    and where.startswith("diagnose/batch"):
                first = node.args[0] if node.args else None
                if isinstance(first, ast.Constant):
                    found[first.value] = where
            elif isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.Assign) and isinstance(item.value, ast.Constant) \
                            and any(isinstance(t, ast.Name) and t.id == "kind"
                                    for t in item.targets) and item.value.value:
                        found[item.value.value] = where
    return found


def test_the_source_scan_finds_kinds_of_every_origin() -> None:
    found = raised_kinds()
    for kind in ("loss_spike", "ddp_desync", "skip_limit", "rollback", "rollback_limit",
                 "rollback_failed", "monitor_error", "snapshot_failed", "batch_size",
                 "batch_nonfinite", "batch_above_chance"):
        assert kind in found, kind
    assert "clip_takeover" not in found  # an action, not an event


def test_every_kind_raised_anywhere_is_registered() -> None:
    missing = {k: where for k, where in raised_kinds().items() if not registry.is_registered(k)}
    assert not missing


def test_every_registered_kind_is_raised_somewhere() -> None:
    stale = {k.name for k in registry.event_kinds()} - set(raised_kinds())
    assert not stale


def test_every_detector_kind_is_registered() -> None:
    for detector in DETECTOR_TYPES:
        assert detector.kind and registry.is_registered(detector.kind), detector.__name__


def test_entries_are_well_formed() -> None:
    for entry in registry.event_kinds():
        assert entry.description and entry.severity in SEVERITY_RANK, entry.name
        for vote in entry.votes:
            assert vote.cause in CAUSES and vote.weight > 0, entry.name


# -- what the middle reads ---------------------------------------------------------------------
def test_what_a_rank_sees_of_its_own_batch_is_rank_local() -> None:
    """Batch findings, what the probes read from this rank's forward pass (its activations
    and its outputs) and from its shard of the weights (the first update's size) differ between
    ranks: they never drive a shared decision."""
    local = {k.name for k in registry.event_kinds() if k.rank_local}
    assert local == kinds_tagged(Tag.BATCH) | kinds_tagged(Tag.COLLAPSE) | {"update_too_large"}
    assert "batch_above_chance" in local and {"dead_units", "output_collapse"} <= local
    assert not is_rank_local("ddp_desync") and not is_rank_local("loss_spike")


def test_recovery_reactions_in_the_order_the_judgement_reads_them() -> None:
    assert kinds_reacting(Reaction.ROLL_BACK) == (
        "loss_divergence", "nonfinite_weight", "nonfinite_optimizer_state", "extreme_weight",
        "ddp_desync")
    assert kinds_reacting(Reaction.WATCH) == ("loss_spike", "grad_explosion")
    assert recovery_reaction("nonfinite_loss") is None  # judged from the signals themselves
    assert event_kind("loss_divergence").onset is Onset.SMOOTHED_LOSS
    assert event_kind("ddp_desync").onset is Onset.LAST_AGREED
    assert {k for k in kinds_reacting(Reaction.ROLL_BACK)
            if event_kind(k).onset is Onset.SAMPLED} == kinds_tagged(Tag.STATE)


def test_families_the_ranking_reads() -> None:
    assert kinds_tagged(Tag.INSTABILITY) == {"grad_explosion", "loss_spike", "loss_divergence",
                                             "extreme_weight", "bad_start",
                                             "instability_precursor", "update_too_large",
                                             "kl_blowup"}
    assert kinds_tagged(Tag.NONFINITE) == {"nonfinite_loss", "nonfinite_grad", "nonfinite_value",
                                           "nonfinite_metric"}
    assert kinds_tagged(Tag.STATE) == {"nonfinite_weight", "nonfinite_optimizer_state",
                                       "extreme_weight"}
    assert kinds_tagged(Tag.JUMP) == {"grad_explosion", "loss_spike", "loss_divergence"}
    assert kinds_tagged(Tag.CLIMB) == {"loss_divergence"}
    assert kinds_tagged(Tag.START) == {"bad_start", "update_too_large"}
    assert kinds_tagged(Tag.OVERFLOW) == {"fp16_overflow"}
    # the adaptive clip's alarm: the sudden jumps only, not all of the instability family
    assert kinds_tagged(Tag.CLIP_ALARM) == {"grad_explosion", "loss_spike", "loss_divergence",
                                            "instability_precursor"}
    assert kinds_tagged(Tag.CLIP_ALARM) < kinds_tagged(Tag.INSTABILITY)
    assert event_kind("ddp_desync").votes == (
        CauseVote("ddp_desync", 4.0, "step {step}: {message}", each_event=True),)


def test_an_unknown_kind_gets_a_default_that_changes_nothing() -> None:
    entry = event_kind("my_own_kind")
    assert not entry.registered and not entry.rank_local
    assert entry.reaction is None and entry.votes == () and entry.tags == frozenset()
    assert not is_rank_local("my_own_kind") and recovery_reaction("my_own_kind") is None
    assert kinds_tagged("no such tag") == frozenset()
    mine = Event("my_own_kind", 30, "error", "mine", details={"cause": "outlier_batch"})
    assert rank_causes([mine]) == []
    controller = RecoveryController(RecoveryConfig(), DetectorConfig(), sample_every=50)
    calm = StepSignals(step=30, loss=2.0, grad_norm=1.0, param_grad_norm=np.ones(1),
                       param_names=["w"])
    assert controller.review(calm, [mine]) is None


def test_registering_again_is_harmless_and_a_conflict_is_refused(scratch_registry) -> None:
    entry = event_kind("loss_spike")
    assert register_event_kind(entry.name, entry.description, entry.severity,
                               reaction=entry.reaction, tags=entry.tags) == entry
    with pytest.raises(UsageError, match="already registered"):
        register_event_kind("loss_spike", "something else", "error")
    with pytest.raises(UsageError, match="severity"):
        register_event_kind("mine", "bad severity", "fatal")  # type: ignore[arg-type]
    register_event_kind("loss_spike", "changed", "error", replace=True)
    assert recovery_reaction("loss_spike") is None and "loss_spike" not in kinds_reacting(
        Reaction.WATCH)


def test_a_kind_registered_from_outside_drives_ranking_and_recovery(scratch_registry) -> None:
    register_event_kind("weights_drift", "weights drift from a reference", "error",
                        reaction=Reaction.ROLL_BACK, onset=Onset.SAMPLED,
                        tags=(Tag.STATE, Tag.INSTABILITY),
                        votes=(CauseVote("lr_too_high", 2.5, "weights drifted"),
                               CauseVote("optimizer_eps", 1.0, "step {step}: {message}",
                                         each_event=True)))
    drift = Event("weights_drift", 300, "error", "drifted")
    ranked = {c.code: c for c in rank_causes([drift])}
    # its own votes (2.5, 1.0) and the state family's (1.0 and 0.5)
    assert ranked["lr_too_high"].score == 3.0 and ranked["optimizer_eps"].score == 2.0
    assert "step 300: drifted" in ranked["optimizer_eps"].evidence
    controller = RecoveryController(RecoveryConfig(), DetectorConfig(), sample_every=50)
    signals = StepSignals(step=300, loss=2.0, grad_norm=1.0, param_grad_norm=np.ones(1),
                          param_names=["w"])
    verdict = controller.review(signals, [drift])
    assert verdict is not None and verdict.action == "rollback" and verdict.onset == 250


# -- metric keys -----------------------------------------------------------------------------------
class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.1), nn.Linear(8, 2))
        self.scale16 = nn.Parameter(torch.ones(3, dtype=torch.float16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) + self.scale16.float().sum()


def _assert_registered(keys: dict[str, torch.Tensor], scope: Scope, size: int) -> None:
    assert keys
    for key, values in keys.items():
        entry = metric_key(key)
        assert entry is not None, key
        assert entry.scope is scope and entry.description, key
        assert values.numel() == (1 if scope is Scope.STEP else size), key


def test_every_key_the_probes_produce_is_registered_with_its_scope() -> None:
    torch.manual_seed(0)
    model = Tiny()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    watched = watched_params(model, [optimizer])
    cpu = torch.device("cpu")
    activations = ActivationProbe(model)
    activations.attach()
    model(torch.randn(5, 4)).square().mean().backward()
    seen = activations.detach()
    assert seen is not None
    _assert_registered(seen[1], Scope.MODULE, len(seen[0]))

    pack = DevicePack(cpu)
    GradientProbe(watched).measure(pack, cpu)
    host = {k: torch.from_numpy(v) for k, v in pack.fetch().items()}
    assert "fp16_grad_maxabs" in host  # the float16 parameter
    _assert_registered({k: v for k, v in host.items() if k != "param_grad_norm"}, Scope.STEP, 1)
    _assert_registered({"param_grad_norm": host["param_grad_norm"]}, Scope.PARAM, len(watched))

    weights = WeightProbe(watched)
    weights.remember()
    optimizer.step()
    per_param = weights.measure(cpu)
    assert "update_ratio" in per_param
    state = OptimizerStateProbe(watched, [optimizer]).measure(cpu)
    assert set(state) == {"optstate_exp_avg_norm", "optstate_exp_avg_sq_norm"}
    _assert_registered({**per_param, **state}, Scope.PARAM, len(watched))
    for key in [*per_param, *state, *seen[1]]:
        assert metric_key(key).sampled, key  # type: ignore[union-attr]


def test_every_segment_of_a_guarded_step_is_registered(monkeypatch) -> None:
    names: list[str] = []
    add = DevicePack.add

    def spy(self: DevicePack, name: str, tensor: torch.Tensor) -> None:
        names.append(name)
        add(self, name, tensor)

    monkeypatch.setattr(DevicePack, "add", spy)
    torch.manual_seed(0)
    model = Tiny()
    optimizer = torch.optim.AdamW(model.parameters(), lr=torch.tensor(1e-3))
    guard = trainguard.Guard(model, optimizer,
                             config=GuardConfig(sinks={"console": False},
                                                probes={"sample_every": 1}))
    for _ in range(3):
        loss = model(torch.randn(5, 4)).square().mean()
        loss.backward()
        guard.step(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    guard.close()
    keys = {name.partition(":")[2] if ":" in name else name for name in names
            if not name.startswith("x:")}  # extra tensors (the batch, the ring) are no metrics
    assert {"loss", "grad_norm", "param_grad_norm", "lr", "weight_norm", "act_maxabs"} <= keys
    assert all(metric_key(k) is not None for k in keys), keys - {
        k for k in keys if metric_key(k) is not None}


def test_cross_rank_reductions() -> None:
    reduction = {k.name: k.reduction for k in registry.metric_keys()}
    assert reduction["loss"] is Reduction.MEAN
    assert reduction["weight_maxabs"] is reduction["weight_nonfinite"] is Reduction.MAX
    for key in ("grad_norm", "param_grad_norm", "weight_norm", "optstate_{state}_norm"):
        assert reduction[key] is Reduction.SUM_OF_SQUARES, key
    for key in ("weight_mean", "weight_std", "update_ratio", "lr", "loss_scale", "act_maxabs"):
        assert reduction[key] is Reduction.LOCAL, key
    assert registry.metric_reduction("optstate_momentum_buffer_norm") is Reduction.SUM_OF_SQUARES
    assert registry.metric_reduction("not_a_key") is Reduction.LOCAL
    pattern = metric_key("optstate_{state}_norm")
    assert pattern is not None and pattern.key(state="exp_avg") == "optstate_exp_avg_norm"


def test_the_step_all_reduce_carries_exactly_the_agreed_every_step_keys() -> None:
    agreed = {k.name for k in registry.metric_keys()
              if not k.sampled and k.reduction is not Reduction.LOCAL}
    # [loss, loss ranks, fp16 max, fp16 ranks, grad norm, per-rank slots, per-parameter norms]
    two_ranks = types.SimpleNamespace(context=types.SimpleNamespace(world_size=2))
    slots = [0.0] * (5 * 2)  # five per-rank blocks, one slot per rank
    split = RankAgreement.split(two_ranks,  # type: ignore[arg-type]
                                np.array([2.0, 2.0, 3.0, 2.0, 1.0, *slots, 0.6, 0.8]))
    assert split.pop("ranks").size == len(slots), "each rank's own flags: not a metric"
    assert set(split) == agreed
    assert split["param_grad_norm"].tolist() == [0.6, 0.8]
    for key in registry.metric_keys():
        if key.scope is Scope.MODULE:
            assert key.reduction is Reduction.LOCAL, key.name


def test_registering_a_metric_key(scratch_registry) -> None:
    entry = register_metric_key("grad_{kind}_maxabs", Scope.PARAM, "max |g| per kind",
                                Reduction.MAX)
    assert metric_key("grad_dense_maxabs") is entry
    with pytest.raises(UsageError, match="every-step"):
        register_metric_key("tokens_seen", Scope.STEP, "tokens", Reduction.MEAN, sampled=False)
    with pytest.raises(UsageError, match="per-parameter"):
        register_metric_key("act_mean", Scope.MODULE, "mean output", Reduction.MAX)
    assert register_metric_key("tokens_seen", Scope.STEP, "tokens", sampled=False).reduction \
        is Reduction.LOCAL


def test_the_kind_names_are_the_registered_built_in_kinds() -> None:
    import re

    from trainguard import registry
    from trainguard.registry import Kind
    names = {v for k, v in vars(Kind).items() if k.isupper()}
    assert all(getattr(Kind, n.upper()) == n for n in names)
    source = Path(registry.__file__).read_text(encoding="utf-8")
    assert names == set(re.findall(r'^_kind\("([a-z_0-9]+)"', source, re.M))
    assert all(registry.is_registered(n) for n in names)
