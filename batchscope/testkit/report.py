"""How benches report: plain-text and markdown tables, the PASS/FAIL table of targets, and the command-line
and JSON boilerplate every bench shares."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

Check = tuple[str, str, bool]  # (target, measured, passed)


def _widths(header: list[str], rows: list[list[str]]) -> list[int]:
    return [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]


def table(header: list[str], rows: list[list[str]]) -> str:
    """Plain-text columns: the first left-aligned, the others right-aligned."""
    widths = _widths(header, rows)
    lines = [header, ["-" * w for w in widths], *rows]
    return "\n".join("  ".join(cell.rjust(w) if i else cell.ljust(w)
                               for i, (cell, w) in enumerate(zip(line, widths, strict=True))).rstrip()
                     for line in lines)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub markdown table: the first column left-aligned, the others right-aligned; ``|`` escaped."""
    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    rule = "|" + "|".join(":---" if i == 0 else "---:" for i in range(len(header))) + "|"
    return "\n".join([line(header), rule, *(line(row) for row in rows)])


def targets_table(checks: list[Check]) -> str:
    """The (target, measured, passed) checks of a benchmark as a PASS/FAIL table."""
    return table(["target", "measured", "result"],
                 [[name, value, "PASS" if ok else "FAIL"] for name, value, ok in checks])


def argument_parser(doc: str | None) -> argparse.ArgumentParser:
    """A parser described by the first paragraph of the script's docstring."""
    return argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="FILE", help="also write the figures as JSON")


def write_json(path: str | Path, figures: object) -> None:
    Path(path).write_text(json.dumps(figures, indent=2) + "\n")
