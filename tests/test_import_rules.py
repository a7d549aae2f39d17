"""The import rules between the project's rooms, read from every module's imports with ast.

Everything installed lives under one name, batchscope: the four components (batchscope.simulator, .loadgen,
.exporter, .tuner), the shared modules beside them (batchscope.*), and the test support (batchscope.testkit),
which the wheel leaves out. Data flows simulator → load generator → exporter → Prometheus → Grafana, and the tuner
drives them, so:
- the simulator, the load generator and the exporter import none of the other components (only shared modules);
- the tuner may import them all (it starts servers and loads, re-reads their files and runs the engine), but only
  through their faces: a component reaches another through ``batchscope.<component>`` and the names its
  ``__init__`` lists in ``__all__``, never an internal module;
- batchscope's shared modules import no component: batchscope/cli.py names the commands' modules as strings and
  imports only the chosen one (checked here against the components' cli modules);
- batchscope.testkit, the support library of tests and benches, is imported only by tests/, bench/ and itself;
- in the load generator only its Locust adapter (batchscope/loadgen/adapter/) imports Locust (or Flask, its web
  UI's): the core (one request's stream, one run's sender, the controller and the figures) runs without it.
A function-level import counts the same as a top-level one.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

from batchscope.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
COMPONENTS = ("simulator", "loadgen", "exporter", "tuner")
# room -> the project rooms its modules may import (beyond their own); "shared" is batchscope's own modules
ALLOWED = {
    "simulator": {"shared"},
    "loadgen": {"shared"},
    "exporter": {"shared"},
    "tuner": {"shared", "simulator", "loadgen", "exporter"},
    "shared": set(),
    "grafana": {"shared"},
    "bench": {"shared", "testkit", *COMPONENTS},
}
FOLDERS = {**{component: Path("batchscope", component) for component in COMPONENTS},
           "testkit": Path("batchscope/testkit"), "grafana": Path("grafana"), "bench": Path("bench"),
           "tests": Path("tests")}
LOCUST = ("locust", "flask")  # Flask: Locust's web UI, which the adapter extends
ADAPTER = ROOT / "batchscope" / "loadgen" / "adapter"


def room_of_module(name: str) -> str | None:
    """The project room a module name belongs to; None for the standard library and third parties."""
    parts = name.split(".")
    if parts[0] == "batchscope":
        return parts[1] if len(parts) > 1 and parts[1] in (*COMPONENTS, "testkit") else "shared"
    return parts[0] if parts[0] in FOLDERS else None


def room_of_file(path: Path, root: Path = ROOT) -> str:
    relative = path.relative_to(root)
    return next((room for room, folder in FOLDERS.items() if relative.is_relative_to(folder)), "shared")


@functools.cache
def imported_modules(path: Path) -> frozenset[str]:
    """Every absolute module name a file imports, at any depth of its code."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)  # `from batchscope import testkit`
    return frozenset(names)


def sources(room: str, root: Path = ROOT) -> list[Path]:
    if room == "shared":
        return sorted(path for path in (root / "batchscope").rglob("*.py") if room_of_file(path, root) == "shared")
    return sorted((root / FOLDERS[room]).rglob("*.py"))


