"""What a precursor warning's proof measures: the warned signal of one replayed forward and
backward, the same value the run's probes give for it, and the bound the warning carried."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from trainguard.detect.attention_logits import SIGNAL as ATTENTION
from trainguard.detect.instability_precursor import SIGNAL as ADAM_RATIO
from trainguard.detect.output_growth import LOGZ
from trainguard.diagnose.counterfactual import Baseline, Outcome
from trainguard.diagnose.warned_signal import WarnedSignal, adam_ratio
from trainguard.events import Event
from trainguard.probes.attention_logits import AttentionLogitProbe
from trainguard.probes.logz import logz_rows, logz_values

from ..probes.test_adam_ratio import by_hand, model_and_adam
from ..probes.test_attention_logits import Fused


def warning(signal: str, param: str, value: float = 9.0, bound: float | None = 4.0,
            kind: str = "instability_precursor") -> Event:
    details = {"signal": signal, "baseline": 2.0}
    if bound is not None:
        details["bound"] = bound
    return Event(kind, 30, "warning", "...", param=param, value=value, details=details)


def test_a_warning_gives_its_signal_and_bound() -> None:
    signal = WarnedSignal.of(warning(ATTENTION, "blocks.0.attn"))
    assert signal == WarnedSignal(ATTENTION, "blocks.0.attn", 9.0, 4.0)
    assert signal.what == "the largest attention logit of blocks.0.attn"
    assert WarnedSignal.of(warning(LOGZ, "logits")).what == "log Z of the output logits"
    start = Event("bad_start", 10, "warning", "...", value=11.4,
                  details={"signal": "loss", "bound": 8.0, "cause": "lr_too_high"})
    assert WarnedSignal.of(start) == WarnedSignal("loss", "", 11.4, 8.0)
    assert WarnedSignal.of(start).what == "the median loss of the last steps"


@pytest.mark.parametrize("event", [
    warning(ATTENTION, "blocks.0.attn", bound=None),  # no bound: not judged
    warning("adam_update_rms", "w"),  # a signal a replay does not measure
    warning(ATTENTION, "blocks.0.attn", kind="loss_spike"),
    warning(ATTENTION, "blocks.0.attn", bound=math.nan),
])
def test_what_a_replay_cannot_judge_gives_no_signal(event: Event) -> None:
    assert WarnedSignal.of(event) is None


@pytest.mark.parametrize("kind", [torch.optim.Adam, torch.optim.AdamW])
def test_the_adam_ratio_is_the_probes_value(kind: type) -> None:
    model, optimizer = model_and_adam((0.9, 0.95), 1e-6, kind=kind)
    for name, param in model.named_parameters():
        assert adam_ratio(model, optimizer, name) == pytest.approx(
            by_hand(param, optimizer.state[param], 0.95, 1e-6), rel=1e-9)
    assert math.isnan(adam_ratio(model, optimizer, "no.such.weight"))


def test_the_adam_ratio_before_any_moment_is_zero() -> None:
    model = nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    assert adam_ratio(model, optimizer, "weight") == 0.0


def test_the_attention_reading_is_the_probes_value() -> None:
    block = Fused()
    x = torch.randn(2, 5, 4)
    probe = AttentionLogitProbe(block)
    probe.attach()
    block(x)
    names, values = probe.detach()
    reading = WarnedSignal(ATTENTION, names[0], 0.0, 1.0).start(block)
    block(x).sum().backward()
    assert reading.finish(block, torch.optim.SGD(block.parameters(), lr=0.1)) == float(values[0])
    # the hooks are gone: nothing measures the next forward
    assert not block.qkv._forward_hooks


def test_the_log_z_reading_is_the_largest_logsumexp() -> None:
    model = nn.Linear(6, 5)
    x = torch.randn(8, 6)
    reading = WarnedSignal(LOGZ, "logits", 0.0, 1.0).start(model)
    out = model(x)
    out.sum().backward()
    value = reading.finish(model, torch.optim.SGD(model.parameters(), lr=0.1))
    rows = logz_rows(out)
    assert rows is not None
    assert value == pytest.approx(float(logz_values(rows.numpy())["logz_max"][0]))
    assert not model._forward_hooks


def test_a_signal_not_seen_reads_nan_and_is_never_high() -> None:
    model = nn.Linear(6, 1)  # a regression head: no class scores, no attention layer
    for signal in (ATTENTION, LOGZ):
        reading = WarnedSignal(signal, "blocks.0.attn", 0.0, 1.0).start(model)
        model(torch.randn(3, 6)).sum().backward()
        assert math.isnan(reading.finish(model, torch.optim.SGD(model.parameters(), lr=0.1)))
    base = Baseline(1.0, 1.0, signal_bound=4.0, signal_what="x")
    unmeasured = Outcome("plain", "", 1.0, 1.0, 1.0, signal=math.nan)
    assert not unmeasured.signal_high(base) and not unmeasured.forward_bad(base)
    high = Outcome("plain", "", 1.0, 1.0, 1.0, signal=4.0)
    assert high.forward_bad(base) == "x is 4 (the warning's bound 4)"


def test_the_adam_reading_names_its_parameter() -> None:
    model, optimizer = model_and_adam()
    reading = WarnedSignal(ADAM_RATIO, "0.weight", 0.0, 1.0).start(model)
    assert reading.finish(model, optimizer) == adam_ratio(model, optimizer, "0.weight")


def test_a_precursor_is_proved_once_first_and_never_stands_for_a_later_jump() -> None:
    from trainguard import Guard, GuardConfig
    from trainguard.diagnose.counterfactual import Proof
    from trainguard.pipeline.context import StepContext
    from trainguard.pipeline.policy import Decision

    model = nn.Linear(3, 2)
    guard = Guard(model, torch.optim.Adam(model.parameters()),
                  config=GuardConfig(sinks={"console": False}, prove={"mode": "on"}),
                  replay_fn=lambda m, b: m(b).sum())
    prover = guard.run.prover

    def at(step: int, *events: Event) -> StepContext:
        ctx = StepContext(step=step, loss=None)
        ctx.batch = torch.zeros(1, 3)
        ctx.decide(Decision("applied"))  # type: ignore[arg-type]
        ctx.events.extend(events)
        return ctx

    precursor = warning(ADAM_RATIO, "weight")
    jump = Event("loss_spike", 40, "warning", "...")
    assert prover.wanted(at(30, precursor), guard.run.services)
    prover.warned_tried = True
    prover.proofs.append(Proof(30, Outcome("as_it_happened", "", 1.0, 1.0, 1.0), Baseline(),
                               True, "high", warned="x"))
    assert not prover.wanted(at(35, precursor), guard.run.services)  # once
    assert prover.wanted(at(40, jump), guard.run.services)  # the jump is still proved
    prover.warned_tried = False
    prover.proofs[0].warned = ""  # after another proof, a precursor is the fault's own
    assert not prover.wanted(at(50, precursor), guard.run.services)
    guard.close()


def test_a_warning_the_replay_does_not_reproduce_is_said_so() -> None:
    from trainguard.diagnose.counterfactual import Proof

    base = Baseline(1.0, 1.0, signal_bound=100.0, signal_what="the largest attention logit")
    calm = Outcome("as_it_happened", "", 1.0, 1.0, 1.0, signal=60.0, window=8)
    proof = Proof(30, calm, base, False, "", warned="the largest attention logit")
    assert proof.summary() == ("the warning is not reproduced: the replay kept the largest "
                               "attention logit at 60, under the warning's bound 100")
    assert proof.to_dict()["warned"] == "the largest attention logit"
    assert proof.to_dict()["baseline"]["signal_bound"] == 100.0
