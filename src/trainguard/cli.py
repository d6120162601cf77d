"""The `trainguard` command line.

    trainguard demo              a healthy and an exploding fine-tune, detected as they happen
    trainguard show RUN_DIR      what the latest run of a directory did (--run ID for another)
    trainguard runs RUN_DIR      every run recorded in a directory
    trainguard replay SNAPSHOT   rerun a crash snapshot's bad step and name where it went wrong
    trainguard prove SNAPSHOT    replay it under each candidate fix: causes confirmed or ruled out
    trainguard doctor            audit a training setup before it runs
    trainguard report RUN_DIR    one self-contained HTML report of a run (--out FILE.html)
    trainguard grafana --out DIR a Grafana dashboard for PrometheusSink, with its provisioning
    trainguard analyze PATH...   judge a training log after the fact (trainer_state.json,
                                 metrics.csv, TensorBoard, a run directory, JSONL, text logs)
    trainguard checkpoints DIR   the checkpoints under DIR with their health (trainguard.json)

Problems with the input (a missing or corrupt run directory or snapshot, a factory that fails,
bad arguments) print one line `trainguard: error: ...` on stderr and exit with code 2; nothing is
written half-way. Exit codes: 0 ok, 2 bad input, 130 interrupted. Text read from a store is shown
with control characters escaped (an escape sequence in a message prints as `\\x1b[31m`, never
reaches the terminal raw).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from trainguard.errors import TrainguardError
from trainguard.formatting import (
    local_time,
    short,
    sparkline,
    strict_json,
    visible,
)
from trainguard.version import __version__
from trainguard.vocabulary import NOT_WORKING

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
EXIT_CODES = "exit codes: 0 ok, 2 bad input (one error line on stderr), 130 interrupted."


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"trainguard: error: {visible(message)} (see '{self.prog} --help')",
              file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="trainguard",
                     description="Keeps PyTorch fine-tuning runs from blowing up: watches every "
                                 "optimizer step, detects NaN/Inf, gradient explosions, loss "
                                 "spikes and divergence, protects the run and records it.",
                     epilog=EXIT_CODES)
    parser.add_argument("--version", action="version", version=f"trainguard {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    _add_demo(commands)
    _add_show(commands)
    _add_runs(commands)
    _add_replay(commands)
    _add_prove(commands)
    _add_doctor(commands)
    _add_grafana(commands)
    _add_report(commands)
    _add_analyze(commands)
    _add_checkpoints(commands)
    return parser


def _add_demo(commands: Any) -> None:
    """`trainguard demo`: a healthy run, then one with a far too high LR."""
    demo = commands.add_parser(
        "demo", help="train a tiny transformer twice: healthy, then with a far too high LR",
        description="Fine-tune a small randomly initialised transformer on a synthetic language "
                    "on the CPU, first healthy, then with a learning rate 300x too high and no "
                    "warmup. Detections are printed as they happen, then a summary. Each run "
                    "directory keeps every demo run; `trainguard show` shows the latest.",
        epilog=EXIT_CODES)
    demo.add_argument("--steps", type=_positive_int, default=300,
                      help="optimizer steps per run (default: 300)")
    demo.add_argument("--out", default="trainguard-demo",
                      help="directory for the two run directories (default: ./trainguard-demo)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")


def _add_show(commands: Any) -> None:
    """`trainguard show`: the summary of a recorded run."""
    show = commands.add_parser(
        "show", help="summarise the latest run of a run directory",
        description="Summarise a run recorded by trainguard: status, steps, loss (with NaN/inf "
                    "counts), actions taken, events, and the parameters with the worst "
                    "gradients. A run directory keeps every run started in it; the latest is "
                    "shown unless --run picks another (list them with `trainguard runs`).",
        epilog=EXIT_CODES)
    show.add_argument("run_dir", metavar="RUN_DIR", help="the run directory given to the Guard")
    show.add_argument("--run", type=_positive_int, metavar="ID",
                      help="show run ID instead of the latest")
    show.add_argument("--json", action="store_true", help="print machine-readable JSON")
    show.add_argument("--events", type=_non_negative_int, default=20, metavar="N",
                      help="list at most N events (default: 20)")
    show.add_argument("--plain", action="store_true",
                      help="plain lines even on a terminal (pipes and files always get them)")


def _add_runs(commands: Any) -> None:
    """`trainguard runs`: the runs of a run directory."""
    runs = commands.add_parser(
        "runs", help="list the runs recorded in a run directory",
        description="List every run recorded in a run directory, oldest first: its id, when it "
                    "started and ended, its status, and how many steps and events it recorded.",
        epilog=EXIT_CODES)
    runs.add_argument("run_dir", metavar="RUN_DIR", help="the run directory given to the Guard")
    runs.add_argument("--json", action="store_true", help="print machine-readable JSON")


FACTORY_HELP = ("'module:function' (imported with the current folder on the path, as python -m "
                "does) or 'path/to/file.py:function' (with the file's folder on the path, as "
                "python file.py does)")


def _add_replay(commands: Any) -> None:
    """`trainguard replay`: rerun a crash snapshot's bad step."""
    replay_cmd = commands.add_parser(
        "replay", help="rerun the bad step of a crash snapshot and name where it went wrong",
        description="Load a crash snapshot (weights_only), rebuild the model with FACTORY, restore "
                    "the state from just before the bad step and the RNG, rerun the saved batch "
                    "with forward and gradient hooks, and name the first non-finite module and "
                    "parameter. FACTORY is 'module:function' (or 'path/to/file.py:function'); the "
                    "function takes no arguments and returns (model, loss_fn) where "
                    "loss_fn(model, batch) -> loss.",
        epilog=EXIT_CODES)
    replay_cmd.add_argument("snapshot", metavar="SNAPSHOT")
    replay_cmd.add_argument("--factory", required=True, metavar="FACTORY", help=FACTORY_HELP)
    replay_cmd.add_argument("--runs", type=_positive_int, default=2,
                            help="reruns, to tell deterministic from transient faults (default 2)")
    replay_cmd.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                            help="end after this long, the factory and its loss_fn included, "
                                 "with one error line if they are still running (default: no "
                                 "limit)")


