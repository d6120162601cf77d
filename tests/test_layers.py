"""The layering rules of trainguard's source, checked on the code itself.

- No import loop among trainguard's modules (except the allow-listed ones, each with its reason),
  type-checking imports included: a loop the type checker needs is a loop in the design.
- Nothing imports the command line (`trainguard.cli`) but `trainguard.__main__`.
- `trainguard.analyze` imports no sink and no store writer; `trainguard.config` imports no torch
  and no clipping code (`trainguard.remedies`).
- `GuardConfig` has at most `MAX_TOP_LEVEL_FIELDS` fields; `DetectorConfig` holds sections only,
  each knowing its dotted place.
- No function is longer than `MAX_FUNCTION_LINES`.
- No stage reads the sync mode (`StepContext.on_device`, `Run.deferral`): each is handed what
  it needs; the mode (`sync="deferred"`) is defined in `pipeline/deferred.py` alone.
- `Services` holds no run state: everything Stateful is in `RunState`.
- One module computes the clip limit in force (`remedies/limit.py`): no other reads the
  adaptive clip's limit or falls back to the configured one.

The import graph is read statically with `ast`: every runtime import counts, at module level and
inside functions alike (a lazy import inside a function is still a dependency, and a loop hidden
that way is still a loop); imports under `if TYPE_CHECKING:` do not run and are left out.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "trainguard"

MAX_FUNCTION_LINES = 80

CYCLE_ALLOWED: dict[str, str] = {}
"""Module prefix -> why an import loop that passes through it is tolerated for now."""

LONG_FUNCTIONS_ALLOWED: dict[str, str] = {}
"""`module:qualified name` -> why it may be longer than MAX_FUNCTION_LINES for now."""

STAGE_MODULES = {f"trainguard.pipeline.{name}" for name in
                 ("measure", "detect", "explain", "decide", "act", "settle", "record")}
"""Where the stages live: each is a function of (ctx, state, services) and of the results of the
stages before it that it reads."""
CHECK_MODULES = {f"trainguard.pipeline.{name}" for name in
                 ("measure", "detect", "explain", "decide", "act", "deferred")}
"""Where the stages before the update live (and the deferred mode's, their counterparts)."""
SET_FROM_RESULTS = ("measured", "signals", "fired", "decision")
"""What the pipeline sets on the `StepContext` from the stages' results, for the settling."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _imported(module: str, path: Path, type_checking: bool = False) -> set[str]:
    """The trainguard modules `module` imports when it runs (module level and in functions);
    with `type_checking`, those it imports for the type checker only as well."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child) and not type_checking:
                for other in child.orelse:
                    visit_node(other)
            else:
                visit_node(child)

    def visit_node(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:  # `from pkg import submodule` depends on the submodule
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in MODULES else target)
        else:
            visit(node)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return {name for name in found if name in MODULES and name != module}


GRAPH = {module: _imported(module, path) for module, path in MODULES.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))
    return cycles


def _allowed(cycle: list[str]) -> bool:
    return any(m == prefix or m.startswith(prefix + ".") for m in cycle for prefix in CYCLE_ALLOWED)


def test_the_cycle_finder_finds_a_loop() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c"]]


def test_no_import_loop_among_trainguard_modules() -> None:
    loops = [cycle for cycle in import_cycles(GRAPH) if not _allowed(cycle)]
    assert loops == [], f"import loops: {loops}"


def test_no_import_loop_even_through_type_checking_imports() -> None:
    graph = {module: _imported(module, path, type_checking=True)
             for module, path in MODULES.items()}
    loops = [cycle for cycle in import_cycles(graph) if not _allowed(cycle)]
    assert loops == [], f"import loops (type-checking imports included): {loops}"


def test_only_main_imports_the_command_line() -> None:
    importers = sorted(m for m, deps in GRAPH.items()
                       if "trainguard.cli" in deps and m != "trainguard.__main__")
    assert importers == [], f"{importers} import trainguard.cli: move what they need below it " \
                            f"(trainguard.formatting)"


