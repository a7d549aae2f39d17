"""The tuner's own rooms: its sub-packages reach each other only through their faces, each face lists names it
has, `batchscope tune`'s start-up loads neither the simulator nor matplotlib (whatif and write_report are imported
when used), and vLLM's metric names are the catalogue's."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

TUNER = Path(__file__).resolve().parents[2] / "batchscope" / "tuner"
SUB_PACKAGES = sorted(p.name for p in TUNER.iterdir() if (p / "__init__.py").exists())


def crossings() -> list[str]:
    """`module -> imported module` for each import of another sub-package's inner module."""
    found = []
    for path in TUNER.rglob("*.py"):
        here = path.relative_to(TUNER).parts[0] if path.parent != TUNER else None
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            for name in names:
                parts = name.split(".")
                if parts[:2] == ["batchscope", "tuner"] and len(parts) > 3 and parts[2] != here:
                    found.append(f"{path.relative_to(TUNER)} -> {name}")
    return found


def test_sub_packages_import_each_other_only_through_their_faces():
    assert SUB_PACKAGES == ["compare", "mlperf", "plan", "report", "results", "run"]
    assert crossings() == []


def test_each_face_lists_names_it_has():
    for name in ["batchscope.tuner", *(f"batchscope.tuner.{sub}" for sub in SUB_PACKAGES)]:
        face = importlib.import_module(name)
        missing = [listed for listed in face.__all__ if not hasattr(face, listed)]
        assert missing == [], name


def test_the_cli_loads_neither_the_simulator_nor_matplotlib():
    code = ("import sys, batchscope.tuner.cli; "
            "print(sorted(m for m in sys.modules if m.startswith(('batchscope.simulator', 'matplotlib'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_vllms_metric_names_come_from_the_catalogue():
    literals = [f"{path.relative_to(TUNER)}: {node.value}" for path in TUNER.rglob("*.py")
                for node in ast.walk(ast.parse(path.read_text()))
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("vllm:")]
    assert literals == []
