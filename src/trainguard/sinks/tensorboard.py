"""TensorBoard: what a run says, as event files TensorBoard (and anything that reads them) shows.

    from trainguard.sinks import TensorBoardSink
    guard = Guard(model, optimizer, sinks=[TensorBoardSink("runs/tb/exp1")])

Needs the `tensorboard` package (`pip install 'trainguard[tensorboard]'`); it writes through
`torch.utils.tensorboard.SummaryWriter`. What it writes, at the step it is about:

    every step      loss, loss_curvature, lr (lr/group_<i> with several parameter groups),
                    grad_norm (global, before clipping), clip_coef, loss_scale, skipped (1 when
                    the step's update was not applied), grad_norm/<param> (one per parameter),
                    and the non-finite counts nonfinite/loss, nonfinite/grad_norm (0 or 1) and
                    nonfinite/grads (parameters with a non-finite gradient norm)
    sampled steps   histograms/grad_norm (the per-parameter gradient norms), histograms/<key>
                    for the per-parameter statistics (weight_norm, weight_std, weight_maxabs,
                    update_ratio, optstate_*), and scalars <key>/<param> and <key>/<module>
                    (update_ratio/<param>, act_zero_frac/<module>, ...), output/<key>, with the
                    counts nonfinite/weights and nonfinite/activations
    evaluations     eval/<metric>
    samples         the image `samples` (a `sample_fn`'s samples, drawn; NaN and inf magenta),
                    samples/<statistic> and samples/degraded (1 while the judge holds them broken)
    text            events and actions (one entry per step), findings, config, verdict, status

TensorBoard drops NaN and inf points from its charts, so a non-finite value is not written as a
point: it shows as a count in `nonfinite/*` at its step, never as a silent gap. Writing stays off
the training loop's path: one summary per step is handed to the SummaryWriter's background
writer, histograms are made only on sampled steps, and the files are flushed at close. That
writer checksums every byte in Python (about 0.2 ms per KiB on a small CPU), and the
per-parameter tags are most of the bytes (about 55 per parameter): on a fast GPU step or a
model with many parameter tensors, `layer_every=10` writes them every 10th step only (and on
sampled and non-finite steps). The
directory is opened when the run starts (on rank 0 only, under torch.distributed); if it cannot
be used that is one warning and training goes on without this sink.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainguard.events import ActionRecord, Event, RunInfo, StepReport
from trainguard.sinks.base import Sink

if TYPE_CHECKING:
    from trainguard.finding import Finding
    from trainguard.probes.sample_sheet import SampleSheet
    from trainguard.run_verdict import RunVerdict
    from trainguard.signals import SampledStats

log = logging.getLogger("trainguard")

INSTALL_HINT = "pip install 'trainguard[tensorboard]'"
NOT_APPLIED = ("skipped", "halted", "rolled_back")
COUNTED_KEYS = {"weight_nonfinite": "nonfinite/weights", "act_nonfinite": "nonfinite/activations"}
"""Sampled keys written as a count of the parameters or modules they flag, not per layer."""
UNPLOTTED_KEYS = ("act_fp16",)
"""Sampled keys with nothing to plot (a 0/1 flag of the output's dtype)."""


def _summary_writer() -> Any:
    try:
        import tensorboard  # noqa: F401  (SummaryWriter needs it; say which extra brings it)
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise ImportError(f"TensorBoardSink needs the tensorboard package: {INSTALL_HINT} "
                          f"({exc})") from exc
    return SummaryWriter


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


class TensorBoardSink(Sink):
    """Writes scalars, histograms and text for TensorBoard into `log_dir`."""

    def __init__(self, log_dir: str | Path, *, layer_every: int = 1, flush_secs: int = 30,
                 max_queue: int = 1000) -> None:
        if layer_every < 1:
            raise ValueError(f"TensorBoardSink layer_every must be at least 1, got {layer_every}")
        self._writer_type = _summary_writer()  # a missing extra fails here, loudly
        from tensorboard.compat.proto.summary_pb2 import Summary

        self._summary = Summary
        self.log_dir = Path(log_dir)
        self.flush_secs = flush_secs
        self.max_queue = max_queue
        self.layer_every = layer_every
        """Per-parameter `grad_norm/<param>` every this many steps (and on sampled steps and
        steps with a non-finite gradient); the other scalars are written every step."""
        self.writer: Any = None
        self.failed: str | None = None
        """Why the directory could not be opened (then the sink does nothing)."""
        self._opened = False
        self._closed = False
        self._names: list[str] = []
        self._findings_seen = 0
        self._texts: dict[tuple[str, int], list[str]] = {}
        self._last_step = 0

    # -- writing ---------------------------------------------------------------------------------
    def _open(self) -> Any:
        if not self._opened:
            self._opened = True
            try:
                self.writer = self._writer_type(log_dir=str(self.log_dir),
                                                max_queue=self.max_queue,
                                                flush_secs=self.flush_secs)
            except Exception as exc:  # an unusable directory must not stop training
                self.failed = f"{type(exc).__name__}: {exc}"
                log.warning("trainguard: the TensorBoard directory %s cannot be used (%s); "
                            "training goes on without the TensorBoardSink", self.log_dir,
                            self.failed)
        return self.writer

    def _scalars(self, step: int, values: Iterable[tuple[str, float]]) -> None:
        """Write finite values as one summary: one event for many tags, made on this thread and
        written by the SummaryWriter's background thread."""
        writer = self._open()
        if writer is None:
            return
        points = [(tag, float(value)) for tag, value in values if math.isfinite(value)]
        if not points:
            return
        file_writer = getattr(writer, "_get_file_writer", None)
        if file_writer is None:  # a SummaryWriter without it: one call per tag
            for tag, value in points:
                writer.add_scalar(tag, value, step)
            return
        summary = self._summary(value=[self._summary.Value(tag=tag, simple_value=value)
                                       for tag, value in points])
        file_writer().add_summary(summary, step)

    def _histogram(self, tag: str, values: np.ndarray, step: int) -> None:
        writer = self._open()
        finite = np.asarray(values, dtype=np.float64)
        finite = finite[np.isfinite(finite)]
        if writer is not None and finite.size:
            writer.add_histogram(tag, finite, step)

    def _text(self, tag: str, step: int, line: str) -> None:
        if self._opened and self.writer is None:  # the directory failed: nothing to keep
            return
        self._texts.setdefault((tag, step), []).append(line)

    def _flush_texts(self) -> None:
        """Write the buffered text: one entry per tag and step (TensorBoard keeps one per step)."""
        writer = self._open()
        texts, self._texts = self._texts, {}
        if writer is None:
            return
        for (tag, step), lines in sorted(texts.items(), key=lambda item: item[0][1]):
            writer.add_text(tag, "  \n".join(lines), step)

    # -- the sink --------------------------------------------------------------------------------
    def on_run_start(self, run: RunInfo) -> None:
        self._names = list(run.param_names)
        if self._open() is None:
            return
        described = {"trainguard": run.trainguard_version, "integration": run.integration,
                     "parameters": len(run.param_names), "resume": run.resume,
                     "distributed": run.distributed, "config": run.config}
        self._text("config", 0, "```\n" + json.dumps(described, indent=2, default=str)
                   + "\n```")

    def on_findings(self, findings: list[Finding]) -> None:
        for finding in findings[self._findings_seen:]:
            self._text("findings", self._last_step, _escape(str(finding)))
        self._findings_seen = len(findings)

    def on_event(self, event: Event) -> None:
        where = f" ({event.param})" if event.param else ""
        self._text("events", event.step,
                   f"**{event.severity}** `{event.kind}`{_escape(where)}: "
                   f"{_escape(event.message)}")

    def on_action(self, action: ActionRecord) -> None:
        self._text("actions", action.step, f"`{action.kind}`: {_escape(action.message)}")
        if action.kind == "watch":  # parameters added mid-run: norms grow from this step
            self._names.extend(action.details.get("names", []))

    def on_step(self, report: StepReport) -> None:
        self._last_step = report.step
        if self._open() is None:
            return
        step = report.step
        values: list[tuple[str, float]] = [
            ("grad_norm", report.grad_norm), ("clip_coef", report.clip_coef),
            ("skipped", float(report.action in NOT_APPLIED)),
            ("nonfinite/loss", float(report.loss is not None and not math.isfinite(report.loss))),
            ("nonfinite/grad_norm", float(not math.isfinite(report.grad_norm)))]
        for tag, value in (("loss", report.loss), ("loss_curvature", report.loss_curvature),
                           ("lr", report.lr), ("loss_scale", report.loss_scale)):
            if value is not None:
                values.append((tag, value))
        signals = report.signals
        if signals is not None:
            norms = np.asarray(signals.param_grad_norm, dtype=np.float64)
            names = signals.param_names
            bad = float((~np.isfinite(norms)).sum())
            values.append(("nonfinite/grads", bad))
            if step % self.layer_every == 0 or report.sampled or bad:
                values.extend((f"grad_norm/{name}", float(norm))
                              for name, norm in zip(names, norms.tolist(), strict=False))
            if len(signals.group_lrs) > 1:
                values.extend((f"lr/group_{i}", lr) for i, lr in enumerate(signals.group_lrs))
            if report.sampled:
                self._histogram("histograms/grad_norm", norms, step)
        self._scalars(step, values)
        if signals is not None:
            self.on_sampled(signals.sampled)
        if self._texts:
            self._flush_texts()

    def on_sampled(self, stats: list[SampledStats]) -> None:
        if self._open() is None:
            return
        for sample in stats:  # each at the step it was measured
            values: list[tuple[str, float]] = []
            for key, array in sample.per_param.items():
                values.extend(self._per_layer(key, array, self._names))
                if key not in COUNTED_KEYS and key not in UNPLOTTED_KEYS:
                    self._histogram(f"histograms/{key}", array, sample.step)
            for key, array in sample.per_module.items():
                values.extend(self._per_layer(key, array, sample.module_names))
            values.extend((f"output/{key}", float(value)) for key, value in sample.output.items()
                          if isinstance(value, (int, float)))
            self._scalars(sample.step, values)

    @staticmethod
    def _per_layer(key: str, array: np.ndarray, names: list[str]) -> list[tuple[str, float]]:
        values = np.asarray(array, dtype=np.float64)
        if key in COUNTED_KEYS:  # 1 (or a non-zero share) where the layer holds NaN/inf
            flagged = (values != 0) | ~np.isfinite(values)
            return [(COUNTED_KEYS[key], float(flagged.sum()))]
        if key in UNPLOTTED_KEYS:
            return []
        return [(f"{key}/{name}", float(v))
                for name, v in zip(names, values.tolist(), strict=False)]

    def on_samples(self, sheet: SampleSheet) -> None:
        """The samples as an image (IMAGES tab; NaN and inf magenta) and their statistics."""
        writer = self._open()
        if writer is None:
            return
        writer.add_image("samples", sheet.pixels, sheet.step, dataformats="HWC")
        self._scalars(sheet.step, [(f"samples/{key}", float(value))
                                   for key, value in sheet.stats.items()]
                      + [("samples/degraded", float(sheet.degraded))])

    def on_eval(self, step: int, metrics: dict[str, float]) -> None:
        numbers = [(name, float(v)) for name, v in metrics.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)]
        self._scalars(step, [(f"eval/{name}", v) for name, v in numbers]
                      + [("nonfinite/eval", float(sum(not math.isfinite(v) for _, v in numbers)))])

    def on_verdict(self, verdict: RunVerdict) -> None:
        text = _escape(verdict.message)  # no verdict (too short to judge): the message says so
        self._text("verdict", self._last_step,
                   f"**{verdict.verdict}**: {text}" if verdict.verdict is not None else text)

    def on_run_end(self, status: str) -> None:
        self._text("status", self._last_step, f"run {status} at step {self._last_step}")
        self._flush_texts()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._texts:
            self._flush_texts()
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()


def _escape(text: str) -> str:
    """Text as TensorBoard's markdown shows it literally (no accidental emphasis or HTML)."""
    for char in "\\`*_<>[]":
        text = text.replace(char, "\\" + char)
    return text
