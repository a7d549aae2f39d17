"""The load generator's layout, read with ast: a short top level of sub-packages by job, each with a face
(``__all__`` in its ``__init__``) through which the others import it, and no internal module importing the
component's own face (batchscope/loadgen/__init__.py imports them all: an import cycle)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOADGEN = ROOT / "batchscope" / "loadgen"
MAX_TOP_ENTRIES = 10
COMPONENT = "batchscope.loadgen"


def sub_packages(root: Path = LOADGEN) -> list[str]:
    return sorted(path.parent.name for path in root.glob("*/__init__.py"))


def face(package: str, root: Path = LOADGEN) -> frozenset[str]:
    for node in ast.parse((root / package / "__init__.py").read_text()).body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
            if isinstance(target, ast.Name) and target.id == "__all__":
                return frozenset(ast.literal_eval(node.value))
    raise AssertionError(f"{package}/__init__.py lists no __all__")


def imports(path: Path) -> list[tuple[str, str | None]]:
    """(module, name) for every absolute import of a file, at any depth; name None for ``import module``."""
    found: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.module, alias.name) for alias in node.names]
    return found


def past_a_face(module: str, name: str | None, own: str | None, faces: dict[str, frozenset[str]]) -> bool:
    """An import of another sub-package that is neither its package nor a name its face lists."""
    parts = module.split(".")
    if parts[:2] != ["batchscope", "loadgen"] or len(parts) < 3 or parts[2] not in faces or parts[2] == own:
        return False
    return len(parts) > 3 or (name is not None and name not in faces[parts[2]])


def refused(root: Path = LOADGEN) -> dict[str, list[str]]:
    """file -> its imports that reach another sub-package past its face, or the component's face itself."""
    faces = {package: face(package, root) for package in sub_packages(root)}
    found = {}
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        own = relative.parts[0] if len(relative.parts) > 1 else None
        internal = path != root / "__init__.py"
        bad = [f"{module}.{name}" if name else module for module, name in imports(path)
               if (internal and module == COMPONENT) or past_a_face(module, name, own, faces)]
        if bad:
            found[str(relative)] = bad
    return found


def test_the_top_level_is_short():
    entries = sorted(path.name for path in LOADGEN.iterdir() if path.name != "__pycache__")
    assert len(entries) <= MAX_TOP_ENTRIES, entries
    assert {"README.md", "__init__.py", "cli.py", "adapter"} <= set(entries)


def test_every_sub_package_has_a_face():
    assert {"adapter", "figures", "run", "stream"} <= set(sub_packages())
    for package in sub_packages():
        assert face(package) is not None  # raises without __all__


def test_sub_packages_import_each_other_through_their_faces():
    assert refused() == {}


def test_a_crossing_past_a_face_is_named(tmp_path):
    for package, listed in (("stream", '["Target"]'), ("run", "[]")):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text(f"__all__ = {listed}\n")
    (tmp_path / "run" / "x.py").write_text(
        "from batchscope.loadgen.stream import Target\nfrom batchscope.loadgen.stream.http import Connection\n"
        "from batchscope.loadgen.stream import measure\nfrom batchscope.loadgen import WorkloadSpec\n"
        "from batchscope.loadgen.run import y\n")
    assert refused(tmp_path) == {"run/x.py": [
        "batchscope.loadgen.stream.http.Connection", "batchscope.loadgen.stream.measure",
        "batchscope.loadgen.WorkloadSpec"]}
