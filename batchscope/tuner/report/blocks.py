"""A report's content as blocks (headings, paragraphs, tables), which files.py renders as Markdown and html.py as
HTML: the sections written once for both."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True)
class Paragraph:
    text: str


@dataclass(frozen=True)
class Table:
    head: list[str]
    rows: list[list[str]]


Block = Heading | Paragraph | Table