def _loaded_after_importing(modules: list[str]) -> set[str]:
    """sys.modules of a fresh interpreter after importing `modules` (and the submodules of any
    package among them)."""
    code = "\n".join([
        "import importlib, json, pkgutil, sys",
        f"for name in {modules!r}:",
        "    module = importlib.import_module(name)",
        "    for info in pkgutil.walk_packages(getattr(module, '__path__', []), name + '.'):",
        "        importlib.import_module(info.name)",
        "print(json.dumps(sorted(sys.modules)))",
    ])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout))


def test_analyze_imports_no_sink_and_no_store_writer() -> None:
    loaded = _loaded_after_importing(["trainguard.analyze"])
    unwanted = sorted(m for m in loaded
                      if m.startswith(("trainguard.sinks", "trainguard.cli", "torch"))
                      or m in ("trainguard.store.writer", "trainguard.store.sink"))
    assert unwanted == []


def test_config_imports_no_torch() -> None:
    loaded = _loaded_after_importing(["trainguard.config"])
    assert sorted(m for m in loaded if m == "torch" or m.startswith("torch.")) == []


def test_config_imports_no_remedies() -> None:
    """The configuration is plain data: reading or building one needs no clipping code (a rule
    given as an object is turned into its spec by `trainguard.remedies`, imported then)."""
    loaded = _loaded_after_importing(["trainguard.config"])
    assert sorted(m for m in loaded if m.startswith("trainguard.remedies")) == []
    assert not any(m.startswith("trainguard.remedies") for m in GRAPH["trainguard.detect.settings"])


MAX_TOP_LEVEL_FIELDS = 10
"""The most fields `GuardConfig` holds itself: the rest live in its sections."""


def test_the_guard_config_is_a_handful_of_fields_and_sections() -> None:
    from trainguard.config import GuardConfig

    fields = dataclasses.fields(GuardConfig)
    assert len(fields) <= MAX_TOP_LEVEL_FIELDS, [f.name for f in fields]


def _sections(config: object, path: str = "") -> Iterator[tuple[str, object]]:
    """(dotted place, section) of every section under `config`."""
    for f in dataclasses.fields(config):  # type: ignore[arg-type]
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            place = f"{path}.{f.name}" if path else f.name
            yield place, value
            yield from _sections(value, place)


def test_no_detector_setting_is_a_flat_field_of_the_detector_config() -> None:
    from trainguard.config import DetectorConfig

    config = DetectorConfig()
    flat = [f.name for f in dataclasses.fields(config)
            if not dataclasses.is_dataclass(getattr(config, f.name))]
    assert flat == []


def test_every_section_knows_its_place() -> None:
    """A section names its bad values by its full dotted place, so its `PATH` must be it."""
    from trainguard.config import GuardConfig

    places = dict(_sections(GuardConfig()))
    assert places
    for place, section in places.items():
        assert getattr(section, "PATH", None) == place, place


def _functions(path: Path) -> Iterator[tuple[str, int]]:
    """(qualified name, lines from `def` to its last line) of every function in `path`."""
    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert child.end_lineno is not None
                yield prefix + child.name, child.end_lineno - child.lineno + 1
                yield from walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)
    yield from walk(ast.parse(path.read_text(encoding="utf-8")), "")


def test_no_function_is_too_long() -> None:
    long = [f"{module}:{name} ({lines} lines)" for module, path in MODULES.items()
            for name, lines in _functions(path)
            if lines > MAX_FUNCTION_LINES and f"{module}:{name}" not in LONG_FUNCTIONS_ALLOWED]
    assert long == [], f"split into named parts: {long}"


def test_the_stages_import_neither_the_run_nor_each_other() -> None:
    """Counting imports for the type checker too: a loop hidden behind TYPE_CHECKING is a loop."""
    wrong = {module: sorted(found) for module in sorted(STAGE_MODULES)
             if (found := _imported(module, MODULES[module], type_checking=True)
                 & (STAGE_MODULES | {"trainguard.pipeline.run", "trainguard.pipeline.steps"}))}
    assert wrong == {}
    pipeline = {m: {d for d in _imported(m, p, type_checking=True) if d.startswith(m[:19])}
                for m, p in MODULES.items() if m.startswith("trainguard.pipeline.")}
    assert import_cycles(pipeline) == []


