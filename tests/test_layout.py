"""The layout's import rules, checked on the source: each layer imports only the layers below it.

- ``sweeper.core`` imports nothing else of sweeper's (and no data plane);
- ``sweeper.plan`` imports core; ``sweeper.run`` imports core, plan; ``sweeper.analysis``
  imports core; the command line's renderings (``sweeper.console``, ``sweeper.live``) import
  what they draw; the CLI may import them all;
- ``actors`` (the data plane) imports ``sweeper.core`` and nothing else of the control plane;
- the control plane never imports ``actors``: the scheduler names the actor class by string;
- no cycle among the modules' top-level imports.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

ALLOWED = {
    "sweeper.core": {"sweeper.core"},
    "sweeper.plan": {"sweeper.core", "sweeper.plan"},
    "sweeper.run": {"sweeper.core", "sweeper.plan", "sweeper.run"},
    "sweeper.analysis": {"sweeper.core", "sweeper.analysis"},
    "sweeper.cli": {"sweeper.core", "sweeper.plan", "sweeper.run", "sweeper.analysis", "sweeper.console",
                    "sweeper.live"},
    # The command line's live view of a run: it draws the run's events.
    "sweeper.live": {"sweeper.core", "sweeper.run", "sweeper.live"},
    # What the command line shows: it renders the session's and the analysis layer's values.
    "sweeper.console": {"sweeper.core", "sweeper.plan", "sweeper.run", "sweeper.analysis"},
    "actors": {"sweeper.core", "actors"},
}


def _modules() -> dict[str, Path]:
    out = {}
    for package in ("sweeper", "actors"):
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def _imports(path: Path, *, top_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return {n for n in names if n.split(".")[0] in ("sweeper", "actors")}


def _layer(module: str) -> str:
    for layer in sorted(ALLOWED, key=len, reverse=True):
        if module == layer or module.startswith(layer + "."):
            return layer
    return module  # sweeper itself, sweeper.__main__


def _within(name: str, layers: set[str]) -> bool:
    return any(name == layer or name.startswith(layer + ".") for layer in layers)


@pytest.mark.parametrize("module", sorted(_modules()))
def test_each_module_imports_only_the_layers_below_it(module):
    allowed = ALLOWED.get(_layer(module))
    if allowed is None:
        return  # the package roots: sweeper/__init__ (the version), sweeper/__main__ (the CLI)
    path = _modules()[module]
    # Every import counts, lazy ones inside functions too: a lazy import still couples the layers.
    bad = sorted(n for n in _imports(path, top_level_only=False)
                 if not _within(n, allowed) and n not in ("sweeper", "actors"))
    assert not bad, f"{module} ({_layer(module)}) imports {bad}; allowed: {sorted(allowed)}"


def _writes_to_a_terminal(node: ast.AST) -> bool:
    """A call that prints: ``print(...)``, ``<console>.print(...)`` / ``.log(...)``, or a write to
    ``sys.stdout`` / ``sys.stderr``."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    if isinstance(f, ast.Name):
        return f.id == "print"
    if isinstance(f, ast.Attribute):
        if f.attr in ("print", "rule"):
            return True
        owner = f.value
        return (f.attr == "write" and isinstance(owner, ast.Attribute) and owner.attr in ("stdout", "stderr"))
    return False


@pytest.mark.parametrize("module", sorted(m for m in _modules() if _layer(m) == "sweeper.run"))
def test_nothing_in_the_run_layer_prints(module):
    """The run layer tells an ``Observer`` (lines, events); the command line decides what is shown."""
    tree = ast.parse(_modules()[module].read_text())
    printing = [node.lineno for node in ast.walk(tree) if _writes_to_a_terminal(node)]
    assert not printing, f"{module} prints at line(s) {printing}"


def test_the_print_check_sees_a_print():
    assert _writes_to_a_terminal(ast.parse("console.print('x')").body[0].value)
    assert _writes_to_a_terminal(ast.parse("sys.stderr.write('x')").body[0].value)
    assert not _writes_to_a_terminal(ast.parse("observer.say('x')").body[0].value)