def _add_prove(commands: Any) -> None:
    """`trainguard prove`: replay a crash snapshot's bad step under each candidate fix."""
    prove_cmd = commands.add_parser(
        "prove", help="replay the bad step of a crash snapshot under each candidate fix: causes "
                      "confirmed or ruled out",
        description="Load a crash snapshot (weights_only), rebuild the model and optimizer with "
                    "FACTORY, restore the state from just before the bad step and the RNG, and "
                    "replay the step once as it happened and once per candidate fix (LR x0.1, a "
                    "warm-up ramp, another precision, the batch without its flagged samples, "
                    "LoRA alpha/r 2, an over-scaled layer re-drawn, clipping). A cause whose fix "
                    "heals the step is confirmed, one whose fix does not is ruled out. FACTORY is "
                    "'module:function' (or 'path/to/file.py:function'); the function takes no "
                    "arguments and returns (model, optimizer, loss_fn) where loss_fn(model, "
                    "batch) -> loss.",
        epilog=EXIT_CODES)
    prove_cmd.add_argument("snapshot", metavar="SNAPSHOT")
    prove_cmd.add_argument("--factory", required=True, metavar="FACTORY", help=FACTORY_HELP)
    prove_cmd.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                           help="stop trying fixes after this long, and end then, the factory "
                                "and its loss_fn included, with one error line if they are "
                                "still running (default: no limit)")


def _add_doctor(commands: Any) -> None:
    """`trainguard doctor`: the preflight audit as a CI gate."""
    doctor = commands.add_parser(
        "doctor", help="audit a training setup before it runs (preflight)",
        description="Run trainguard's preflight audit on the objects FACTORY builds. FACTORY is "
                    "'module:function' (or 'path/to/file.py:function'); the function takes no "
                    "arguments and returns (model, optimizer) or (model, optimizer, scheduler). "
                    "As a CI gate: exits 1 when a finding reaches the --fail-on level.",
        epilog="exit codes: 0 ok (no finding at the --fail-on level), 1 findings at or above "
               "--fail-on, 2 bad input (one error line on stderr), 130 interrupted.")
    doctor.add_argument("--factory", required=True, metavar="FACTORY", help=FACTORY_HELP)
    doctor.add_argument("--fail-on", choices=("warning", "error", "never"), default="error",
                        help="the severity that makes the audit fail (default: error)")
    doctor.add_argument("--json", action="store_true",
                        help="print the findings as JSON: {findings: [...], failed: bool}")


def _add_grafana(commands: Any) -> None:
    """`trainguard grafana`: the dashboard and its provisioning."""
    grafana = commands.add_parser(
        "grafana", help="write a Grafana dashboard for PrometheusSink, with its provisioning",
        description="Write DIR/datasources/trainguard.yaml (a Prometheus datasource whose URL is "
                    "Grafana's environment variable TRAINGUARD_PROMETHEUS_URL), "
                    "DIR/dashboards/trainguard.yaml (a file provider) and "
                    "DIR/dashboards/trainguard.json (the dashboard: loss, curvature, gradient "
                    "norm, clipping, LR, loss scale, non-finite counts, skips, rollbacks, "
                    "per-layer heat maps, an annotation per event). Point Grafana's "
                    "provisioning directory at DIR. Existing files are replaced.",
        epilog=EXIT_CODES)
    grafana.add_argument("--out", required=True, metavar="DIR",
                         help="the provisioning directory to write")
    grafana.add_argument("--dashboards-path", metavar="PATH",
                         help="where Grafana will read DIR/dashboards (default: its absolute "
                              "path here; e.g. /etc/grafana/provisioning/dashboards in a "
                              "container)")


def _add_report(commands: Any) -> None:
    """`trainguard report`: one HTML report of a run."""
    report = commands.add_parser(
        "report", help="write one self-contained HTML report of a run",
        description="Write one HTML file that shows a recorded run and opens offline: loss and "
                    "LR with every event marked and skipped or rolled-back steps shaded, the "
                    "gradient norm against the clip level, per-parameter heat maps of gradient "
                    "norms, update ratios and weight health, activation panels, and the "
                    "verdict, likely causes, preflight findings and actions as tables. "
                    "Non-finite values are marked, never dropped. Needs plotly "
                    "(pip install 'trainguard[report]').",
        epilog=EXIT_CODES)
    report.add_argument("run_dir", metavar="RUN_DIR", help="the run directory given to the Guard")
    report.add_argument("--out", required=True, metavar="FILE.html",
                        help="the HTML file to write (replaced in one piece if it exists)")
    report.add_argument("--run", type=_positive_int, metavar="ID",
                        help="report run ID instead of the latest")
    report.add_argument("--open", action="store_true",
                        help="open the report in the web browser afterwards")