VALUE_MODULES = {"trainguard.vocabulary", "trainguard.events", "trainguard.finding",
                 "trainguard.ranked_cause", "trainguard.run_verdict", "trainguard.chance_level"}
"""The value types and words every layer shares, at the bottom of the imports."""

VALUE_USERS = ("trainguard.sinks", "trainguard.store", "trainguard.report", "trainguard.analyze")
"""Packages that show or keep what a run found: they take its values from the bottom."""

JUDGES = {"trainguard.diagnose.finding", "trainguard.diagnose.ranking", "trainguard.verdict"}
"""The modules that make the values (or hold their old import paths)."""


def test_the_value_types_import_only_each_other() -> None:
    wrong = {module: sorted(deps - VALUE_MODULES) for module in sorted(VALUE_MODULES)
             if (deps := _imported(module, MODULES[module], type_checking=True)
                 - {"trainguard.signals"}) - VALUE_MODULES}
    assert wrong == {}
    # events names StepSignals for the type checker only; signals imports no trainguard module
    assert _imported("trainguard.signals", MODULES["trainguard.signals"], True) == set()


def test_sinks_and_stores_take_the_value_types_from_the_bottom() -> None:
    def judges_imported(module: str) -> set[str]:
        found = _imported(module, MODULES[module], type_checking=True) & JUDGES
        if module.startswith("trainguard.analyze"):  # it judges a log: the rules, not the values
            found -= {"trainguard.diagnose.ranking", "trainguard.verdict"}
        return found

    wrong = {module: sorted(found) for module in MODULES
             if module.startswith(VALUE_USERS) and (found := judges_imported(module))}
    assert wrong == {}


