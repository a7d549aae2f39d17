"""Module docstrings say a file's role in a few lines: at most MAX_LINES, longer specs live in docs/ and tests.

Checked for every module of the installed package and the dashboards' generator (read with ast, nothing imported).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("batchscope", "grafana")
MAX_LINES = 10


def modules() -> list[Path]:
    return sorted(path for folder in CHECKED for path in (ROOT / folder).rglob("*.py"))


def docstring_lines(path: Path) -> int | None:
    """The number of lines of a module's docstring (as ast cleans it), None without one."""
    docstring = ast.get_docstring(ast.parse(path.read_text(), filename=str(path)))
    return None if docstring is None else len(docstring.splitlines())


def test_the_checked_folders_hold_modules():
    assert len(modules()) > len(CHECKED)


@pytest.mark.parametrize("path", modules(), ids=lambda path: str(path.relative_to(ROOT)))
def test_a_module_docstring_says_its_role_in_a_few_lines(path):
    lines = docstring_lines(path)
    assert lines is not None, "no module docstring"
    assert lines <= MAX_LINES, f"{lines} lines: move the spec to docs/ (or a test), keep the role"


def test_a_long_docstring_is_caught(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""Role.\n' + "more\n" * MAX_LINES + '"""\n')
    assert docstring_lines(module) == MAX_LINES + 1
    module.write_text("x = 1\n")
    assert docstring_lines(module) is None
