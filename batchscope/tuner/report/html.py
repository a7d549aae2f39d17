"""The HTML page's parts: its stylesheet, tables, figures and page frame (tuner.report assembles the page).

Layout rules the page keeps at 1000 px and up (tests/tuner/test_report_layout.py checks them in Chromium): the
page never scrolls sideways (a table wider than the page scrolls in its own box, plots shrink to fit); a header
wraps only between words, never inside a name such as max_num_batched_tokens, and the knob columns' long names
are set vertically so the settings table fits; a mark cell (✓, ✗, n/a) is styled by what it says, so n/a never
looks like ✓.
"""

from __future__ import annotations

import html

from batchscope.tuner.report.blocks import Block, Heading, Paragraph

CSS = """
*, *::before, *::after { box-sizing: border-box; }
body { font-family: system-ui, sans-serif; margin: 2em auto; padding: 0 1em; max-width: 1300px; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
h1, h2, p, li { overflow-wrap: break-word; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: right; overflow-wrap: normal; }
th { background: #f2f4f7; vertical-align: bottom; } td:first-child, th:first-child { text-align: left; }
th.vertical { writing-mode: vertical-rl; transform: rotate(180deg); white-space: nowrap; text-align: left;
              vertical-align: middle; padding: 0.6em 0.25em; }
div.wide { overflow-x: auto; max-width: 100%; }
td.mark { text-align: center; }
td.mark.yes { color: #0a7a2f; font-weight: bold; }
td.mark.no { color: #b42318; font-weight: bold; }
td.mark.na { color: #8a8f98; font-style: italic; font-weight: normal; }
td.mark.other { color: #8a5a00; font-weight: normal; }
.recommendation { background: #f3f9f4; border-left: 4px solid #0a7a2f; padding: 0.4em 0.8em; margin: 0.4em 0; }
.explanation { background: #f7f9fc; border-left: 4px solid #1f77b4; padding: 0.5em 0.8em; }
.note { color: #555; } figure { margin: 1em 0; }
img.plot { display: block; max-width: 100%; height: auto; border: 1px solid #eee; }
"""

# A mark cell's class by its text: ✓ / ✗ / empty / n/a; anything else (a qualified mark) is 'other'
MARK_CLASSES = {"✓": "yes", "✗": "no", "": "none", "n/a": "na"}


def mark_class(text: str) -> str:
    return f"mark {MARK_CLASSES.get(text, 'other')}"


def html_table(head: list[str], rows: list[list[str]], marks: frozenset[int] = frozenset(),
               vertical: frozenset[int] = frozenset()) -> str:
    """A table in its own sideways-scrolling box; ``marks``: columns of ✓/✗/n/a marks (styled by value),
    ``vertical``: columns whose header is set vertically (long single names over short values)."""
    header = "".join(("<th class='vertical'>" if i in vertical else "<th>") + f"{html.escape(h)}</th>"
                     for i, h in enumerate(head))
    body = []
    for row in rows:
        cells = "".join((f"<td class='{mark_class(x)}'>" if i in marks else "<td>") + f"{html.escape(x)}</td>"
                        for i, x in enumerate(row))
        body.append(f"<tr>{cells}</tr>")
    return f"<div class='wide'><table><thead><tr>{header}</tr></thead><tbody>{''.join(body)}</tbody></table></div>"


def markdown_bold(text: str) -> str:
    """The one Markdown construct verdict lines use (**bold**), as HTML, after escaping."""
    parts = html.escape(text).split("**")
    return "".join(f"<strong>{p}</strong>" if i % 2 else p for i, p in enumerate(parts))


def html_blocks(blocks: list[Block]) -> list[str]:
    """The scenario sections' blocks as HTML elements."""
    out = []
    for block in blocks:
        if isinstance(block, Heading):
            out.append(f"<h{block.level}>{html.escape(block.text)}</h{block.level}>")
        elif isinstance(block, Paragraph):
            out.append(f"<p>{html.escape(block.text)}</p>")
        else:
            out.append(html_table(block.head, block.rows))
    return out


def html_figure(plot_id: str, caption: str, png_base64: str) -> str:
    """One plot, inline, with its caption."""
    return (f"<figure><img class='plot' id='plot-{plot_id}' alt='{html.escape(caption)}' "
            f"src='data:image/png;base64,{png_base64}'><figcaption>{html.escape(caption)}</figcaption></figure>")


def html_page(title: str, body: list[str]) -> str:
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>{html.escape(title)}</title>"
            f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