def _names(node: ast.stmt, constants_only: bool) -> list[str]:
    """The names a module-level statement defines."""
    if isinstance(node, (ast.ClassDef, ast.FunctionDef)):
        return [] if constants_only else [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    return []


def _definitions(name: str, constants_only: bool = False) -> list[str]:
    """The modules that define a class, a function or a module-level constant called `name`
    (with `constants_only`, a constant or type alias only)."""
    return [module for module, path in MODULES.items()
            for node in ast.parse(path.read_text(encoding="utf-8")).body
            if name in _names(node, constants_only)]


def test_one_definition_of_each_shared_helper() -> None:
    assert _definitions("SavedState") == ["trainguard.recovery.state"]
    assert _definitions("chance_loss") == ["trainguard.chance_level"]
    # the recover policy's per-step `recovery.controller.Verdict` (skip, roll back, halt) is a
    # decision, not a run's verdict: the words of a run's verdict are one alias
    assert _definitions("Verdict", constants_only=True) == ["trainguard.vocabulary"]
    assert _definitions("VERDICTS") == ["trainguard.vocabulary"]
    assert _definitions("OLD_VERDICTS") == ["trainguard.vocabulary"]
    assert _definitions("Finding") == ["trainguard.finding"]
    assert _definitions("RankedCause") == ["trainguard.ranked_cause"]
    assert _definitions("RunVerdict") == ["trainguard.run_verdict"]


def test_no_chance_level_is_computed_outside_its_function() -> None:
    """ln of a number of classes is the chance level: `chance_loss` says so once."""
    sites = [f"{module}:{node.lineno}" for module, path in MODULES.items()
             if module != "trainguard.chance_level"
             for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
             if isinstance(node, ast.Call) and ast.unparse(node.func) in ("math.log", "np.log")
             and any(word in ast.unparse(node.args[0]).lower()
                     for word in ("class", "vocab")) if node.args]
    assert sites == []

LIMIT_COMPUTED_IN = {"trainguard.remedies.limit": "the one computation of the limit in force",
                     "trainguard.remedies.robust": "the adaptive clip's own limit"}
"""The modules that may read the adaptive clip's limit: every other reader of a clip limit takes
the one `remedies/limit.py` computes (`RunState.clip_limits`, `RunState.clip_limit`)."""

CONFIGURED_LIMIT_READ_IN = {"trainguard.config": "where it is defined",
                            "trainguard.remedies.clip_chain": "the chain is built from it once"}
"""The modules that may read the configured fixed limit: everywhere else a fallback to it would
be a second computation of the limit in force."""


def test_one_module_computes_the_clip_limit() -> None:
    reads_adaptive = {m for m, p in MODULES.items()
                      if re.search(r"\.(alarm_)?limit\(", p.read_text(encoding="utf-8"))}
    reads_configured = {m for m, p in MODULES.items()
                        if re.search(r"\bclip\.fixed\b|def fixed\(", p.read_text(encoding="utf-8"))}
    assert reads_adaptive - set(LIMIT_COMPUTED_IN) == set()
    assert reads_configured - set(CONFIGURED_LIMIT_READ_IN) == set()


USER_OBJECTS = {"model", "optimizer", "scheduler", "scaler", "replay_fn"}
"""The `Services` fields that hold the user's own objects (a model has a `state_dict` of its own,
which is the user's to checkpoint)."""


def test_the_services_hold_no_run_state() -> None:
    """Everything with state across steps is a `Stateful` in `RunState`, where checkpoints and
    rollbacks find it: none hides among the services."""
    import torch

    from trainguard import GuardConfig
    from trainguard.pipeline.run import Run
    from trainguard.stateful import Stateful

    model = torch.nn.Linear(3, 2)
    run = Run(model, torch.optim.SGD(model.parameters(), lr=0.1),
              config=GuardConfig(policy="recover", sinks={"console": False},
                                 clip={"agc": {"clipping": 0.1}}))
    try:
        held = {f.name: getattr(run.services, f.name)
                for f in dataclasses.fields(run.services) if f.name not in USER_OBJECTS}
        stateful = sorted(name for name, value in held.items() if isinstance(value, Stateful))
        assert stateful == []
        components = [c for c in run.state.components().values() if c is not None]
        assert not [name for name, value in held.items()
                    if any(value is c for c in components)]
    finally:
        run.close()


def test_the_clip_chain_alone_drives_the_adaptive_clip() -> None:
    """The adaptive clip is a link of the clip chain: only the chain moves it on (its alarm, its
    baseline), and only the limit's one computation reads it (for the type checker)."""
    importers = sorted(m for m, p in MODULES.items()
                       if "trainguard.remedies.robust" in _imported(m, p, type_checking=True))
    assert importers == ["trainguard.remedies.clip_chain", "trainguard.remedies.limit"]


def test_no_stage_reads_the_sync_mode() -> None:
    """A stage is handed what the mode changes (the limit the device clipped at, whether the
    step's update was taken before it is judged): the mode's own part of a step
    (`StepContext.on_device`) is read in `pipeline/deferred.py`, the run and the Guard only."""
    def reads_the_mode(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and (node.attr in ("deferred", "deferral") or (
            node.attr == "on_device" and ast.unparse(node.value) == "ctx"))

    readers = sorted(module for module in STAGE_MODULES
                     if any(map(reads_the_mode, ast.walk(ast.parse(MODULES[module].read_text(
                         encoding="utf-8"))))))
    assert readers == []


def test_the_stages_before_the_update_are_handed_their_inputs() -> None:
    """A stage before the update reads the measurement, what detect found and the decision from
    its parameters, never from what the pipeline keeps on the context for the settling."""
    def reads_a_result(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr in SET_FROM_RESULTS
                and ast.unparse(node.value) == "ctx")

    readers = sorted(module for module in CHECK_MODULES
                     if any(map(reads_a_result, ast.walk(ast.parse(MODULES[module].read_text(
                         encoding="utf-8"))))))
    assert readers == []


def test_the_deferred_mode_lives_in_one_module() -> None:
    """`sync="deferred"`'s stages, their order and the run's side of the mode are defined in
    `pipeline/deferred.py` alone; the shared stages and their runner know nothing of it."""
    home = ["trainguard.pipeline.deferred"]
    for name in ("measure_on_device", "read_late", "act_late", "ON_DEVICE", "LATE", "Deferral",
                 "deferral_possible"):
        assert _definitions(name) == home, name
    shared = STAGE_MODULES | {"trainguard.pipeline.steps"}
    assert sorted(m for m in shared if "trainguard.pipeline.deferred" in GRAPH[m]) == []
