"""One-line messages for pydantic validation errors: the first error as 'field.path: message'.

Every configuration (the simulator's flags and profile, the load spec, the tuning plan) is a pydantic model; the
user sees one line naming the field, never pydantic's multi-line report.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import yaml
from pydantic import ValidationError

TAGGED_UNION_ERRORS = ("union_tag_invalid", "union_tag_not_found")


def first_error(exc: ValidationError, *, drop: Iterable[str] = (),
                field_name: Callable[[str], str] = lambda field: field) -> tuple[str, str, str]:
    """The first error as (field path, message, pydantic error type).

    ``drop`` removes location parts pydantic adds for union members (a mode or kind name, ``function-after[...]``)
    so the path is the one the user wrote; ``field_name`` maps the path to how the user spells it (a flag).
    """
    error = exc.errors()[0]
    skipped = set(drop)
    parts = [str(part) for part in error["loc"]
             if str(part) not in skipped and not str(part).startswith(("function-", "tagged-union["))]
    message = error["msg"].removeprefix("Value error, ")
    field = ".".join(parts)
    return (field_name(field) if field else ""), message, error["type"]


def yaml_problem(exc: yaml.YAMLError) -> str:
    """Where and what a YAML parse error is, as 'line L, column C: problem' (1-based, as editors count)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = " ".join(str(getattr(exc, "problem", None) or exc.__class__.__name__).split())
    if mark is None:
        return str(problem)
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
