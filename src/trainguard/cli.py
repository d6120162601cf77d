"""The `trainguard` command line.

    trainguard demo              a healthy and an exploding fine-tune, detected as they happen
    trainguard show RUN_DIR      what a run did: steps, losses, events, worst layers (--json)
    trainguard replay SNAPSHOT   rerun a crash snapshot's bad step and name where it went wrong
    trainguard doctor            audit a training setup before it runs

Problems with the input (a missing or corrupt run directory, bad arguments) print one message
and exit with code 2; nothing is written half-way.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from trainguard import __version__
from trainguard.errors import TrainguardError

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        print(f"trainguard: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="trainguard",
                     description="Keeps PyTorch fine-tuning runs from blowing up: watches every "
                                 "optimizer step, detects NaN/Inf, gradient explosions, loss "
                                 "spikes and divergence, protects the run and records it.")
    parser.add_argument("--version", action="version", version=f"trainguard {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    demo = commands.add_parser(
        "demo", help="train a tiny transformer twice: healthy, then with a far too high LR",
        description="Fine-tune a small randomly initialised transformer on a synthetic language "
                    "on the CPU, first healthy, then with a learning rate 300x too high and no "
                    "warmup. Detections are printed as they happen, then a summary.")
    demo.add_argument("--steps", type=_positive_int, default=300,
                      help="optimizer steps per run (default: 300)")
    demo.add_argument("--out", default="trainguard-demo",
                      help="directory for the two run directories (default: ./trainguard-demo)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")

    show = commands.add_parser(
        "show", help="summarise a run directory",
        description="Summarise a run recorded by trainguard: steps, loss (with NaN/inf counts), "
                    "actions taken, events, and the parameters with the worst gradients.")
    show.add_argument("run_dir", metavar="RUN_DIR", help="the run directory given to the Guard")
    show.add_argument("--json", action="store_true", help="print machine-readable JSON")
    show.add_argument("--events", type=int, default=20, metavar="N",
                      help="list at most N events (default: 20)")
    replay_cmd = commands.add_parser(
        "replay", help="rerun the bad step of a crash snapshot and name where it went wrong",
        description="Load a crash snapshot (weights_only), rebuild the model with FACTORY, restore "
                    "the state from just before the bad step and the RNG, rerun the saved batch "
                    "with forward and gradient hooks, and name the first non-finite module and "
                    "parameter. FACTORY is 'module:function' (or 'path/to/file.py:function'); the "
                    "function takes no arguments and returns (model, loss_fn) where "
                    "loss_fn(model, batch) -> loss.")
    replay_cmd.add_argument("snapshot", metavar="SNAPSHOT")
    replay_cmd.add_argument("--factory", required=True, metavar="FACTORY")
    replay_cmd.add_argument("--runs", type=_positive_int, default=2,
                            help="reruns, to tell deterministic from transient faults (default 2)")

    doctor = commands.add_parser(
        "doctor", help="audit a training setup before it runs (preflight)",
        description="Run trainguard's preflight audit on the objects FACTORY builds. FACTORY is "
                    "'module:function' (or 'path/to/file.py:function'); the function takes no "
                    "arguments and returns (model, optimizer) or (model, optimizer, scheduler).")
    doctor.add_argument("--factory", required=True, metavar="FACTORY")
    return parser


def _load_factory(spec: str) -> Any:
    import importlib
    import importlib.util
    from pathlib import Path

    from trainguard.errors import UsageError

    module_name, sep, function = spec.rpartition(":")
    if not sep or not module_name or not function:
        raise UsageError(f"FACTORY must look like 'module:function', got {spec!r}")
    try:
        if module_name.endswith(".py"):
            path = Path(module_name)
            if not path.is_file():
                raise UsageError(f"no file {path}")
            loaded = importlib.util.spec_from_file_location(path.stem, path)
            module = importlib.util.module_from_spec(loaded)  # type: ignore[arg-type]
            loaded.loader.exec_module(module)  # type: ignore[union-attr]
        else:
            module = importlib.import_module(module_name)
    except UsageError:
        raise
    except Exception as exc:
        raise UsageError(f"cannot import {module_name} ({type(exc).__name__}: {exc})") from None
    factory = getattr(module, function, None)
    if not callable(factory):
        raise UsageError(f"{module_name} has no function {function!r}")
    return factory


def _replay(args: argparse.Namespace) -> int:
    from trainguard.diagnose.replay import replay
    from trainguard.errors import SnapshotError, UsageError
    from trainguard.snapshot import load_snapshot, restore_rng_state

    snapshot = load_snapshot(args.snapshot)
    built = _load_factory(args.factory)()
    if not (isinstance(built, tuple) and len(built) == 2):
        raise UsageError("the factory must return (model, loss_fn)")
    model, loss_fn = built
    try:
        model.load_state_dict(snapshot["model"])
    except (RuntimeError, KeyError) as exc:
        raise SnapshotError(f"the snapshot does not fit the factory's model: "
                            f"{str(exc).splitlines()[0][:200]}") from None
    if snapshot.get("batch") is None:
        raise SnapshotError("the snapshot holds no batch (pass batch= to guard.step)")
    restore_rng_state(snapshot["rng"])
    report = replay(model, snapshot["batch"], loss_fn, runs=args.runs)
    print(f"snapshot of step {snapshot['step']}: {report.summary()}")
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from trainguard.diagnose.preflight import preflight
    from trainguard.errors import UsageError

    built = _load_factory(args.factory)()
    if not (isinstance(built, tuple) and len(built) in (2, 3)):
        raise UsageError("the factory must return (model, optimizer[, scheduler])")
    findings = preflight(*built)
    if not findings:
        print("preflight: no findings")
    for finding in findings:
        print(finding)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        if args.command == "demo":
            return _demo(args)
        if args.command == "show":
            return _show(args)
        if args.command == "replay":
            return _replay(args)
        if args.command == "doctor":
            return _doctor(args)
    except TrainguardError as exc:
        print(f"trainguard: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("trainguard: interrupted", file=sys.stderr)
        return 130
    parser.error(f"unknown command {args.command!r}")
    return EXIT_USAGE


def _demo(args: argparse.Namespace) -> int:
    from trainguard.demo.run import run_demo

    run_demo(steps=args.steps, out_dir=args.out, seed=args.seed)
    return 0


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _show(args: argparse.Namespace) -> int:
    from trainguard.store import RunReader
    from trainguard.store.writer import strict_json

    with RunReader(args.run_dir) as reader:
        summary = reader.summary()
    if args.json:
        print(json.dumps(strict_json(summary), indent=2, allow_nan=False))
        return 0
    out = sys.stdout
    loss = summary["loss"]
    out.write(f"run        {summary['run_dir']}\n")
    out.write(f"status     {summary['status']} (policy {summary['policy']}, "
              f"trainguard {summary['trainguard_version']})\n")
    if summary.get("snapshot"):
        out.write(f"snapshot   {summary['snapshot']}\n")
    out.write(f"steps      {summary['steps']} recorded"
              + (f" ({summary['first_step']}..{summary['last_step']})" if summary["steps"] else "")
              + "\n")
    out.write(f"loss       first {_fmt(loss['first'])}  last {_fmt(loss['last'])}  "
              f"min {_fmt(loss['min'])}  NaN {loss['nan']}  inf {loss['inf']}\n")
    out.write(f"grad norm  non-finite on {summary['grad_norm_nonfinite_steps']} step(s)\n")
    actions = ", ".join(f"{k} {v}" for k, v in sorted(summary["actions"].items())) or "-"
    out.write(f"actions    {actions}\n")
    by_kind = ", ".join(f"{k} {v}" for k, v in sorted(summary["events_by_kind"].items()))
    out.write(f"events     {len(summary['events'])}" + (f" ({by_kind})" if by_kind else "") + "\n")
    for event in summary["events"][: args.events]:
        out.write(f"  step {event['step']:>6}  {event['severity']:<8} {event['kind']:<22} "
                  f"{event['message']}\n")
    if len(summary["events"]) > args.events:
        out.write(f"  ... {len(summary['events']) - args.events} more (use --events N)\n")
    if summary.get("diagnosis"):
        out.write("likely causes\n")
        for cause in summary["diagnosis"][:3]:
            out.write(f"  {cause['code']:<20} {cause['confidence']:.0%}  "
                      f"{'; '.join(cause['evidence'][:2])}\n")
            out.write(f"  {'':<20}       fix: {cause['fix']}\n")
    serious = [f for f in summary.get("preflight", []) if f["severity"] != "info"]
    if serious:
        out.write("preflight\n")
        for finding in serious:
            out.write(f"  {finding['severity']:<8} {finding['check']:<14} {finding['message']}\n")
    if summary["worst_params"]:
        out.write("worst parameters (non-finite gradient steps, largest gradient norm)\n")
        width = max(len(w["param"]) for w in summary["worst_params"])
        for worst in summary["worst_params"]:
            out.write(f"  {worst['param']:<{width}}  non-finite {worst['nonfinite_steps']:>4}  "
                      f"max {_fmt(worst['max_grad_norm'])}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
