"""The console: what a person watching the run should read, on stderr.

Preflight and runtime findings of warning severity and worse; every event, followed by the
replay's summary, and the likely causes when their ranking changed (the top causes or their
order: an incident of many bad steps names its causes once, not once a step), but for events
that repeat: one of the same kind, severity and parameter as one within `REPEAT_QUIET` steps
before it is counted, not printed, and a line per `REPEAT_QUIET` steps of them (and one when
they stop or the run ends) says how many came in which steps ("[steps 11-55] ERROR
nonfinite_loss x45 more"); the actions that change the run beyond a step (halt, crash
snapshot, clipping taken over from a trainer); the diagnosis when the run halts; the verdict at
the end when the run degraded or recovered.

On a terminal (and with `rich` installed) a live progress line sits below them: step, loss,
gradient norm, LR, skipped steps and rollbacks, redrawn at most `refresh_per_second` times a
second, so the step pays a clock read, not a redraw. When the output is not a terminal the
console writes plain lines only; under a trainer that draws its own progress bar (the Hugging
Face and Lightning callbacks) there is no live line. This is the only place trainguard prints
during training; `GuardConfig(sinks={"console": False})` turns it off.
"""

from __future__ import annotations

import math
import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

from trainguard.events import ActionRecord, Event, RunInfo, StepReport
from trainguard.sinks.base import Sink
from trainguard.vocabulary import NOT_WORKING, RECOVERED

if TYPE_CHECKING:
    from trainguard.finding import Finding
    from trainguard.ranked_cause import RankedCause
    from trainguard.run_verdict import RunVerdict

_COLOURS = {"info": "36", "warning": "33", "error": "31", "critical": "1;31"}
_SHOWN_ACTIONS = ("halt", "snapshot", "clip_takeover", "checkpoint_kept", "report_to",
                  "kl_penalty")
REPEAT_QUIET = 50
"""An event of the same kind, severity and parameter as one fewer than this many steps before
it is counted, not printed, and each stretch of this many steps of them is said in one line: a
NaN left in the weights under observe raises the same errors at every step, a signal that keeps
growing through a divergence warns again every few steps, and every one is in `guard.events` and
the store. An event of another kind, or after a quiet stretch this long, is printed."""

RepeatKey = tuple[str, str, str | None]
"""An event's kind, severity and parameter: what makes events repeats of one another."""


class Repeats:
    """Events counted since the last line that said them, for one `RepeatKey`."""

    __slots__ = ("count", "first", "last")

    def __init__(self, step: int) -> None:
        self.count, self.first, self.last = 1, step, step

    def add(self, step: int) -> None:
        self.count += 1
        self.first, self.last = min(self.first, step), max(self.last, step)