def test_no_two_classes_share_a_name():
    """One meaning per name: a class name names one class across the control and data planes."""
    where: dict[str, list[str]] = {}
    for module, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(module)
    shared = {name: modules for name, modules in where.items() if len(modules) > 1}
    assert not shared, f"classes sharing a name: {shared}"


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (module -> the modules it imports), or None."""
    seen: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> list[str] | None:
        seen[m] = 1
        for n in sorted(graph[m]):
            if seen.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in seen and (found := visit(n, path + [n])) is not None:
                return found
        seen[m] = 2
        return None

    for m in sorted(graph):
        if m not in seen and (found := visit(m, [m])) is not None:
            return found
    return None


def test_the_data_plane_has_no_import_cycle_even_through_lazy_or_typing_imports():
    """Within ``actors`` every import counts, a function's and a type checker's too: a cycle
    through them is still two modules that each need the other (the HTTP client and its
    fan-out once were, as were the telemetry and its baseline rule)."""
    modules = {m: p for m, p in _modules().items() if m.startswith("actors")}
    graph = {m: {n for n in _imports(p, top_level_only=False) if n in modules and n != m} for m, p in modules.items()}
    cycle = _cycle(graph)
    assert cycle is None, "import cycle in the data plane: " + " -> ".join(cycle or [])
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # the check sees one


def _unit(module: str) -> str:
    """A module's place in ``actors``' layering: its folder (``actors.serving``) or, for a module
    of the package's top, itself (``actors.measure``)."""
    return ".".join(module.split(".")[:2])


def test_the_data_plane_s_folders_and_modules_form_layers():
    """Between ``actors``' folders and top modules no import runs both ways, however far round,
    lazy and typing imports counted: they stack as layers (value records at the bottom, the
    serving client below the backends that use it, measurement above both, the actor on top),
    each importing only those below it."""
    modules = {m: p for m, p in _modules().items() if m.startswith("actors")}
    graph: dict[str, set[str]] = {}
    for m, p in modules.items():
        graph.setdefault(_unit(m), set()).update(
            _unit(n) for n in _imports(p, top_level_only=False) if n in modules and _unit(n) != _unit(m))
    cycle = _cycle(graph)
    assert cycle is None, "actors' layers import each other: " + " -> ".join(cycle or [])
    assert graph["actors.records"] == set()  # the value records import nothing of actors


def test_no_import_cycles():
    modules = _modules()
    graph = {m: {n for n in (_imports(p, top_level_only=True)) if n in modules and n != m}
             for m, p in modules.items()}
    seen: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> None:
        seen[m] = 1
        for n in sorted(graph[m]):
            if seen.get(n) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(n):] + [n]))
            if n not in seen:
                visit(n, path + [n])
        seen[m] = 2

    for m in sorted(graph):
        if m not in seen:
            visit(m, [m])


def test_the_scheduler_reads_neither_the_results_directory_nor_the_backend_registry():
    """``SweepRun`` decides what runs where: it is handed its result writer, its start and its
    actors' requests (``sweeper.run.assembly``), so it imports none of what builds them."""
    modules = _modules()
    imported = _imports(modules["sweeper.run.sweep_run"], top_level_only=False)
    banned = {"sweeper.run.storage", "sweeper.run.recorder", "sweeper.run.resume", "sweeper.core.backends",
              "sweeper.run.shards"}
    assert not imported & banned, imported & banned


def test_the_command_line_starts_without_pandas():
    """Every test's and every user's `sweeper` command pays for its imports: pandas (about 0.3 s,
    pulled in by pyarrow.dataset) is imported where results are read, not when the CLI and its
    run session load."""
    code = ("import sys, sweeper.cli, sweeper.run.session; "
            "assert 'pandas' not in sys.modules and 'pyarrow.dataset' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_the_capability_probe_runs_on_the_standard_library():
    """Each node's Ray worker runs the probe of every `sweeper run` and `plan --address`: the
    function it unpickles is imported with its module, which must not bring the registries
    (pydantic) with it."""
    from sweeper.plan.capabilities import probe_cluster

    assert "host_libraries" in probe_cluster.__code__.co_names
    code = ("import sys, sweeper.plan.installed; "
            "assert not {'pydantic', 'sweeper.core.backends', 'ray'} & set(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.mark.slow
def test_the_control_plane_loads_without_torch():
    code = ("import sys, sweeper.cli, sweeper.plan.expand, sweeper.run.sweep_run, sweeper.run.storage, "
            "sweeper.analysis.query, actors.actor;"
            "heavy = [m for m in ('torch', 'transformers', 'vllm') if m in sys.modules];"
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
