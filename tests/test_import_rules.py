"""The import rules between the project's folders, read from every module's imports with ast.

Data flows simulator → load generator → exporter → Prometheus → Grafana, and the tuner drives them, so:
- the simulator, the load generator and the exporter import none of the other components (only batchscope);
- the tuner may import them all (it starts servers and loads, re-reads their files and runs the engine);
- batchscope's shared modules import no component: batchscope/cli.py names the commands' modules as strings and
  imports only the chosen one (checked here against the components' cli modules);
- batchscope.testkit, the support library of tests and benches, is imported only by tests/, bench/ and itself;
- in the load generator only its Locust adapter (loadgen/adapter/) imports Locust (or Flask, its web UI's): the
  core (one request's stream, one run's sender, the controller and the figures) runs without it.
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
# folder -> the project folders its modules may import (beyond their own)
ALLOWED = {
    "simulator": {"batchscope"},
    "loadgen": {"batchscope"},
    "exporter": {"batchscope"},
    "tuner": {"batchscope", "simulator", "loadgen", "exporter"},
    "batchscope": set(),
    "grafana": set(),
    "bench": {"batchscope", *COMPONENTS},
}
PROJECT = {*ALLOWED, "tests"}
TESTKIT = "batchscope.testkit"
LOCUST = ("locust", "flask")  # Flask: Locust's web UI, which the adapter extends
ADAPTER = ROOT / "loadgen" / "adapter"


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


def sources(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def crossings(folder: str) -> dict[str, set[str]]:
    """file -> the modules of other project folders it imports."""
    found = {}
    for path in sources(folder):
        others = {name for name in imported_modules(path) if name.split(".")[0] in PROJECT - {folder}}
        if others:
            found[str(path.relative_to(ROOT))] = others
    return found


@pytest.mark.parametrize("folder", [folder for folder in ALLOWED if folder != "batchscope"])
def test_each_folder_imports_only_the_folders_it_may(folder):
    refused = {path: sorted(name for name in names if name.split(".")[0] not in ALLOWED[folder])
               for path, names in crossings(folder).items()}
    assert not {path: names for path, names in refused.items() if names}, f"{folder} may import {ALLOWED[folder]}"


def test_batchscopes_shared_modules_import_no_component():
    shared = [path for path in sources("batchscope") if "testkit" not in path.parts]
    refused = {str(path.relative_to(ROOT)): sorted(name for name in imported_modules(path)
                                                   if name.split(".")[0] in PROJECT - {"batchscope"})
               for path in shared}
    assert not {path: names for path, names in refused.items() if names}


def test_the_console_script_dispatches_to_the_components_cli_modules():
    assert {module for module, _ in COMMANDS.values()} == {f"{component}.cli" for component in COMPONENTS}


def test_only_tests_and_benches_import_the_testkit():
    users = [str(path.relative_to(ROOT)) for folder in ALLOWED if folder != "bench" for path in sources(folder)
             if "testkit" not in path.parts
             and any(name == TESTKIT or name.startswith(TESTKIT + ".") for name in imported_modules(path))]
    assert users == []


def imports_locust(path: Path) -> bool:
    return any(name.split(".")[0] in LOCUST for name in imported_modules(path))


def test_only_the_load_generators_adapter_imports_locust():
    core = [path for path in sources("loadgen") if not path.is_relative_to(ADAPTER)]
    assert [str(path.relative_to(ROOT)) for path in core if imports_locust(path)] == []
    assert any(imports_locust(path) for path in sources("loadgen/adapter"))  # the rule looks where Locust is


def test_the_rules_see_imports_inside_functions(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from loadgen import spec\n    import tuner.plan\n"
                      "if TYPE_CHECKING:\n    from locust.web import WebUI\n")
    assert {"loadgen", "loadgen.spec", "tuner.plan"} <= imported_modules(module) and imports_locust(module)
