"""One-line messages for bad input: a pydantic error's first field as 'field.path: message', a YAML error's place,
a YAML file that must hold a mapping.

Every configuration (the simulator's flags and profile, the load spec, the tuning plan) is a pydantic model; the
user sees one line naming the field, never pydantic's multi-line report.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterable
from pathlib import Path

import yaml
from pydantic import ValidationError

TAGGED_UNION_ERRORS = ("union_tag_invalid", "union_tag_not_found")
INPUT_MAX_BYTES = 4 << 20  # a spec, a plan, a profile or a command line is a few KB; a file this large is not one


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


def read_input_text(path: str | Path, max_bytes: int = INPUT_MAX_BYTES) -> str:
    """A user's file as UTF-8 text, read within ``max_bytes``: OSError (strerror 'larger than N MiB' past the cap)
    or UnicodeDecodeError, which the caller words as its one line."""
    with open(path, "rb") as file:
        raw = file.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise OSError(errno.EFBIG, f"larger than {max_bytes / (1 << 20):g} MiB")
    return raw.decode()


def read_yaml_mapping(path: str | Path, what: str, error: type[ValueError], *, loader: type = yaml.SafeLoader,
                      empty_ok: bool = False) -> dict:
    """A YAML file holding a mapping of fields (read within INPUT_MAX_BYTES), else ``error`` saying
    '<what>: ...' in one line; an empty file is an empty mapping when ``empty_ok``."""
    try:
        data = yaml.load(read_input_text(path), Loader=loader)  # noqa: S506 (a SafeLoader or a subclass: the caller's)
    except OSError as exc:
        raise error(f"{what}: cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise error(f"{what}: {path} is not UTF-8 text") from None
    except yaml.YAMLError as exc:
        raise error(f"{what}: {path} is not valid YAML ({yaml_problem(exc)})") from None
    if data is None and empty_ok:
        return {}
    if not isinstance(data, dict):
        raise error(f"{what}: {path} must hold a mapping of fields")
    return data
