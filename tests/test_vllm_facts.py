"""vLLM's facts live in batchscope/vllm/ alone: no code elsewhere spells a vLLM metric name (or the name prefix)
as a string literal; each comes from batchscope.vllm.catalogue. Docstrings may name metrics for a reader, and
prose may say "vllm:*"."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("batchscope", "grafana", "bench", "scripts")
HOME = ROOT / "batchscope" / "vllm"
VLLM_NAME = re.compile(r"\bvllm:[a-z_]+|^vllm:$")  # a metric's name, or the prefix alone


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the string constants that are docstrings."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def vllm_literals(path: Path) -> list[str]:
    """``line: literal`` for every string constant of a file (docstrings aside) that spells a vLLM name."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skip = docstrings(tree)
    return [f"{node.lineno}: {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
            and VLLM_NAME.search(node.value)]


def test_no_vllm_metric_name_is_spelled_outside_batchscope_vllm():
    found = {str(path.relative_to(ROOT)): literals
             for folder in CHECKED for path in sorted((ROOT / folder).rglob("*.py"))
             if not path.is_relative_to(HOME) and (literals := vllm_literals(path))}
    assert found == {}


def test_the_check_sees_a_literal_but_not_a_docstring(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""Reads vllm:num_preemptions."""\nNAME = "vllm:num_preemptions_total"\n'
                      'def f():\n    """vllm:x in a docstring."""\n    return f"{NAME} vllm:kv_cache_usage_perc"\n')
    assert vllm_literals(module) == ["2: 'vllm:num_preemptions_total'", "5: ' vllm:kv_cache_usage_perc'"]
