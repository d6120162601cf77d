"""The command line: demo, show, runs, replay, doctor, and one clear message (exit code 2) for
bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import torch

import trainguard
from trainguard import GuardConfig
from trainguard.cli import main, visible
from trainguard.events import Event
from trainguard.signals import SampledStats
from trainguard.snapshot import build_snapshot, write_snapshot
from trainguard.store import RunStoreSink

from .conftest import make_setup
from .store.helpers import run_info, step_report
from .test_guard import train

SRC = Path(trainguard.__file__).resolve().parents[1]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainguard", *args], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(SRC)}, timeout=180)


def call(*args: str, capsys) -> tuple[int, str, str]:
    """Run the CLI in this process: (exit code, stdout, stderr)."""
    try:
        code = main(list(args))
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_error(code: int, out: str, err: str, *fragments: str) -> None:
    assert code == 2, err
    assert out == "", "nothing written on stdout"
    assert err.startswith("trainguard: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, err


@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("runs") / "nan-run"
    setup = make_setup()
    with trainguard.Guard(setup.model, setup.optimizer, run_dir=run_dir,
                          config=GuardConfig(sinks={"console": False})) as guard:
        train(guard, setup, 20, poison={7: float("nan")})
    return run_dir


def test_show_summarises_a_run(recorded_run: Path, capsys) -> None:
    assert main(["show", str(recorded_run)]) == 0
    out = capsys.readouterr().out
    assert "run 1 of 1 in this directory" in out
    assert "steps      20 recorded (0..19)" in out
    assert "NaN 1" in out
    assert "nonfinite_loss" in out and "nonfinite_grad" in out
    assert "skipped 1" in out
    assert "worst parameters" in out
    assert "likely causes" in out and "numerical_op" in out, "a NaN loss from a finite batch"


def test_show_a_run_handed_no_loss_draws_no_nan(tmp_path: Path, capsys) -> None:
    """A policy-gradient loop passes `None` as the loss: no step of it is a NaN."""
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    guard = trainguard.Guard(model, optimizer, run_dir=tmp_path,
                             config=GuardConfig(sinks={"console": False}))
    for _ in range(5):
        model(torch.randn(8, 4)).pow(2).mean().backward()
        guard.step(None)
        optimizer.zero_grad()
    guard.close()
    assert main(["show", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "loss       none handed to trainguard" in out
    assert not any(line.startswith("loss ") and "!" in line for line in out.splitlines())


def test_show_json_is_strict_json_with_nan_spelled_out(recorded_run: Path, capsys) -> None:
    assert main(["show", str(recorded_run), "--json"]) == 0
    data = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(c))
    assert data["steps"] == 20 and data["run_id"] == 1 and data["runs"] == 1
    assert data["loss"]["nan"] == 1
    assert data["events_by_kind"] == {"nonfinite_loss": 1, "nonfinite_grad": 1}
    nan_event = next(e for e in data["events"] if e["kind"] == "nonfinite_loss")
    assert nan_event["value"] == "nan" and nan_event["step"] == 7


def _corrupt_store(path: Path) -> Path:
    (path / "trainguard.db").write_bytes(b"garbage" * 500)
    return path


@pytest.mark.parametrize("make_bad, message", [
    (lambda p: p / "missing", "no run directory"),
    (lambda p: p, "not a trainguard run"),
    (lambda p: _corrupt_store(p), "corrupt"),
])
def test_show_bad_directories_exit_2_without_traceback(tmp_path: Path, make_bad,
                                                       message: str) -> None:
    result = run_cli("show", str(make_bad(tmp_path)))
    assert_one_error(result.returncode, result.stdout, result.stderr, message)


@pytest.mark.parametrize("args", [[], ["show"], ["nonsense"], ["demo", "--steps", "0"],
                                  ["demo", "--steps", "many"], ["runs"],
                                  ["show", "x", "--run", "0"]])
def test_bad_arguments_exit_2(args: list[str], capsys) -> None:
    code, _, err = call(*args, capsys=capsys)
    assert code == 2
    assert "Traceback" not in err


@pytest.mark.parametrize("value, message", [("-1", "must be 0 or more, got -1"),
                                            ("x", "expected a whole number, got 'x'"),
                                            ("1.5", "expected a whole number")])
def test_events_must_be_a_whole_number_of_at_least_0(tmp_path: Path, value: str, message: str,
                                                     capsys) -> None:
    code, out, err = call("show", str(tmp_path), "--events", value, capsys=capsys)
    assert_one_error(code, out, err, "--events", message)


def test_help_everywhere_states_the_exit_codes(capsys) -> None:
    for args in (["--help"], ["demo", "--help"], ["show", "--help"], ["runs", "--help"],
                 ["replay", "--help"], ["doctor", "--help"]):
        code, out, _ = call(*args, capsys=capsys)
        assert code == 0 and "usage: trainguard" in out
        flat = " ".join(out.split())
        assert "exit codes: 0 ok" in flat and "2 bad input" in flat, args
        assert "130 interrupted" in flat, args
    code, out, _ = call("doctor", "--help", capsys=capsys)
    assert "1 findings at or above --fail-on" in " ".join(out.split())


@pytest.mark.slow
def test_demo_runs_healthy_then_exploding_and_keeps_every_run(tmp_path: Path) -> None:
    result = run_cli("demo", "--steps", "60", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    err = result.stderr
    assert "healthy" in err and "exploding" in err
    assert "loss_spike" in err, "the explosion is reported as it happens"
    healthy = trainguard.RunReader(tmp_path / "healthy").summary()
    exploding = trainguard.RunReader(tmp_path / "exploding").summary()
    assert healthy["events"] == [] and healthy["status"] == "finished"
    assert exploding["events"] and exploding["loss"]["last"] > 3 * exploding["loss"]["first"]

    again = run_cli("demo", "--steps", "20", "--out", str(tmp_path))
    assert again.returncode == 0, again.stderr
    for name in ("healthy", "exploding"):
        with trainguard.RunReader(tmp_path / name) as reader:
            assert reader.run_ids == [1, 2]
            assert reader.summary()["steps"] <= 20, "show reads the latest run alone"
    shown = run_cli("show", str(tmp_path / "healthy"))
    assert "run 2 of 2 in this directory" in shown.stdout
    assert "steps      20 recorded (0..19)" in shown.stdout
    listed = run_cli("runs", str(tmp_path / "exploding"))  # the list claims no reason of its own
    assert "DEGRADED (show --run 1 says why)" in listed.stdout, listed.stdout


# -- a small store written directly, for show's output ------------------------------------------
def _small_run(run_dir: Path, *, message: str = "loss 9 vs 2", module: str = "block",
               events: int = 1) -> Path:
    sink = RunStoreSink(run_dir)
    sink.on_run_start(run_info(run_dir))
    stats = SampledStats(step=0, module_names=[module, "head"],
                         per_module={"act_maxabs": torch.tensor([1.0, 2.0]).numpy()})
    for step in range(3):
        found = [Event("loss_spike", step, "warning", f"{message} #{i}", param=module)
                 for i in range(events)] if step == 1 else []
        for event in found:
            sink.on_event(event)
        sink.on_step(step_report(step, events=found, sampled=[stats] if step == 1 else None))
    sink.on_run_end("finished")
    sink.close()
    return run_dir


def test_control_characters_from_a_store_are_shown_escaped(tmp_path: Path, capsys) -> None:
    run_dir = _small_run(tmp_path / "run\x1b]0;title\x07", message="\x1b[31mred\x1b[0m\nfake line",
                         module="evil\x1b[2J")
    code, out, _ = call("show", str(run_dir), capsys=capsys)
    assert code == 0
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b[31mred\\x1b[0m\\nfake line #0" in out
    assert "run\\x1b]0;title\\x07" in out
    code, out, _ = call("runs", str(run_dir), capsys=capsys)
    assert code == 0 and "\x1b" not in out and "\\x1b]0;title" in out
    code, out, _ = call("show", str(run_dir), "--json", capsys=capsys)
    assert code == 0 and "\x1b" not in out
    assert json.loads(out)["events"][0]["message"].startswith("\x1b[31mred")
    code, _, err = call("show", str(run_dir / "missing\x1b[31m"), capsys=capsys)
    assert code == 2 and "\x1b" not in err and "missing\\x1b[31m" in err
    assert visible("tab\there \u202e") == "tab\\there \\u202e"


def test_show_piped_into_head_exits_quietly(tmp_path: Path) -> None:
    run_dir = _small_run(tmp_path / "run", events=3000)
    command = (f"{sys.executable} -m trainguard show {run_dir} --events 100000 | head -1; "
               f"exit ${{PIPESTATUS[0]}}")
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(SRC)}, timeout=180)
    assert result.stdout.startswith("run ") and result.stdout.count("\n") == 1
    assert result.stderr == "", result.stderr
    assert result.returncode == 0


# -- replay and doctor ----------------------------------------------------------------------------
FACTORY = str(Path(__file__).parent / "diagnose" / "factory_for_cli.py")


def test_replay_a_crash_snapshot_names_the_bad_module(tmp_path: Path) -> None:
    from .diagnose.factory_for_cli import model_and_loss

    model, loss_fn = model_and_loss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    guard = trainguard.Guard(model, optimizer, run_dir=tmp_path,
                             config=GuardConfig(policy="halt", sinks={"console": False}))
    with torch.no_grad():
        model.blocks.layers[1].linear2.weight[0, 0] = float("nan")
    batch = {"input_ids": torch.randint(0, 32, (4, 9))}
    loss = loss_fn(model, batch)
    loss.backward()
    with pytest.raises(trainguard.TrainingDiverged) as info:
        guard.step(loss, batch=batch)
    result = run_cli("replay", info.value.snapshot_path, "--factory",
                     f"{FACTORY}:model_and_loss")
    assert result.returncode == 0, result.stderr
    assert "first non-finite output: blocks.layers.1.linear2 (Linear)" in result.stdout
    assert "deterministic" in result.stdout


@pytest.fixture(scope="module")
def snapshot_file(tmp_path_factory) -> Path:
    """A good snapshot of the CLI test factory's model, written without a Guard."""
    from .diagnose.factory_for_cli import model_and_loss

    model, _ = model_and_loss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    path = tmp_path_factory.mktemp("snap") / "step_3.pt"
    return write_snapshot(path, build_snapshot(step=3, model=model, optimizers=[optimizer],
                                               batch={"input_ids": torch.randint(0, 32, (2, 9))}))


