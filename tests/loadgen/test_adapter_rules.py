"""Rules of the Locust adapter (batchscope/loadgen/adapter/) read from its source with ast: Locust's options are read,
never written (what a sender needs from the controller travels as its plan, batchscope/loadgen/adapter/messages.py, not
as options written on the master for Locust to copy into every spawn message), and Locust is used through its public
API only (no ``_private`` member of an object not our own)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# the one write: Locust's own CSV writer is switched off so that ours takes its files
# (batchscope/loadgen/adapter/stats.py)
ALLOWED_WRITES = {("batchscope/loadgen/adapter/stats.py", "csv_prefix")}


def option_writes(path: Path, root: Path = ROOT) -> set[tuple[str, str]]:
    """(file, attribute) of every assignment to an attribute of an options object (``options.x = ...``,
    ``options_of(env).x += ...``, ``environment.parsed_options.x = ...``) and every ``setattr`` on one."""
    found = set()
    name = str(path.relative_to(root))
    for node in ast.walk(ast.parse(path.read_text(), filename=name)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
              and len(node.args) > 1 and "options" in ast.unparse(node.args[0])):
            found.add((name, ast.unparse(node.args[1])))
        for target in targets:
            if isinstance(target, ast.Attribute) and "options" in ast.unparse(target.value):
                found.add((name, target.attr))
    return found


def test_the_adapter_writes_no_option_but_the_csv_hand_over():
    writes = set().union(*(option_writes(path) for path in sorted((ROOT / "batchscope" / "loadgen").rglob("*.py"))))
    assert writes == ALLOWED_WRITES


def private_uses(path: Path, root: Path = ROOT) -> set[tuple[str, str]]:
    """(file, member) of every ``x._name`` where x is not ``self`` or ``cls`` (dunders aside)."""
    name = str(path.relative_to(root))
    return {(name, node.attr) for node in ast.walk(ast.parse(path.read_text(), filename=name))
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))}


def test_the_adapter_uses_no_private_member_of_locusts_objects():
    adapter = sorted((ROOT / "batchscope" / "loadgen" / "adapter").rglob("*.py"))
    assert set().union(*(private_uses(path) for path in adapter)) == set()


def test_the_rules_see_a_private_use(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("writer._rows(out)\nself._mine = 1\ncls.__name__\n")
    assert private_uses(module, tmp_path) == {("m.py", "_rows")}


def test_the_rule_sees_each_form_of_write(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("options.a = 1\noptions_of(env).b += 1\nenvironment.parsed_options.c: int = 2\n"
                      "setattr(options, 'd', 3)\nrun.e = options.f\n")
    assert option_writes(module, tmp_path) == {("m.py", "a"), ("m.py", "b"), ("m.py", "c"), ("m.py", "'d'")}