def _add_analyze(commands: Any) -> None:
    from trainguard.analyze import FORMATS

    formats = "; ".join(f"{name}: {what}" for name, what in FORMATS.items() if ":" not in name)
    analyze = commands.add_parser(
        "analyze", help="judge a training log after the fact: healthy, diverged or spiked and "
                        "recovered, from which step, and why",
        description="Read a training log and say whether the run is healthy, diverged (nan, "
                    "explosion, slow-divergence, collapse) or spiked and recovered, from which "
                    "logged step, the evidence, and the likely causes with their fixes. The "
                    "detectors of a live run are run over the logged values (their windows "
                    "counted in logged rows). PATH is a file or a run directory, or - for "
                    "standard input (paste a log: `trainguard analyze -`, then Ctrl-D); the "
                    f"format is detected unless --format names it ({formats}). Text logs are "
                    "read by what their lines hold (the HF Trainer's {'loss': ...} lines, "
                    "key=value and key: value pairs, tqdm bars, Keras and logging lines, "
                    "printed loss tensors). Several PATHs print a table.",
        epilog=EXIT_CODES)
    analyze.add_argument("paths", nargs="+", metavar="PATH",
                         help="a log file or directory, or - for standard input")
    analyze.add_argument("--format", choices=list(FORMATS), metavar="FORMAT",
                         help=f"read PATH as this format ({', '.join(FORMATS)})")
    analyze.add_argument("--json", action="store_true",
                         help="print {verdict, kind, onset_step, evidence, causes} as JSON (a "
                              "list for several PATHs)")
    analyze.add_argument("--run-id", metavar="ID",
                         help="the run to read of a W&B folder or an MLflow store that holds "
                              "several (default: the latest, named in the notes); PATH may be "
                              "an MLflow tracking URI, sqlite:///path/mlflow.db or "
                              "file:///path/mlruns")
    analyze.add_argument("--num-classes", type=_positive_int, metavar="K",
                         help="classes of the task, to judge the loss against chance, ln K "
                              "(default: guessed from the loss only when the log reports a "
                              "classifier's metrics, such as an accuracy; never for a language "
                              "model)")
    analyze.add_argument("--report", metavar="FILE.html",
                         help="also write an HTML report of one PATH: the logged curves with "
                              "the events marked, the verdict and the causes (a trainguard run "
                              "directory gets the full `trainguard report`)")


# -- factories -----------------------------------------------------------------------------------
def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:200]}" if text else type(exc).__name__


def _a(value: object) -> str:
    """'a str', 'an int': the type of a value, for messages."""
    name = type(value).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _load_factory(spec: str) -> Callable[[], Any]:
    """The factory of `module:function` or `path/to/file.py:function`, imported as Python would
    run it (`_import_path`)."""
    import importlib
    import importlib.util

    from trainguard.errors import UsageError

    module_name, sep, function = spec.rpartition(":")
    if not sep or not module_name or not function:
        raise UsageError(f"FACTORY must look like 'module:function', got {spec!r}")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise UsageError(f"no file {path}")
            _import_path(path.resolve().parent)
            loaded = importlib.util.spec_from_file_location(path.stem, path)
            if loaded is None or loaded.loader is None:
                raise UsageError(f"cannot import {path}")
            module = importlib.util.module_from_spec(loaded)
            loaded.loader.exec_module(module)
        else:
            _import_path(Path.cwd())
            module = importlib.import_module(module_name)
    except UsageError:
        raise
    except (Exception, SystemExit) as exc:
        raise UsageError(f"cannot import {module_name} ({_first_line(exc)})") from None
    if not hasattr(module, function):
        raise UsageError(f"{module_name} has no function {function!r}")
    factory = getattr(module, function)
    if not callable(factory):
        raise UsageError(f"the factory {spec} is {_a(factory)}, not a function")
    return factory


def _import_path(folder: Path) -> None:
    """Put `folder` first on the import path, as Python does for what it runs: the current
    folder for `python -m module`, the script's folder for `python file.py`. The `trainguard`
    command's own path holds neither, so a factory could not import itself or its neighbours."""
    import sys

    entry = str(folder)
    if entry not in sys.path:
        sys.path.insert(0, entry)


def _call_factory(spec: str, returns: str) -> tuple:
    from trainguard.errors import UsageError

    factory = _load_factory(spec)  # under a --budget, in its worker thread: import included
    try:
        built = factory()
    except (Exception, SystemExit) as exc:
        raise UsageError(f"the factory {spec} raised {_first_line(exc)}") from None
    if not isinstance(built, tuple):
        raise UsageError(f"the factory {spec} must return {returns}, got "
                         f"{_a(built)}")
    return built


def _replay(args: argparse.Namespace) -> int:
    from trainguard.deadline import Deadline

    deadline = Deadline(args.budget, "nothing was replayed")
    for line in deadline.run(lambda: _replay_lines(args, deadline)):
        print(line)
    return EXIT_OK