def _bad_snapshots(root: Path, good: Path) -> dict[str, Path]:
    data = good.read_bytes()
    files = {"empty": b"", "truncated": data[: len(data) // 2], "corrupt": b"junk" * 50,
             "partial zip": data[:200]}
    paths = {}
    for name, content in files.items():
        paths[name] = root / f"{name.replace(' ', '_')}.pt"
        paths[name].write_bytes(content)
    paths["a tensor"] = root / "tensor.pt"
    torch.save(torch.zeros(3), paths["a tensor"])
    paths["other dict"] = root / "other.pt"
    torch.save({"weights": torch.zeros(3)}, paths["other dict"])
    snap = torch.load(good, weights_only=True)
    for name, key, value in (("step a string", "step", "three"), ("model a list", "model", [1]),
                             ("rng a string", "rng", "seed"), ("format a tensor", "format",
                                                               torch.ones(2)),
                             ("no numpy rng", "rng", {**snap["rng"], "numpy": None})):
        paths[name] = root / f"{name.replace(' ', '_')}.pt"
        torch.save({**snap, key: value}, paths[name])
    broken_zip = root / "broken_zip.pt"
    with zipfile.ZipFile(broken_zip, "w") as archive:
        archive.writestr("archive/data.pkl", b"\x80\x02not a pickle")
    paths["broken zip"] = broken_zip
    return paths


def test_unusable_snapshots_are_one_message(tmp_path: Path, snapshot_file: Path,
                                            capsys) -> None:
    for name, path in _bad_snapshots(tmp_path, snapshot_file).items():
        code, out, err = call("replay", str(path), "--factory", f"{FACTORY}:model_and_loss",
                              capsys=capsys)
        assert_one_error(code, out, err, str(path))
        assert "snapshot" in err, (name, err)


FACTORIES = textwrap.dedent("""
    import torch
    from torch import nn

    def model():
        return nn.Linear(2, 2)

    def raises():
        raise ValueError("no GPU here")

    def exits():
        raise SystemExit(5)

    NOT_CALLABLE = 3

    def not_a_tuple():
        return model()

    def three():
        return model(), None, None

    def not_a_module():
        return "model", lambda m, b: m(b).sum()

    def loss_not_callable():
        return model(), 3

    def no_optimizer():
        return model(), "adam"

    def bad_scheduler():
        m = model()
        return m, torch.optim.SGD(m.parameters(), lr=0.1), "cosine"

    def loss_raises():
        from tests_factory_helper import real_model
        return real_model(), lambda m, batch: batch["missing_key"]

    def loss_not_a_tensor():
        from tests_factory_helper import real_model
        return real_model(), lambda m, batch: 3.0
""")


@pytest.mark.parametrize("function, command, fragment", [
    ("raises", "replay", "raised ValueError: no GPU here"),
    ("exits", "doctor", "raised SystemExit"),
    ("NOT_CALLABLE", "replay", "is an int, not a function"),
    ("missing", "doctor", "has no function 'missing'"),
    ("not_a_tuple", "replay", "must return (model, loss_fn), got a Linear"),
    ("three", "replay", "got 3 values"),
    ("not_a_module", "replay", "torch.nn.Module first, got a str"),
    ("loss_not_callable", "replay", "callable loss_fn(model, batch) second, got an int"),
    ("not_a_tuple", "doctor", "must return (model, optimizer[, scheduler]), got a Linear"),
    ("no_optimizer", "doctor", "torch.optim.Optimizer second, got a str"),
    ("bad_scheduler", "doctor", "LR scheduler (or None) third, got a str"),
    ("loss_raises", "replay", "loss_fn raised KeyError: 'missing_key'"),
    ("loss_not_a_tensor", "replay", "loss_fn returned a float, not a tensor"),
])
def test_factories_that_fail_are_one_message(tmp_path: Path, snapshot_file: Path,
                                             function: str, command: str, fragment: str,
                                             capsys, monkeypatch) -> None:
    (tmp_path / "factories.py").write_text(FACTORIES)
    (tmp_path / "tests_factory_helper.py").write_text(textwrap.dedent(f"""
        import importlib.util
        spec = importlib.util.spec_from_file_location("cli_factory", {FACTORY!r})
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)

        def real_model():
            return module.model_and_loss()[0]
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = f"{tmp_path / 'factories.py'}:{function}"
    args = (["replay", str(snapshot_file), "--factory", spec] if command == "replay"
            else ["doctor", "--factory", spec])
    code, out, err = call(*args, capsys=capsys)
    assert_one_error(code, out, err, fragment)


def test_a_factory_file_imports_its_neighbours_as_python_file_py_would(
        tmp_path: Path, capsys, monkeypatch) -> None:
    """`path/to/file.py:function` runs with the file's folder on the import path, as `python
    file.py` would: a factory beside the training code imports it, from any current folder.
    The `trainguard` command's own import path holds neither folder."""
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    (project / "tg_cli_neighbour.py").write_text(textwrap.dedent(f"""
        import importlib.util
        spec = importlib.util.spec_from_file_location("tg_cli_tests_factory", {FACTORY!r})
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        clean_setup = module.clean_setup
    """))
    (project / "tg_cli_build.py").write_text(
        "from tg_cli_neighbour import clean_setup\n\ndef setup():\n    return clean_setup()\n")
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr(sys, "path", [p for p in sys.path
                                      if p not in ("", ".", str(project), str(elsewhere))])
    try:
        code, out, err = call("doctor", "--factory", f"{project / 'tg_cli_build.py'}:setup",
                              capsys=capsys)
    finally:
        sys.modules.pop("tg_cli_neighbour", None)
    assert code == 0, err
    assert out.startswith("preflight: no findings"), out


def test_replay_and_doctor_bad_input_exit_2(tmp_path: Path) -> None:
    garbage = tmp_path / "x.pt"
    garbage.write_bytes(b"junk" * 50)
    for args in (["replay", str(garbage), "--factory", f"{FACTORY}:model_and_loss"],
                 ["replay", str(tmp_path / "none.pt"), "--factory", "x:y"],
                 ["doctor", "--factory", "no_such_module_xyz:f"],
                 ["doctor", "--factory", "nocolon"]):
        result = run_cli(*args)
        assert_one_error(result.returncode, result.stdout, result.stderr)


def test_doctor_audits_a_setup_and_fails_a_ci_gate_on_errors() -> None:
    result = run_cli("doctor", "--factory", f"{FACTORY}:bad_setup")
    assert result.returncode == 1, result.stderr  # an ERROR finding, --fail-on error by default
    assert "ERROR mode_and_lr" in result.stdout and "adam_settings" in result.stdout
    assert "failing (exit 1)" in result.stdout
    assert run_cli("doctor", "--factory", f"{FACTORY}:bad_setup",
                   "--fail-on", "never").returncode == 0


@pytest.mark.parametrize(("factory", "fail_on", "code"), [
    ("warmup_only_setup", "error", 0), ("warmup_only_setup", "warning", 1),
    ("clean_setup", "warning", 0)])
def test_doctor_fail_on_levels(factory: str, fail_on: str, code: int) -> None:
    result = run_cli("doctor", "--factory", f"{FACTORY}:{factory}", "--fail-on", fail_on,
                     "--json")
    assert result.returncode == code, result.stderr
    report = json.loads(result.stdout)
    assert report["failed"] is (code == 1) and report["fail_on"] == fail_on
    assert all({"check", "severity", "message", "fix"} <= set(f) for f in report["findings"])


def test_sparklines_keep_spikes_and_show_non_finite_values() -> None:
    from trainguard.formatting import SPARKS, sparkline

    line = sparkline([1.0] * 50 + [1e6] + [1.0] * 49 + [float("nan")] + [1.0] * 99, width=40)
    assert len(line) == 40
    assert SPARKS[-1] in line, "the spike is not averaged away"
    assert line.count("!") == 1, "the NaN step is shown"
    assert sparkline([]) == "" and sparkline([float("inf")] * 3) == "!!!"


def test_show_on_a_terminal_draws_rich_tables(recorded_run: Path, monkeypatch, capsys) -> None:
    import io

    from trainguard.show_rich import render

    monkeypatch.setattr(sys.stdout, "isatty", lambda: True, raising=False)
    assert main(["show", str(recorded_run)]) == 0
    out = capsys.readouterr().out
    assert "events (" in out and "likely causes" in out and "worst parameters" in out
    assert "─" in out, "table rules"
    assert main(["show", str(recorded_run), "--plain"]) == 0
    assert "─" not in capsys.readouterr().out

    with trainguard.RunReader(recorded_run) as reader:
        summary = reader.summary()
    summary["events"][0]["message"] = "[bold red]not markup[/bold red] \x1b[2J"
    summary["worst_params"][0]["param"] = "[blink]evil[/blink]"
    drawn = io.StringIO()
    render(["run        x"], summary, 20, visible, str, file=drawn, width=200,
           force_terminal=False)
    text = drawn.getvalue()
    assert "[bold red]not markup[/bold red] \\x1b[2J" in text
    assert "[blink]evil[/blink]" in text and "\x1b" not in text
