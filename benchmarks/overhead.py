"""Per-step overhead of `trainguard.Guard` compared with a plain PyTorch training loop.

What it measures
    The wall-clock time of one optimizer step (forward, backward, update, zero_grad) for several
    variants of the same loop, on two workloads:

    gpt2   GPT2LMHeadModel(n_layer=6, n_embd=384, n_head=6, vocab_size=8192, n_positions=128),
           built from its config, batch 8 x 128 random token ids, labels = input ids, AdamW 1e-4
    mlp    Linear(512, 512) - ReLU - Linear(512, 10), batch 64 of random inputs and class labels,
           cross-entropy, AdamW 1e-3

    Variants:

    baseline            forward, backward, optimizer.step(), zero_grad(set_to_none=True)
    clip_grad_norm_     baseline plus torch.nn.utils.clip_grad_norm_(params, 1.0) before the step
    guard_default       guard.step(loss) with GuardConfig(sinks={"console": False}) and no run_dir
    guard_default+store the same with a run_dir in a temporary folder (SQLite store, written from
                        a background thread)
    guard_all_probes    guard_default with probes={"sample_all_steps": True}: weights, update
                        ratio, activation hooks and optimizer state on every step
    guard_recover       guard_default with policy="recover": guard_default plus the
                        good-state ring (a host copy of model and optimizer every 50 steps);
                        time it with --steps-per-round 50 so every block holds one copy, and read
                        its `vs guard_default` ratio (paired per round) for the ring's own cost
    guard_tb_prom       guard_default plus trainguard.sinks.TensorBoardSink (a temporary folder)
                        and trainguard.sinks.PrometheusSink (a free loopback port, not scraped);
                        read its `vs guard_default` ratio for the two sinks' cost (target <= 1.01x)
    guard_no_precursors guard_default without the every-step precursor probe, which is on by
                        default (`detectors={"instability_precursor": {"probe": False}}`);
                        guard_default over it, paired per round, is the probe's cost
                        (target <= 1.01x)
    guard_full_check    guard_default with the calm lane closed (`pipeline/calm.py`): the full check
                        on every step, as before the lane; read its `vs guard_default` ratio
                        (the lane's saving); timed only when named in --variants
    guard_prove_on      guard_default with prove={"mode": "on"}, the loss as replay_fn and the
                        batch given to guard.step: what a run that proves every incident pays
                        on healthy steps (the proof anchor's two good states, captured at the
                        ring's cadence; each step's batch reference, LRs and forward RNG
                        state); read its `vs guard_default` ratio; timed only when named in
                        --variants
    guard_deferred      guard_default with sync="deferred": the skip and clip decided on
                        the device, the step judged on the host one step later, no blocking
                        transfer; timed only when named in --variants; it needs a fused
                        optimizer, so naming it switches every variant to AdamW(fused=True) (as
                        --fused does), baseline included
    --references adds:
    detect_anomaly      baseline with torch.autograd.set_detect_anomaly(True) around forward and
                        backward
    hf_debug_underflow  baseline with transformers.debug_utils.DebugUnderflowOverflow(model)
    least_guard         the least a guarded step can do: every gradient's norm in one fused op,
                        the loss and the total norm in one transfer, a finiteness check and a
                        bound on the norm (no detector, no report, no store): the floor that a
                        guarded step could come down to on a calm step

How
    Every variant trains its own deep copy of one initial model, with its own AdamW, on the same
    cycle of pre-generated batches. Each variant first runs a few warm-up steps. Then, for R
    rounds, each variant in turn (the order rotates by one every round) runs a timed block of K
    steps, measured with time.perf_counter (with torch.cuda.synchronize before and after the block
    on CUDA; gc.collect() before each block, outside the timing). Reported per variant:

    ms/step   median over rounds of the block's time per step
    ratio     median over rounds of (variant block / baseline block of the same round); pairing
              blocks of the same round cancels slow drifts of the machine
    IQR       25th-75th percentile of those per-round ratios, to judge what the ratio can resolve
    sampled   timed steps on which the Guard ran its heavy probes (default: every 50th step and
              the step after any event), and events the Guard raised during the timed steps

    The default Guard runs its heavy probes every `probes.sample_every` (50) steps, so a short run
    (the gpt2 defaults time 36 steps per variant) mostly measures its light per-step path; the mlp
    defaults time enough steps to include sampled steps at their normal rate.

    With the defaults on a 2-core CPU the gpt2 ratios spread by about +-1.5% between rounds, so a
    1% difference is at the edge of what they resolve; more --rounds narrow it. Other processes
    distort the timings badly (with one OpenMP thread per core, a competing process can make
    steps ten times slower); the output states the share of CPU time other processes used while
    each workload ran. --threads 1 degrades more gracefully on a shared machine.

Usage
    python benchmarks/overhead.py                       # both workloads, default sizes
    python benchmarks/overhead.py --workload gpt2 --rounds 20 --steps-per-round 5
    python benchmarks/overhead.py --references --json benchmarks/results/overhead.json
    python benchmarks/overhead.py --workload gpt2 --variants guard_default,guard_recover \
        --steps-per-round 50 --rounds 4               # the good-state ring's cost
    python benchmarks/overhead.py --workload gpt2 --variants guard_default,guard_tb_prom \
        --rounds 8                                    # the TensorBoard and Prometheus sinks' cost
    python benchmarks/overhead.py --workload gpt2 --variants guard_default,guard_no_precursors \
        --rounds 12                                   # the precursor probe's cost
    python benchmarks/overhead.py --workload mlp \
        --variants clip_grad_norm_,guard_default,guard_deferred   # fused AdamW throughout
    python benchmarks/overhead.py --workload gpt2 --variants guard_default,guard_prove_on \
        --rounds 8 --steps-per-round 10               # what prove="on" costs a healthy step
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

import trainguard
from trainguard.sinks import PrometheusSink, Sink, TensorBoardSink

Batch = dict[str, torch.Tensor]
LossFn = Callable[[nn.Module, Batch], torch.Tensor]

WORKLOADS: tuple[str, ...] = ("gpt2", "mlp")
VARIANTS: tuple[str, ...] = ("baseline", "clip_grad_norm_", "guard_default", "guard_default+store",
                             "guard_all_probes", "guard_recover", "guard_tb_prom",
                             "guard_no_precursors", "guard_deferred", "guard_prove_on",
                             "guard_full_check")
OPT_IN_VARIANTS: tuple[str, ...] = ("guard_deferred", "guard_prove_on", "guard_full_check")
"""Timed only when named in --variants (guard_deferred changes every variant's optimizer)."""
REFERENCE_VARIANTS: tuple[str, ...] = ("detect_anomaly", "hf_debug_underflow", "least_guard")
CLIP_MAX_NORM = 1.0
PAIRED_WITH_DEFAULT = ("guard_recover", "guard_tb_prom", "guard_no_precursors",
                       "guard_prove_on", "guard_full_check")
"""Variants also reported against guard_default, paired per round: their own cost."""
MIN_ROUNDS = 3


# -- workloads ------------------------------------------------------------------------------------
@dataclass
class Workload:
    """One model, its batches and loss, and how long to measure it by default."""

    name: str
    model: nn.Module
    batches: list[Batch]
    compute_loss: LossFn
    lr: float
    rounds: int
    steps_per_round: int
    warmup: int
    fused: bool = False
    """Every variant's AdamW is fused (guard_deferred needs it)."""


def _gpt2_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    return model(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss


def _mlp_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    return nn.functional.cross_entropy(model(batch["x"]), batch["y"])


def build_workload(name: str, device: torch.device, seed: int = 0) -> Workload:
    """The initial model (on the host) and a cycle of batches (on `device`)."""
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        config = GPT2Config(n_layer=6, n_embd=384, n_head=6, vocab_size=8192, n_positions=128)
        model: nn.Module = GPT2LMHeadModel(config)
        batches = [{"input_ids": torch.randint(0, config.vocab_size, (8, 128),
                                               generator=generator).to(device)}
                   for _ in range(8)]
        return Workload(name, model, batches, _gpt2_loss, lr=1e-4, rounds=12, steps_per_round=3,
                        warmup=3)
    if name == "mlp":
        model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
        batches = [{"x": torch.randn(64, 512, generator=generator).to(device),
                    "y": torch.randint(0, 10, (64,), generator=generator).to(device)}
                   for _ in range(32)]
        return Workload(name, model, batches, _mlp_loss, lr=1e-3, rounds=30, steps_per_round=100,
                        warmup=20)
    raise ValueError(f"unknown workload {name!r}")


# -- variants -------------------------------------------------------------------------------------
class Variant:
    """The plain loop: forward, backward, optimizer.step(), zero_grad(set_to_none=True)."""

    def __init__(self, name: str, workload: Workload, device: torch.device) -> None:
        self.name = name
        self.model = copy.deepcopy(workload.model).to(device)
        self.model.train()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=workload.lr,
                                           fused=True if workload.fused else None)
        self.batches = workload.batches
        self.compute_loss = workload.compute_loss
        self._next = 0

    def _batch(self) -> Batch:
        batch = self.batches[self._next % len(self.batches)]
        self._next += 1
        return batch

    def forward_backward(self, batch: Batch) -> torch.Tensor:
        loss = self.compute_loss(self.model, batch)
        loss.backward()
        return loss

    def update(self, loss: torch.Tensor) -> None:
        self.optimizer.step()

    def step(self) -> None:
        loss = self.forward_backward(self._batch())
        self.update(loss)
        self.optimizer.zero_grad(set_to_none=True)

    def start_timing(self) -> None:
        """Called once after warm-up, before the timed rounds."""

    def stats(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


class ClipVariant(Variant):
    def update(self, loss: torch.Tensor) -> None:
        torch.nn.utils.clip_grad_norm_(self.params, CLIP_MAX_NORM)
        self.optimizer.step()


class GuardVariant(Variant):
    def __init__(self, name: str, workload: Workload, device: torch.device, *,
                 config: trainguard.GuardConfig, with_store: bool,
                 with_tb_prom: bool = False, replay: bool = False) -> None:
        super().__init__(name, workload, device)
        self.replay = replay
        self._batch_seen: Batch | None = None
        self._tmp = (tempfile.TemporaryDirectory(prefix="trainguard-bench-")
                     if with_store or with_tb_prom else None)
        sinks: list[Sink] = []
        if with_tb_prom and self._tmp is not None:
            sinks = [TensorBoardSink(Path(self._tmp.name) / "tb"),
                     PrometheusSink(port=0, linger_s=0)]
        self.guard = trainguard.Guard(self.model, self.optimizer, config=config,
                                      run_dir=self._tmp.name if with_store and self._tmp else None,
                                      sinks=sinks,
                                      replay_fn=workload.compute_loss if replay else None)
        self.sampled = 0
        self.timed_steps = 0
        self._events_before = 0

    def forward_backward(self, batch: Batch) -> torch.Tensor:
        self._batch_seen = batch if self.replay else None
        return super().forward_backward(batch)

    def update(self, loss: torch.Tensor) -> None:
        # deferred: the report is the step before's (None at the first); with a replay_fn the
        # Guard is given the batch, as a loop that can prove does
        report = self.guard.step(loss, batch=self._batch_seen)
        self.sampled += report is not None and report.sampled
        self.timed_steps += 1

    def start_timing(self) -> None:
        self.sampled = 0
        self.timed_steps = 0
        self._events_before = len(self.guard.events)

    def stats(self) -> dict[str, Any]:
        events = self.guard.events[self._events_before:]
        return {"sampled_steps": self.sampled, "timed_steps": self.timed_steps,
                "events": len(events), "event_kinds": sorted({e.kind for e in events})}

    def close(self) -> None:
        self.guard.close()
        if self._tmp is not None:
            self._tmp.cleanup()


class AnomalyVariant(Variant):
    def forward_backward(self, batch: Batch) -> torch.Tensor:
        with torch.autograd.set_detect_anomaly(True):
            return super().forward_backward(batch)


class DebugUnderflowVariant(Variant):
    def __init__(self, name: str, workload: Workload, device: torch.device) -> None:
        super().__init__(name, workload, device)
        from transformers.debug_utils import DebugUnderflowOverflow

        # registers a forward hook on every module of this copy; it stays for the copy's lifetime
        self.debug = DebugUnderflowOverflow(self.model)


class LeastGuardVariant(Variant):
    """`least_guard`: the norms, one transfer, skip a non-finite step, a bound on the norm."""

    BOUND = 10.0
    """A norm this many times the last one counts as abnormal (and is not applied)."""

    def __init__(self, name: str, workload: Workload, device: torch.device) -> None:
        super().__init__(name, workload, device)
        self.last_norm: float | None = None

    def update(self, loss: torch.Tensor) -> None:
        grads = [p.grad for p in self.params if p.grad is not None]
        total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        value, norm = torch.stack([loss.detach().float(), total.float()]).tolist()
        calm = (math.isfinite(value) and math.isfinite(norm)
                and (self.last_norm is None or norm <= self.BOUND * self.last_norm))
        if calm:
            self.last_norm = norm
            self.optimizer.step()


def make_variant(name: str, workload: Workload, device: torch.device) -> Variant:
    if name == "baseline":
        return Variant(name, workload, device)
    if name == "clip_grad_norm_":
        return ClipVariant(name, workload, device)
    if name == "guard_default":
        return GuardVariant(name, workload, device,
                            config=trainguard.GuardConfig(sinks={"console": False}),
                            with_store=False)
    if name == "guard_default+store":
        return GuardVariant(name, workload, device,
                            config=trainguard.GuardConfig(sinks={"console": False}),
                            with_store=True)
    if name == "guard_all_probes":
        return GuardVariant(name, workload, device,
                            config=trainguard.GuardConfig(probes={"sample_all_steps": True},
                                                          sinks={"console": False}),
                            with_store=False)
    if name == "guard_recover":
        return GuardVariant(name, workload, device,
                            config=trainguard.GuardConfig(policy="recover",
                                                          sinks={"console": False}),
                            with_store=False)
    if name == "guard_tb_prom":
        return GuardVariant(name, workload, device,
                            config=trainguard.GuardConfig(sinks={"console": False}),
                            with_store=False,
                            with_tb_prom=True)
    if name == "guard_no_precursors":
        return GuardVariant(name, workload, device, config=trainguard.GuardConfig(
            detectors=trainguard.DetectorConfig(instability_precursor={"probe": False}),
            sinks={"console": False}),
            with_store=False)
    if name == "guard_full_check":
        variant = GuardVariant(name, workload, device,
                               config=trainguard.GuardConfig(sinks={"console": False}),
                               with_store=False)
        variant.guard.run.calm = None
        return variant
    if name == "guard_deferred":
        return GuardVariant(name, workload, device,
                            config=trainguard.GuardConfig(sync="deferred",
                                                          sinks={"console": False}),
                            with_store=False)
    if name == "guard_prove_on":
        return GuardVariant(name, workload, device,
                            config=trainguard.GuardConfig(sinks={"console": False},
                                                          prove={"mode": "on"}),
                            with_store=False, replay=True)
    if name == "detect_anomaly":
        return AnomalyVariant(name, workload, device)
    if name == "hf_debug_underflow":
        return DebugUnderflowVariant(name, workload, device)
    if name == "least_guard":
        return LeastGuardVariant(name, workload, device)
    raise ValueError(f"unknown variant {name!r}")


# -- measuring ------------------------------------------------------------------------------------
def _synchronizer(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def time_block(variant: Variant, steps: int, sync: Callable[[], None]) -> float:
    """Milliseconds per step over one block of `steps` consecutive steps."""
    gc.collect()
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        variant.step()
    sync()
    return (time.perf_counter() - start) * 1e3 / steps


def rotations(names: list[str], rounds: int) -> Iterator[list[str]]:
    """Round r runs the variants starting from the r-th one, so no variant is always first."""
    for r in range(rounds):
        k = r % len(names)
        yield names[k:] + names[:k]


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def run_workload(workload: Workload, variant_names: list[str], device: torch.device,
                 rounds: int, steps: int, log: Callable[[str], None],
                 deadline: float | None = None) -> dict[str, Any]:
    """Warm up, then time `rounds` rounds; after `deadline` (perf_counter) no new round starts,
    once MIN_ROUNDS are done."""
    sync = _synchronizer(device)
    variants = [make_variant(name, workload, device) for name in variant_names]
    by_name = {v.name: v for v in variants}
    try:
        started = time.perf_counter()
        for variant in variants:
            for _ in range(workload.warmup):
                variant.step()
            sync()
            variant.start_timing()
        log(f"  warm-up ({workload.warmup} steps each): {time.perf_counter() - started:.1f} s")
        blocks: dict[str, list[float]] = {name: [] for name in variant_names}
        for r, order in enumerate(rotations(variant_names, rounds)):
            for name in order:
                blocks[name].append(time_block(by_name[name], steps, sync))
            log(f"  round {r + 1}/{rounds}: " + ", ".join(
                f"{name} {blocks[name][-1]:.2f}" for name in variant_names) + " ms/step")
            if deadline is not None and r + 1 >= MIN_ROUNDS and time.perf_counter() > deadline:
                log(f"  time limit reached: stopping after {r + 1} rounds")
                break
        base = blocks["baseline"]
        results: dict[str, Any] = {}
        for name in variant_names:
            ratios = [v / b for v, b in zip(blocks[name], base, strict=True)]
            extra: dict[str, Any] = {}
            if name in PAIRED_WITH_DEFAULT and "guard_default" in blocks:
                paired = [v / b for v, b in zip(blocks[name], blocks["guard_default"],
                                                strict=True)]
                extra["vs_guard_default"] = statistics.median(paired)
                extra["vs_guard_default_p25"] = _quantile(paired, 0.25)
                extra["vs_guard_default_p75"] = _quantile(paired, 0.75)
                extra["vs_guard_default_total"] = sum(blocks[name]) / sum(blocks["guard_default"])
            results[name] = {
                **extra,
                "ratio_total": sum(blocks[name]) / sum(base),
                "ms_per_step": statistics.median(blocks[name]),
                "ratio": statistics.median(ratios),
                "ratio_p25": _quantile(ratios, 0.25),
                "ratio_p75": _quantile(ratios, 0.75),
                "ms_per_step_rounds": blocks[name],
                "ratio_rounds": ratios,
                **by_name[name].stats(),
            }
        return results
    finally:
        for variant in variants:
            variant.close()


class ForeignLoad:
    """Share of the machine's CPU time that other processes used while this one measured.

    Benchmarks of a 2-core machine are only meaningful when nothing else runs; this makes a busy
    machine visible in the output. Reads /proc/stat, so it reports nothing outside Linux.
    """

    def __init__(self) -> None:
        self._start = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float, float] | None:
        try:
            with open("/proc/stat") as f:
                fields = [float(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        tick = os.sysconf("SC_CLK_TCK")
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
        own = os.times()
        return (sum(fields[:8]) - idle) / tick, sum(fields[:8]) / tick, own.user + own.system

    def share(self) -> float | None:
        """Other processes' CPU time as a fraction of all CPU time since construction."""
        end = self._sample()
        if self._start is None or end is None:
            return None
        busy, total, own = (e - s for e, s in zip(end, self._start, strict=True))
        return max(0.0, busy - own) / total if total > 0 else None


# -- reporting ------------------------------------------------------------------------------------
def format_table(results: dict[str, dict[str, Any]]) -> str:
    header = ("workload", "variant", "ms/step", "ratio", "ratio IQR", "sampled", "events")
    rows = [header]
    for workload, variants in results.items():
        for name, r in variants.items():
            sampled = (f"{r['sampled_steps']}/{r['timed_steps']}" if "sampled_steps" in r
                       else "-")
            events = str(r["events"]) if "events" in r else "-"
            rows.append((workload, name, f"{r['ms_per_step']:.3f}", f"{r['ratio']:.3f}x",
                         f"{r['ratio_p25']:.3f}-{r['ratio_p75']:.3f}", sampled, events))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    aligns = ["<", "<", ">", ">", ">", ">", ">"]
    lines = ["  ".join(f"{cell:{a}{w}}" for cell, a, w in zip(row, aligns, widths, strict=True))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def precursor_cost(variants: dict[str, Any]) -> float | None:
    """guard_default over guard_no_precursors, median of the per-round ratios (the inverse of
    the paired ratio reported for guard_no_precursors)."""
    paired = variants.get("guard_no_precursors", {}).get("vs_guard_default")
    return None if paired is None else 1.0 / paired


def check_targets(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The overhead targets, each with the measured values and whether it is met."""

    def ratio(workload: str, variant: str) -> float | None:
        return results.get(workload, {}).get(variant, {}).get("ratio")

    targets: list[dict[str, Any]] = []
    for workload in WORKLOADS:
        for variant in ("guard_default", "guard_deferred"):
            guard, clip = ratio(workload, variant), ratio(workload, "clip_grad_norm_")
            if variant == "guard_deferred" and guard is None:
                continue
            targets.append({
                "target": f"{workload}: {variant} <= clip_grad_norm_",
                "measured": None if guard is None or clip is None
                else f"{guard:.3f}x vs {clip:.3f}x",
                "met": None if guard is None or clip is None else guard <= clip})
    for variant, limit in (("guard_default", 1.01), ("guard_all_probes", 1.10)):
        value = ratio("gpt2", variant)
        targets.append({
            "target": f"gpt2: {variant} <= {limit:.2f}x",
            "measured": None if value is None else f"{value:.3f}x",
            "met": None if value is None else value <= limit})
    sinks = results.get("gpt2", {}).get("guard_tb_prom", {}).get("vs_guard_default")
    targets.append({
        "target": "gpt2: guard_tb_prom <= 1.01x guard_default",
        "measured": None if sinks is None else f"{sinks:.3f}x",
        "met": None if sinks is None else sinks <= 1.01})
    cost = precursor_cost(results.get("gpt2", {}))
    targets.append({
        "target": "gpt2: precursor probe <= 1.01x (guard_default vs guard_no_precursors)",
        "measured": None if cost is None else f"{cost:.3f}x",
        "met": None if cost is None else cost <= 1.01})
    return targets


def format_targets(targets: list[dict[str, Any]]) -> str:
    lines = ["Targets: guard_default <= clip_grad_norm_ on both workloads; "
             "guard_default <= 1.01x and guard_all_probes <= 1.10x on gpt2; the TensorBoard and "
             "Prometheus sinks <= 1.01x guard_default on gpt2; the precursor probe <= 1.01x "
             "on gpt2"]
    for t in targets:
        verdict = {True: "met", False: "NOT met", None: "not measured"}[t["met"]]
        measured = f" ({t['measured']})" if t["measured"] else ""
        lines.append(f"  {t['target']:<44} {verdict}{measured}")
    return "\n".join(lines)


# -- command line ---------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Per-step overhead of trainguard.Guard against a plain training loop.")
    parser.add_argument("--workload", choices=[*WORKLOADS, "all"], default="all",
                        help="which workload to measure (default: all)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="timed rounds per workload (default: gpt2 12, mlp 30)")
    parser.add_argument("--steps-per-round", type=int, default=None,
                        help="steps in each timed block (default: gpt2 3, mlp 100)")
    parser.add_argument("--warmup", type=int, default=None,
                        help="untimed steps per variant first (default: gpt2 3, mlp 20)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="torch device (default: cuda when available, else cpu)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch.set_num_threads (default: leave torch's default)")
    parser.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                        help="start no new round once the script has run this long (each "
                             f"workload still gets {MIN_ROUNDS} rounds); default: no limit")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH",
                        help="also write the results as JSON to PATH")
    parser.add_argument("--variants", default=None,
                        help=f"comma-separated subset of {', '.join(VARIANTS[1:])} (baseline is "
                             "always timed); default: all")
    parser.add_argument("--fused", action="store_true",
                        help="every variant trains with AdamW(fused=True) (implied by "
                             "guard_deferred)")
    parser.add_argument("--references", action="store_true",
                        help="add torch.autograd.set_detect_anomaly and transformers' "
                             "DebugUnderflowOverflow as reference variants (slow)")
    args = parser.parse_args(argv)
    for name in ("rounds", "steps_per_round", "warmup"):
        value = getattr(args, name)
        minimum = 0 if name == "warmup" else 1
        if value is not None and value < minimum:
            parser.error(f"--{name.replace('_', '-')} must be >= {minimum}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    workloads = list(WORKLOADS) if args.workload == "all" else [args.workload]
    variant_names = ([v for v in VARIANTS if v not in OPT_IN_VARIANTS]
                     + (list(REFERENCE_VARIANTS) if args.references else []))
    if args.variants:
        chosen = [v for v in args.variants.split(",") if v]
        unknown = [v for v in chosen if v not in VARIANTS + REFERENCE_VARIANTS]
        if unknown:
            print(f"error: unknown variant(s) {', '.join(unknown)}", file=sys.stderr)
            return 2
        variant_names = ["baseline", *[v for v in chosen if v != "baseline"]]
    fused = args.fused or "guard_deferred" in variant_names

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    started = time.perf_counter()
    results: dict[str, dict[str, Any]] = {}
    settings: dict[str, dict[str, int]] = {}
    for name in workloads:
        workload = build_workload(name, device)
        workload.fused = fused
        rounds = args.rounds or workload.rounds
        steps = args.steps_per_round or workload.steps_per_round
        if args.warmup is not None:
            workload.warmup = args.warmup
        log(f"{name}: {len(variant_names)} variants, warm-up {workload.warmup}, "
            f"{rounds} rounds x {steps} steps")
        load = ForeignLoad()
        deadline = None if args.time_limit is None else started + args.time_limit
        results[name] = run_workload(workload, variant_names, device, rounds, steps, log,
                                     deadline)
        done = len(results[name]["baseline"]["ms_per_step_rounds"])
        settings[name] = {"rounds": done, "steps_per_round": steps, "warmup": workload.warmup,
                          "other_cpu_share": load.share()}
    elapsed = time.perf_counter() - started

    targets = check_targets(results)
    print()
    print(f"trainguard {trainguard.__version__}, torch {torch.__version__}, device {device}, "
          f"torch threads {torch.get_num_threads()}, python {platform.python_version()}"
          + (", AdamW(fused=True) in every variant" if fused else ""))
    for name, s in settings.items():
        other = s["other_cpu_share"]
        busy = ("" if other is None else f"; other processes used {other:.0%} of the CPU time"
                + (" (timings disturbed)" if other > 0.05 else ""))
        print(f"{name}: {s['rounds']} rounds x {s['steps_per_round']} steps "
              f"(warm-up {s['warmup']}){busy}")
    print("ms/step = median over rounds of the block's time per step")
    print("ratio = median over rounds of (variant block / baseline block of the same round); "
          "IQR = 25th-75th percentile of those per-round ratios")
    print()
    print(format_table(results))
    for workload, variants in results.items():
        for name, what in (("guard_recover", "good-state ring"),
                           ("guard_tb_prom", "TensorBoard + Prometheus sinks"),
                           ("guard_prove_on", "proofs on every incident: the proof anchor, the "
                                              "step's RNG and batch references")):
            paired = variants.get(name, {})
            if "vs_guard_default" in paired:
                print(f"{workload}: {what} ({name} vs guard_default, paired per round): median "
                      f"{paired['vs_guard_default']:.3f}x, IQR "
                      f"{paired['vs_guard_default_p25']:.3f}-{paired['vs_guard_default_p75']:.3f}"
                      f", total time {paired['vs_guard_default_total']:.3f}x")
        cost = precursor_cost(variants)
        if cost is not None:
            print(f"{workload}: precursor probe (guard_default vs guard_no_precursors, paired per "
                  f"round): median {cost:.3f}x")
    print()
    print(format_targets(targets))
    print(f"\ntotal time {elapsed:.1f} s")

    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "meta": {"trainguard": trainguard.__version__, "torch": torch.__version__,
                     "python": platform.python_version(), "device": str(device),
                     "threads": torch.get_num_threads(), "settings": settings,
                     "fused": fused,
                     "ratio": "median over rounds of variant block / same-round baseline block",
                     "elapsed_s": elapsed},
            "results": results,
            "targets": targets,
        }
        args.json.write_text(json.dumps(payload, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