def _replay_lines(args: argparse.Namespace, deadline: Any) -> list[str]:
    import torch
    from torch import nn

    from trainguard.diagnose.replay import replay
    from trainguard.errors import SnapshotError, UsageError
    from trainguard.rng import put_process_state
    from trainguard.snapshot import load_snapshot

    deadline.doing = "the snapshot's load"
    snapshot = load_snapshot(args.snapshot)
    deadline.doing = "the factory"
    built = _call_factory(args.factory, "(model, loss_fn)")
    deadline.doing = "the replay"
    if len(built) != 2:
        raise UsageError(f"the factory {args.factory} must return (model, loss_fn), got "
                         f"{len(built)} values")
    model, loss_fn = built
    if not isinstance(model, nn.Module):
        raise UsageError(f"the factory {args.factory} must return a torch.nn.Module first, got "
                         f"{_a(model)}")
    if not callable(loss_fn):
        raise UsageError(f"the factory {args.factory} must return a callable "
                         f"loss_fn(model, batch) second, got {_a(loss_fn)}")
    try:
        model.load_state_dict(snapshot["model"])
    except Exception as exc:  # missing keys, wrong shapes or values that are not tensors
        raise SnapshotError(f"the snapshot does not fit the factory's model: "
                            f"{str(exc).strip().splitlines()[0][:200]}") from None
    if snapshot.get("batch") is None:
        raise SnapshotError("the snapshot holds no batch (pass batch= to guard.step)")
    try:
        put_process_state(snapshot["rng"])
    except Exception as exc:
        raise SnapshotError(f"{args.snapshot}: the RNG state cannot be restored "
                            f"({_first_line(exc)})") from None

    failures: list[str] = []

    def user_loss(model: nn.Module, batch: Any) -> torch.Tensor:
        # replay reports its own crashes as findings; a failing loss_fn is the user's input
        try:
            loss = loss_fn(model, batch)
        except Exception as exc:
            failures.append(f"the factory's loss_fn raised {_first_line(exc)}")
            raise
        if not isinstance(loss, torch.Tensor):
            failures.append(f"the factory's loss_fn returned {_a(loss)}, not a "
                            f"tensor")
            raise TypeError(failures[-1])
        return loss

    try:
        report = replay(model, snapshot["batch"],
                        deadline.calling("the factory's loss_fn", user_loss), runs=args.runs)
    except TrainguardError:
        raise
    except Exception as exc:
        raise UsageError(f"replay failed: {_first_line(exc)}") from None
    if failures:
        raise UsageError(f"replay failed on the snapshot's batch: {failures[0]}")
    return [f"snapshot of step {snapshot['step']}: {visible(report.summary())}"]


def _prove(args: argparse.Namespace) -> int:
    from trainguard.deadline import Deadline

    deadline = Deadline(args.budget)
    for line in deadline.run(lambda: _prove_lines(args, deadline)):
        print(line)
    return EXIT_OK


def _prove_lines(args: argparse.Namespace, deadline: Any) -> list[str]:
    """What `prove` prints, made in the budget's worker: printed whole or not at all."""
    import torch

    from trainguard.diagnose.counterfactual import Baseline, Setup, prove
    from trainguard.diagnose.ranking import rank_causes
    from trainguard.errors import SnapshotError, UsageError
    from trainguard.events import Event
    from trainguard.snapshot import load_snapshot

    deadline.doing = "the snapshot's load"
    snapshot = load_snapshot(args.snapshot)
    deadline.doing = "the factory"
    model, optimizer, loss_fn = _prove_factory(args.factory)
    deadline.doing = "the replays"
    loss_fn = deadline.calling("the factory's loss_fn", loss_fn)
    _load_into(snapshot, model, optimizer)
    if snapshot.get("batch") is None:
        raise SnapshotError("the snapshot holds no batch (pass batch= to guard.step)")
    try:
        events = [Event.from_dict(e) for e in snapshot.get("events") or []]
    except Exception:
        raise SnapshotError(f"{args.snapshot}: its events cannot be read") from None
    step = int(snapshot["step"])
    base = snapshot.get("baseline")
    numbers = {k: float(v) for k, v in (base.items() if isinstance(base, dict) else ())
               if k in ("loss", "grad_norm") and isinstance(v, (int, float))}
    recorded = snapshot.get("step_loss")  # older snapshots lack it: no faithfulness check
    setup = Setup(model=model, optimizer=optimizer, loss_fn=loss_fn, batch=snapshot["batch"],
                  previous_batch=snapshot.get("previous_batch"),  # older snapshots lack it
                  step=step, baseline=Baseline(numbers.get("loss"), numbers.get("grad_norm")),
                  autocast=torch.float16 if snapshot.get("scaler") else None,
                  original_finite=not any(e.step == step and e.kind.startswith("nonfinite")
                                          for e in events),
                  original_loss=float(recorded) if isinstance(recorded, (int, float)) else None,
                  earlier='a run with prove="on" (it keeps good states from before the damage '
                          "and replays from one; a crash snapshot holds only the state before "
                          "this step's own update)")
    try:  # the fixes are tried within what is left of the budget
        proof = prove(setup, likely=[c.code for c in rank_causes(events, top=100)],
                      budget_s=deadline.left())
    except Exception as exc:
        raise UsageError(f"prove failed: {_first_line(exc)}") from None
    lines = [f"snapshot of step {step}: {visible(proof.summary())}"]
    if proof.faithful is not None and setup.original_loss is not None:
        lines.append(
            f"  as it ran: the plain replay's loss {proof.plain.loss:.4g}, the step's "
            f"recorded {setup.original_loss:.4g}" + (
                " (the same: the replay runs as the step did)" if proof.faithful else
                " (not the same: the replay does not run as the step did; another RNG state, "
                "data pipeline or code)"))
    for intervention, outcome, healed in proof.trials:
        verdict = {True: "heals", False: "still bad", None: "says nothing"}[healed]
        lines.append(f"  {intervention.name:<15} {verdict:<12} loss {outcome.loss:.4g}, after "
                     f"the update {outcome.after:.4g}, gradient norm {outcome.grad_norm:.4g}")
    for name in proof.cannot_try:
        lines.append(f"  {name:<15} {'not tried':<12} the step is bad before its update: a "
                     "changed update cannot heal it from this state")
    for name in proof.not_tried:
        lines.append(f"  {name:<15} {'not tried':<12} no time left in the budget")
    return lines