class ConsoleSink(Sink):
    def __init__(self, stream: TextIO | None = None, *, colour: bool | None = None,
                 live: bool | None = None, refresh_per_second: float = 4.0) -> None:
        """`live`: draw the progress line (None: on a terminal, outside trainers that draw
        their own)."""
        self.stream = stream
        self.colour = colour
        self.live = live
        self.min_interval = 1.0 / refresh_per_second
        self._findings_seen = 0
        self._rolled_back_at: int | None = None
        self._audit_pending = False
        """The next findings are the preflight audit's (`RunInfo.preflight`)."""
        self._causes_shown: tuple[str, ...] = ()
        """The ranking (cause codes, best first) the last likely-causes line showed."""
        self._diagnosis: list[RankedCause] = []
        self._line: Any = None
        """The rich Live display while it runs."""
        self._text: Any = str
        self._last_draw = 0.0
        self._skips = 0
        self._rollbacks = 0
        self._events = 0
        self._seen: dict[RepeatKey, int] = {}
        """The step of the last event of each kind, severity and parameter (printed or not)."""
        self._held: dict[RepeatKey, Repeats] = {}
        """Repeated events counted and not said yet."""

    # -- output ----------------------------------------------------------------------------------
    def _target(self) -> TextIO:
        return self.stream or sys.stderr

    def _write(self, text: str, severity: str | None = None) -> None:
        stream = self._target()
        colour = self.colour if self.colour is not None else _isatty(stream)
        if colour and severity is not None:
            text = f"\033[{_COLOURS.get(severity, '0')}m{text}\033[0m"
        if self._line is not None:  # above the live line, which is redrawn below it
            self._line.console.file.write(text + "\n")
            self._line.refresh()
            return
        print(text, file=stream, flush=True)

    # -- the live line ---------------------------------------------------------------------------
    def on_run_start(self, run: RunInfo) -> None:
        self._audit_pending = run.preflight
        stream = self._target()
        wanted = self.live if self.live is not None else (_isatty(stream)
                                                            and not run.integration)
        if not wanted:
            return
        try:
            from rich.console import Console
            from rich.live import Live
            from rich.text import Text
        except ImportError:  # plain lines only
            return
        self._text = Text
        console = Console(file=stream, force_terminal=True if self.live else None,
                          soft_wrap=True)
        self._line = Live("", console=console, auto_refresh=False, transient=True,
                          redirect_stdout=False, redirect_stderr=False)
        self._line.start()

    def on_step(self, report: StepReport) -> None:
        if report.action == "skipped":
            self._skips += 1
        if self._held:  # repeats that stopped a quiet window ago are said now
            for key in [k for k, held in self._held.items()
                        if report.step - held.last >= REPEAT_QUIET]:
                self._say_repeats(key)
        if self._line is None:
            return
        now = time.monotonic()
        if now - self._last_draw < self.min_interval and not report.events:
            return
        self._last_draw = now
        self._line.update(self._text(self._status(report)), refresh=True)

    def _status(self, report: StepReport) -> str:
        parts = [f"step {report.step}", f"loss {_number(report.loss)}",
                 f"grad norm {_number(report.grad_norm)}"]
        if report.lr is not None:
            parts.append(f"lr {report.lr:.3g}")
        parts.append(f"skipped {self._skips}")
        if self._rollbacks:
            parts.append(f"rollbacks {self._rollbacks}")
        parts.append(f"events {self._events}")
        return "trainguard  " + "  ".join(parts)

    def _stop(self) -> None:
        if self._line is not None:
            line, self._line = self._line, None
            line.stop()

    # -- what the run says -----------------------------------------------------------------------
    def on_findings(self, findings: list[Finding]) -> None:
        label = "preflight" if self._audit_pending else "check"
        self._audit_pending = False
        for finding in findings[self._findings_seen:]:
            if finding.severity != "info":
                self._write(f"trainguard {label} {finding}", finding.severity)
        self._findings_seen = len(findings)

    def on_event(self, event: Event) -> None:
        self._events += 1
        if not self._counted(event):
            self._write(f"trainguard {event}", event.severity)
            replayed = event.details.get("replay")
            if isinstance(replayed, dict) and replayed.get("summary"):
                self._write(f"trainguard replay: {replayed['summary']}")
        # a repeat may still move the ranking: new evidence is said
        likely = event.details.get("likely_causes") or []
        ranking = tuple(str(c["code"]) for c in likely)
        if ranking and ranking != self._causes_shown:
            self._causes_shown = ranking
            self._write("trainguard likely causes: " + ", ".join(
                f"{c['code']} {c['confidence']:.0%}" for c in likely) + _fix(likely[0]))

    def on_action(self, action: ActionRecord) -> None:
        if action.kind == "rollback":
            self._rollbacks += 1
            self._rolled_back_at = action.step
        # an LR cut that comes with a rollback is in the rollback's own line
        if action.kind in _SHOWN_ACTIONS or (action.kind == "lr_change"
                                              and action.step != self._rolled_back_at):
            self._write(f"trainguard: {action.message}",
                        "critical" if action.kind == "halt" else None)

    def on_diagnosis(self, causes: list[RankedCause]) -> None:
        self._diagnosis = list(causes)

    def on_verdict(self, verdict: RunVerdict) -> None:
        self._stop()
        self._say_all_repeats()  # what the run said comes before the verdict on it
        if verdict.verdict in NOT_WORKING:
            self._write(f"trainguard verdict: {verdict.verdict.upper()}: {verdict.message}",
                        "warning")
        elif verdict.verdict == RECOVERED:
            self._write(f"trainguard verdict: recovered: {verdict.message}")

    def on_run_end(self, status: str) -> None:
        self._stop()
        self._say_all_repeats()
        if status == "halted" and self._diagnosis:
            self._write("trainguard diagnosis: " + " | ".join(str(c) for c in self._diagnosis[:3]))

    def close(self) -> None:
        self._stop()

    def _counted(self, event: Event) -> bool:
        """Whether `event` repeats one less than `REPEAT_QUIET` steps before it, and is counted
        instead of printed."""
        key: RepeatKey = (event.kind, event.severity, event.param)
        last = self._seen.get(key)
        self._seen[key] = event.step if last is None else max(last, event.step)
        held = self._held.get(key)
        if last is None or abs(event.step - last) >= REPEAT_QUIET:
            if held is not None:  # the stretch of repeats before the quiet one
                self._say_repeats(key)
            return False
        if held is not None and abs(event.step - held.first) >= REPEAT_QUIET:
            self._say_repeats(key)  # one line per stretch of REPEAT_QUIET steps
            held = None
        if held is None:
            self._held[key] = Repeats(event.step)
        else:
            held.add(event.step)
        return True

    def _say_all_repeats(self) -> None:
        for key in sorted(self._held, key=lambda k: self._held[k].first):
            self._say_repeats(key)

    def _say_repeats(self, key: RepeatKey) -> None:
        held = self._held.pop(key)
        kind, severity, param = key
        steps = (f"step {held.first}" if held.first == held.last
                 else f"steps {held.first}-{held.last}")
        on = f" on {param}" if param else ""
        self._write(f"trainguard [{steps}] {severity.upper()} {kind}{on} x{held.count} more "
                    "(repeats of the one printed; guard.events and `trainguard show` list each)",
                    severity)


def _isatty(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except ValueError:  # a closed stream
        return False


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if math.isfinite(value) else str(value)


def _fix(likely: dict[str, Any]) -> str:
    """The first likely cause's fix: the run's own words when the event carries them (sized to
    the model), else the catalogue's."""
    from trainguard.diagnose.causes import CAUSES

    fix = likely.get("fix")
    cause = CAUSES.get(str(likely.get("code")))
    if not isinstance(fix, str) or not fix:
        fix = cause.fix if cause is not None else ""
    return f". Fix: {fix}" if fix else ""