@functools.cache
def face(component: str, root: Path = ROOT) -> frozenset[str]:
    """The names a component's ``__init__`` lists in ``__all__`` (read with ast, nothing imported)."""
    tree = ast.parse((root / "batchscope" / component / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
            if isinstance(target, ast.Name) and target.id == "__all__":
                return frozenset(ast.literal_eval(node.value))
    return frozenset()


def through_face(name: str, root: Path = ROOT) -> bool:
    """Whether a name of another component is its package or a name its face lists."""
    parts = name.split(".")
    return len(parts) == 2 or (len(parts) == 3 and parts[2] in face(parts[1], root))


def refused_imports(room: str, root: Path = ROOT) -> dict[str, list[str]]:
    """file -> the project modules it imports from rooms it may not, or from another component past its face."""
    found = {}
    for path in sources(room, root):
        refused = sorted(name for name in imported_modules(path)
                         if room_of_module(name) not in {None, room, *ALLOWED[room]}
                         or (room in COMPONENTS and room_of_module(name) in COMPONENTS
                             and room_of_module(name) != room and not through_face(name, root)))
        if refused:
            found[str(path.relative_to(root))] = refused
    return found


@pytest.mark.parametrize("room", list(ALLOWED))
def test_each_room_imports_only_the_rooms_it_may(room):
    assert refused_imports(room) == {}, f"{room} may import {sorted(ALLOWED[room])}"


def test_the_console_script_dispatches_to_the_components_cli_modules():
    assert {module for module, _ in COMMANDS.values()} == {f"batchscope.{component}.cli" for component in COMPONENTS}


def test_only_tests_and_benches_import_the_testkit():
    users = {str(path.relative_to(ROOT)) for path in (ROOT / "batchscope").rglob("*.py")
             if room_of_file(path) != "testkit"
             and any(room_of_module(name) == "testkit" for name in imported_modules(path))}
    assert users == set()


def test_nothing_imports_a_component_by_its_old_top_level_name():
    old = {str(path.relative_to(ROOT)): sorted(name for name in imported_modules(path)
                                               if name.split(".")[0] in COMPONENTS)
           for room in (*ALLOWED, "testkit", "tests") for path in sources(room)}
    assert {path: names for path, names in old.items() if names} == {}


def imports_locust(path: Path) -> bool:
    return any(name.split(".")[0] in LOCUST for name in imported_modules(path))


def test_only_the_load_generators_adapter_imports_locust():
    core = [path for path in sources("loadgen") if not path.is_relative_to(ADAPTER)]
    assert [str(path.relative_to(ROOT)) for path in core if imports_locust(path)] == []
    assert any(imports_locust(path) for path in ADAPTER.rglob("*.py"))  # the rule looks where Locust is


def test_the_rules_see_imports_inside_functions(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from batchscope.loadgen import spec\n    import batchscope.tuner.plan\n"
                      "if TYPE_CHECKING:\n    from locust.web import WebUI\n")
    names = imported_modules(module)
    assert {"batchscope.loadgen", "batchscope.loadgen.spec", "batchscope.tuner.plan"} <= names
    assert imports_locust(module)
    assert {name: room_of_module(name) for name in names if name.startswith("batchscope")} == {
        "batchscope.loadgen": "loadgen", "batchscope.loadgen.spec": "loadgen", "batchscope.tuner.plan": "tuner"}


def test_a_component_importing_another_is_refused(tmp_path):
    """The rule can fail: an exporter module that reaches into the simulator is named, its shared imports are not."""
    (tmp_path / "batchscope" / "exporter").mkdir(parents=True)
    (tmp_path / "batchscope" / "exporter" / "x.py").write_text(
        "from batchscope.simulator.engine import Engine\nfrom batchscope.vllm import knobs\nimport yaml\n")
    assert refused_imports("exporter", tmp_path) == {
        "batchscope/exporter/x.py": ["batchscope.simulator.engine", "batchscope.simulator.engine.Engine"]}


def test_a_component_reaching_past_anothers_face_is_refused(tmp_path):
    """The tuner may import the load generator's face and the names it lists, not its internal modules."""
    for component in ("tuner", "loadgen"):
        (tmp_path / "batchscope" / component).mkdir(parents=True)
    (tmp_path / "batchscope" / "loadgen" / "__init__.py").write_text('__all__ = ["WorkloadSpec"]\n')
    (tmp_path / "batchscope" / "tuner" / "x.py").write_text(
        "from batchscope.loadgen import WorkloadSpec\nfrom batchscope.loadgen.spec import load_spec\n"
        "from batchscope.loadgen import spec\n")
    assert refused_imports("tuner", tmp_path) == {
        "batchscope/tuner/x.py": ["batchscope.loadgen.spec", "batchscope.loadgen.spec.load_spec"]}