def _prove_factory(spec: str) -> tuple[Any, Any, Any]:
    import torch
    from torch import nn

    from trainguard.errors import UsageError

    built = _call_factory(spec, "(model, optimizer, loss_fn)")
    if len(built) != 3:
        raise UsageError(f"the factory {spec} must return (model, optimizer, loss_fn), got "
                         f"{len(built)} values")
    model, optimizer, loss_fn = built
    if not isinstance(model, nn.Module):
        raise UsageError(f"the factory {spec} must return a torch.nn.Module first, got "
                         f"{_a(model)}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UsageError(f"the factory {spec} must return a torch.optim.Optimizer second, got "
                         f"{_a(optimizer)}")
    if not callable(loss_fn):
        raise UsageError(f"the factory {spec} must return a callable loss_fn(model, batch) "
                         f"third, got {_a(loss_fn)}")
    return model, optimizer, loss_fn


def _load_into(snapshot: dict[str, Any], model: Any, optimizer: Any) -> None:
    """The snapshot's model, optimizer and RNG state into the factory's objects."""
    from trainguard.errors import SnapshotError
    from trainguard.rng import put_process_state

    try:
        model.load_state_dict(snapshot["model"])
    except Exception as exc:  # missing keys, wrong shapes or values that are not tensors
        raise SnapshotError(f"the snapshot does not fit the factory's model: "
                            f"{str(exc).strip().splitlines()[0][:200]}") from None
    saved = snapshot.get("optimizer")
    try:
        optimizer.load_state_dict(saved[0] if isinstance(saved, list) else saved)
    except Exception as exc:
        raise SnapshotError(f"the snapshot does not fit the factory's optimizer: "
                            f"{_first_line(exc)}") from None
    try:
        put_process_state(snapshot["rng"])
    except Exception as exc:
        raise SnapshotError(f"the RNG state cannot be restored ({_first_line(exc)})") from None


def _doctor(args: argparse.Namespace) -> int:
    import torch
    from torch import nn

    from trainguard.diagnose.preflight import preflight
    from trainguard.errors import UsageError

    returns = "(model, optimizer[, scheduler])"
    built = _call_factory(args.factory, returns)
    if len(built) not in (2, 3):
        raise UsageError(f"the factory {args.factory} must return {returns}, got {len(built)} "
                         f"values")
    model, optimizer = built[0], built[1]
    if not isinstance(model, nn.Module):
        raise UsageError(f"the factory {args.factory} must return a torch.nn.Module first, got "
                         f"{_a(model)}")
    optimizers = optimizer if isinstance(optimizer, list) else [optimizer]
    if not optimizers or not all(isinstance(o, torch.optim.Optimizer) for o in optimizers):
        raise UsageError(f"the factory {args.factory} must return a torch.optim.Optimizer "
                         f"second, got {_a(optimizer)}")
    scheduler = built[2] if len(built) == 3 else None
    if scheduler is not None and not (callable(getattr(scheduler, "step", None))
                                      and callable(getattr(scheduler, "state_dict", None))):
        raise UsageError(f"the factory {args.factory} must return an LR scheduler (or None) "
                         f"third, got {_a(scheduler)}")
    try:
        findings = preflight(*built)
    except TrainguardError:
        raise
    except Exception as exc:
        raise UsageError(f"the preflight audit cannot read the factory's objects "
                         f"({_first_line(exc)})") from None
    from trainguard.events import at_least

    failed = args.fail_on != "never" and any(at_least(f.severity, args.fail_on)
                                             for f in findings)
    if args.json:
        sys.stdout.write(json.dumps(strict_json({"findings": [f.to_dict() for f in findings],
                                                 "fail_on": args.fail_on, "failed": failed}),
                                    indent=2, allow_nan=False) + "\n")
    else:
        lines = [str(finding) for finding in findings] or ["preflight: no findings"]
        if failed:
            lines.append(f"doctor: findings at or above {args.fail_on}: failing (exit 1)")
        _write_lines(lines)
    return EXIT_FINDINGS if failed else EXIT_OK


def _same_file(a: str, b: str) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


STDIN = "<stdin>"


def _analyze_stdin(args: argparse.Namespace) -> Any:
    """A log pasted or piped in: copied to a private file (at most `MAX_STDIN` bytes), analysed
    from there, named `<stdin>`."""
    import tempfile

    from trainguard.analyze.analysis import analyze
    from trainguard.analyze.log import LogError
    from trainguard.analyze.source import copy_stdin

    with tempfile.TemporaryDirectory(prefix="trainguard-stdin-") as folder:
        copy = Path(folder) / "stdin"
        with copy.open("wb") as out:
            try:
                copied = copy_stdin(sys.stdin.buffer, out, sys.stderr)
            except LogError as exc:
                raise LogError(f"{STDIN}: {exc}") from None
        if not copied or not _has_text(copy):
            raise LogError(f"{STDIN}: nothing was read from standard input (paste a log, then "
                           "Ctrl-D)")
        try:
            result = analyze(copy, fmt=args.format, num_classes=args.num_classes)
        except TrainguardError as exc:
            raise LogError(str(exc).replace(str(copy), STDIN)) from None
    result.path = STDIN
    if result.log is not None:
        result.log.path = STDIN
    return result


def _has_text(path: Path) -> bool:
    """Whether a file holds anything but white space, read a piece at a time."""
    with path.open("rb") as handle:
        while piece := handle.read(1 << 20):
            if piece.strip():
                return True
    return False


def _analyze(args: argparse.Namespace) -> int:
    """Never imports torch: the readers, the detectors and the ranking need none."""
    from trainguard.analyze.analysis import Analysis, analyze
    from trainguard.analyze.log import LogError
    from trainguard.analyze.summary import summary_lines, table_lines
    from trainguard.errors import UsageError

    if args.report and len(args.paths) != 1:
        raise UsageError("--report writes the report of one PATH; give only one")
    results: list[Analysis | tuple[str, str]] = []
    if args.paths.count("-") > 1:
        raise UsageError("- (standard input) can be given once")
    for path in args.paths:
        try:
            if path == "-":
                results.append(_analyze_stdin(args))
            else:
                results.append(analyze(path, fmt=args.format, num_classes=args.num_classes,
                                       run_id=args.run_id))
        except TrainguardError as exc:
            results.append((path, str(exc)))
        except (Exception, RecursionError) as exc:  # a file no reader foresaw: say which
            results.append((path, f"{path}: cannot be read as a training log "
                                  f"({_first_line(exc)})"))
    errors = [message for item in results if isinstance(item, tuple) for message in item[1:]]
    if len(results) == 1 and errors:
        raise LogError(errors[0])
    written = None
    if args.report:
        result = results[0]
        assert isinstance(result, Analysis)
        if result.format == "store":
            from trainguard.report import write_report

            written = write_report(result.path, args.report)
        else:
            from trainguard.analyze.report import log_run_data
            from trainguard.report.output import write_data_report

            if _same_file(args.report, result.path):
                raise UsageError(f"--report {args.report} is the log being analysed; write the "
                                 f"report elsewhere")
            written = write_data_report(log_run_data(result), args.report)
    if args.json:
        payload = [r.to_dict() if isinstance(r, Analysis) else {"path": r[0], "error": r[1]}
                   for r in results]
        sys.stdout.write(json.dumps(strict_json(payload[0] if len(payload) == 1 else payload),
                                    indent=2, allow_nan=False) + "\n")
    elif len(results) == 1:
        assert isinstance(results[0], Analysis)
        _write_lines(summary_lines(results[0]))
    else:
        _write_lines(table_lines(results))
    if written is not None:
        print(f"wrote {written.path}", file=sys.stderr)
    for message in errors:
        print(f"trainguard: error: {visible(message)}", file=sys.stderr)
    return EXIT_USAGE if errors else EXIT_OK


def _grafana(args: argparse.Namespace) -> int:
    from trainguard.errors import UsageError
    from trainguard.grafana import write_provisioning

    try:
        written = write_provisioning(args.out, args.dashboards_path)
    except OSError as exc:
        raise UsageError(f"cannot write the Grafana files under {args.out} ({_first_line(exc)})"
                         ) from None
    _write_lines([f"wrote {path}" for path in written])
    return EXIT_OK


def _report(args: argparse.Namespace) -> int:
    from trainguard.report import write_report

    written = write_report(args.run_dir, args.out, run=args.run)
    absent = f"; not recorded: {', '.join(written.absent)}" if written.absent else ""
    _write_lines([f"wrote {written.path} ({written.bytes / 1e6:.1f} MB, {written.plots} plots"
                  f"{absent})"])
    if args.open:
        import webbrowser

        webbrowser.open(written.path.resolve().as_uri())
    return EXIT_OK


# -- entry point -----------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    commands: dict[str, Callable[[argparse.Namespace], int]] = {
        "demo": _demo, "show": _show, "runs": _runs, "replay": _replay, "prove": _prove,
        "doctor": _doctor, "grafana": _grafana, "report": _report, "analyze": _analyze,
        "checkpoints": _checkpoints}
    command = commands.get(args.command)
    if command is None:
        parser.error(f"unknown command {args.command!r}")
        return EXIT_USAGE
    try:
        code = command(args)
        sys.stdout.flush()
    except TrainguardError as exc:
        print(f"trainguard: error: {visible(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        _quiet_stdout()  # the reader stopped reading (`| head`): nothing left to say
        return EXIT_OK
    except KeyboardInterrupt:
        print("trainguard: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return code


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's last flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _write_lines(lines: list[str]) -> None:
    """Write whole lines, control characters escaped; built first so that a failure while
    formatting writes nothing."""
    sys.stdout.write("".join(visible(line) + "\n" for line in lines))


def _demo(args: argparse.Namespace) -> int:
    from trainguard.demo.run import run_demo

    run_demo(steps=args.steps, out_dir=args.out, seed=args.seed)
    return EXIT_OK


# -- show and runs ---------------------------------------------------------------------------
_fmt = short
_when = local_time


def _status(summary: dict[str, Any]) -> str:
    error = summary.get("error")
    ended_by = (f" by {error['type']}" + (f": {error['message']}" if error["message"] else "")
                if error else "")
    line = (f"{summary['status']}{ended_by} (policy {_fmt(summary['policy'])}, "
            f"trainguard {_fmt(summary['trainguard_version'])})")
    if summary["status"] == "running" and summary.get("process") == "gone":
        line += (f"; its process {summary.get('pid')} is gone: it was killed before it could "
                 f"close the run")
    return line


def _show(args: argparse.Namespace) -> int:
    from trainguard.store import RunReader
    with RunReader(args.run_dir, run=args.run) as reader:
        summary = reader.summary()
        curves = {name: reader.scalar(name)[1] for name in ("loss", "grad_norm")}
    if args.json:
        sys.stdout.write(json.dumps(strict_json(summary), indent=2, allow_nan=False) + "\n")
        return EXIT_OK
    lines = _show_header(summary) + _show_curves(summary, curves)
    if not args.plain and sys.stdout.isatty():
        from trainguard.show_rich import render

        render(lines, summary, args.events, visible, _fmt)
        return EXIT_OK
    lines += _show_details(summary, args.events)
    _write_lines(lines)
    return EXIT_OK


def _show_header(summary: dict[str, Any]) -> list[str]:
    """`trainguard show`'s first lines: which run, its status and verdict, its time, the
    records the store lost, notes and the crash snapshot."""
    lines = []
    where = f"run {summary['run_id']} of {summary['runs']} in this directory"
    if summary["runs"] > 1:
        others = "earlier runs" if summary["run_id"] == summary["latest_run"] else "all runs"
        where += f"; {others}: trainguard runs {shlex.quote(summary['run_dir'])}"
    lines.append(f"run        {summary['run_dir']} ({where})")
    lines.append(f"status     {_status(summary)}")
    verdict = summary.get("verdict")
    if verdict and verdict["verdict"] is None:  # too short to judge: the message says so
        lines.append(f"verdict    {verdict['message']}")
    elif verdict:
        label = (verdict["verdict"].upper() if verdict["verdict"] in NOT_WORKING
                 else verdict["verdict"])
        lines.append(f"verdict    {label}: {verdict['message']}")
    span = f"started {_when(summary['started'])}"
    if summary["ended"] is not None:
        span += f", ended {_when(summary['ended'])}"
    if summary["resumed"]:
        span += f", resumed {summary['resumed']} time(s)"
    lines.append(f"time       {span}")
    if summary["store_failed"]:
        at = (f"step {summary['failed_step']}" if summary["failed_step"] is not None
              else "an unknown step")
        lines.append(f"store      stopped writing at {at}: {summary['store_failed']}; "
                     f"{summary['dropped_steps']} steps not recorded "
                     f"({summary['dropped']} records dropped)")
    elif summary["dropped"]:
        lines.append(f"store      {summary['dropped_steps']} steps not recorded "
                     f"({summary['dropped']} records dropped; the writer fell behind)")
    for note in summary["notes"]:
        lines.append(f"note       {note}")
    if summary.get("snapshot"):
        lines.append(f"snapshot   {summary['snapshot']}")
    return lines


def _show_curves(summary: dict[str, Any], curves: dict[str, Any]) -> list[str]:
    """The steps, the loss, gradient norm and LR curves, evaluations, actions, events."""
    lines = []
    loss = summary["loss"]
    lines.append(f"steps      {summary['steps']} recorded"
                 + (f" ({summary['first_step']}..{summary['last_step']})" if summary["steps"]
                    else ""))
    if curves["loss"].size or not summary["steps"]:
        lines.append(f"loss       first {_fmt(loss['first'])}  last {_fmt(loss['last'])}  "
                     f"min {_fmt(loss['min'])}  NaN {loss['nan']}  inf {loss['inf']}")
    else:  # a policy-gradient loop's surrogate: its steps were judged on the rest
        lines.append("loss       none handed to trainguard (the steps were judged on their "
                     "gradients and metrics)")
    for name, label in (("loss", "loss"), ("grad_norm", "grad norm")):
        if len(curves[name]):
            lines.append(f"{label:<10} {sparkline(curves[name])}  (log scale; ! non-finite)")
    for group, lr in enumerate(summary["lr"]):
        label = "lr" if len(summary["lr"]) == 1 else f"lr [{group}]"
        rise = lr["largest_rise"]
        jump = (f"  rose x{rise['ratio']:.3g} at step {rise['step']}"
                if rise is not None and rise["ratio"] >= 3 else "")
        lines.append(f"{label:<10} first {_fmt(lr['first'])}  last {_fmt(lr['last'])}  "
                     f"min {_fmt(lr['min'])}  max {_fmt(lr['max'])}{jump}")
    lines.append(f"grad norm  non-finite on {summary['grad_norm_nonfinite_steps']} step(s)")
    for record in summary.get("eval", []):
        shown = "  ".join(f"{k} {_fmt(v)}" for k, v in list(record["metrics"].items())[:6])
        lines.append(f"eval       step {record['step']}: {shown}")
    actions = ", ".join(f"{k} {v}" for k, v in sorted(summary["actions"].items())) or "-"
    lines.append(f"actions    {actions}")
    if summary["interventions"]:
        taken = ", ".join(f"{k} {v}" for k, v in sorted(summary["interventions"].items()))
        lines.append(f"guard did  {taken} (the Guard's own actions: `show --json` lists them "
                     "under \"interventions\")")
    by_kind = ", ".join(f"{k} {v}" for k, v in sorted(summary["events_by_kind"].items()))
    lines.append(f"events     {len(summary['events'])}" + (f" ({by_kind})" if by_kind else ""))
    return lines


def _show_details(summary: dict[str, Any], events: int) -> list[str]:
    """The plain listing's last lines: at most `events` events, likely causes, serious
    preflight findings, the worst parameters."""
    lines = []
    for event in summary["events"][: events]:
        lines.append(f"  step {event['step']:>6}  {event['severity']:<8} {event['kind']:<22} "
                     f"{event['message']}")
    if len(summary["events"]) > events:
        lines.append(f"  ... {len(summary['events']) - events} more (use --events N)")
    if summary.get("diagnosis"):
        lines.append("likely causes")
        for cause in summary["diagnosis"][:3]:
            lines.append(f"  {cause['code']:<20} {float(cause.get('confidence', 0)):.0%}  "
                         f"{'; '.join(cause.get('evidence', [])[:2])}")
            lines.append(f"  {'':<20}       fix: {cause['fix']}")
    serious = [f for f in summary.get("preflight", []) if f["severity"] != "info"]
    if serious:
        lines.append("preflight")
        for finding in serious:
            lines.append(f"  {finding['severity']:<8} {finding['check']:<14} "
                         f"{finding['message']}")
    if summary["worst_params"]:
        lines.append("worst parameters (non-finite gradient steps, largest gradient norm)")
        width = max(len(visible(w["param"])) for w in summary["worst_params"])
        for worst in summary["worst_params"]:
            lines.append(f"  {visible(worst['param']):<{width}}  non-finite "
                         f"{worst['nonfinite_steps']:>4}  max {_fmt(worst['max_grad_norm'])}")
    return lines


def _runs(args: argparse.Namespace) -> int:
    from trainguard.store import RunReader
    with RunReader(args.run_dir) as reader:
        runs = reader.runs()
        for run in runs:
            if run["status"] == "running":
                run["process"] = reader.process_state(run)
    if args.json:
        sys.stdout.write(json.dumps(strict_json(runs), indent=2, allow_nan=False) + "\n")
        return EXIT_OK
    lines = [f"runs in {args.run_dir} ({len(runs)}; `trainguard show RUN_DIR --run ID` shows "
             f"one)",
             f"{'id':>4}  {'started':<19}  {'ended':<19}  {'status':<12} {'steps':>7} "
             f"{'last step':>9} {'events':>7}  notes"]
    for run in runs:
        notes = []
        if run.get("process") == "gone":
            notes.append(f"process {run['pid']} gone without closing")
        if run["resumed"]:
            notes.append(f"resumed {run['resumed']}x")
        if run.get("error"):
            notes.append(f"ended by {run['error']}")
        if run["store_failed"]:
            notes.append(f"store stopped writing, {run['dropped_steps']} steps lost")
        if run.get("verdict") in NOT_WORKING:  # why: `show` says (the reasons vary)
            notes.append(f"{run['verdict'].upper()} (show --run {run['id']} says why)")
        lines.append(f"{run['id']:>4}  {_when(run['started']):<19}  {_when(run['ended']):<19}  "
                     f"{run['status']:<12} {run['steps']:>7} {_fmt(run['last_step']):>9} "
                     f"{run['events']:>7}  {'; '.join(notes)}".rstrip())
    _write_lines(lines)
    return EXIT_OK


# -- checkpoints -----------------------------------------------------------------------------
def _add_checkpoints(commands: Any) -> None:
    """`trainguard checkpoints`: the checkpoints of a run with their health."""
    checkpoints = commands.add_parser(
        "checkpoints", help="list the checkpoints under a folder with their health",
        description="List the checkpoints under OUTPUT_DIR (an HF Trainer output folder, a "
                    "Lightning checkpoint folder, a plain loop's folder) that have a "
                    "trainguard.json sidecar, oldest first, with their health when saved: "
                    "healthy, incident (inside an incident), recovered (after a rollback), "
                    "poisoned (non-finite weights or optimizer moments), changed (its files "
                    "are not those its sidecar describes: written again or changed in place) "
                    "or stale (the sidecar cannot be checked against them), and the newest "
                    "healthy one to resume from. No sidecar at all, or a corrupt one, exits 2.",
        epilog=EXIT_CODES)
    checkpoints.add_argument("output_dir", metavar="OUTPUT_DIR",
                             help="the folder the checkpoints were saved to")
    checkpoints.add_argument("--json", action="store_true",
                             help="print the checkpoints and their sidecars as JSON")


def _checkpoints(args: argparse.Namespace) -> int:
    from trainguard.checkpoints import CheckpointError, list_checkpoints, newest_healthy

    try:
        entries = list_checkpoints(args.output_dir)
    except OSError as exc:  # every read is guarded; whatever the file system does is input
        raise CheckpointError(f"cannot read {args.output_dir} "
                              f"({exc.strerror or type(exc).__name__})") from None
    best = newest_healthy(entries)
    if args.json:
        data = {"checkpoints": [e.to_dict() for e in entries],
                "last_healthy": str(best) if best is not None else None}
        sys.stdout.write(json.dumps(data, indent=2, allow_nan=False) + "\n")
        return EXIT_OK
    lines = [f"{'step':>7}  {'status':<9} {'weights':<10} {'optimizer':<10} {'verdict':<9} "
             f"{'events':>6}  checkpoint"]
    for entry in entries:
        health = entry.health
        assert health is not None  # list_checkpoints raised on unreadable sidecars
        note = f"  ({entry.problem})" if entry.problem else ""
        lines.append(f"{health.step:>7}  {entry.status:<9} {_finite(health.weights_finite):<10} "
                     f"{_finite(health.optimizer_finite):<10} {_fmt(health.verdict):<9} "
                     f"{len(health.open_events):>6}  {entry.path}{note}")
    lines.append(f"last healthy: {best}" if best is not None else
                 "no healthy checkpoint to resume from")
    _write_lines(lines)
    return EXIT_OK


def _finite(flag: bool | None) -> str:
    return "-" if flag is None else "finite" if flag else "NON-FINITE"


if __name__ == "__main__":
    raise SystemExit(main())
