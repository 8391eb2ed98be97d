"""A small document model (headings, paragraphs, tables, PNG images) rendered to Markdown (images
as files next to it) and to one self-contained HTML page (images inlined as base64 ``data:`` URIs,
inline CSS, no scripts, nothing fetched)."""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Heading:
    level: int
    text: str


@dataclass(frozen=True)
class Paragraph:
    """Plain text; ```code``` spans become ``<code>`` in HTML."""

    text: str


@dataclass(frozen=True)
class Table:
    """A table of strings; the first column is left-aligned, the others right-aligned."""

    header: list[str]
    rows: list[list[str]]


@dataclass(frozen=True)
class Image:
    """A PNG image: ``name`` is its file name in the Markdown image folder."""

    name: str
    png: bytes
    alt: str


Block = Heading | Paragraph | Table | Image


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def to_markdown(blocks: Sequence[Block], image_dir: str = "") -> str:
    """Markdown; each image refers to ``image_dir/name`` (the caller writes the files)."""
    parts = []
    for b in blocks:
        if isinstance(b, Heading):
            parts.append(f"{'#' * b.level} {b.text}")
        elif isinstance(b, Paragraph):
            parts.append(b.text)
        elif isinstance(b, Table):
            lines = ["| " + " | ".join(map(_md_cell, b.header)) + " |",
                     "|" + "---|" + "---:|" * (len(b.header) - 1)]
            lines += ["| " + " | ".join(map(_md_cell, row)) + " |" for row in b.rows]
            parts.append("\n".join(lines))
        elif isinstance(b, Image):
            parts.append(f"![{b.alt}]({image_dir + '/' if image_dir else ''}{b.name})")
        else:
            raise TypeError(f"not a document block: {b!r}")
    return "\n\n".join(parts) + "\n"


_CSS = """
body { font-family: sans-serif; margin: 2em auto; max-width: 1100px; color: #222; background: #fafafa; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.9em; }
th, td { border: 1px solid #bbb; padding: 0.25em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #eee; }
img { display: block; max-width: 100%; margin: 0.8em 0; border: 1px solid #ddd; }
code { background: #eee; padding: 0 0.2em; }
"""


def _inline(text: str) -> str:
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def to_html(blocks: Sequence[Block], title: str) -> str:
    """One self-contained HTML page (UTF-8)."""
    body = []
    for b in blocks:
        if isinstance(b, Heading):
            body.append(f"<h{b.level}>{html.escape(b.text)}</h{b.level}>")
        elif isinstance(b, Paragraph):
            body.append(f"<p>{_inline(b.text)}</p>")
        elif isinstance(b, Table):
            head = "".join(f"<th>{html.escape(h)}</th>" for h in b.header)
            rows = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in b.rows)
            body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>")
        elif isinstance(b, Image):
            data = base64.b64encode(b.png).decode("ascii")
            body.append(f'<img alt="{html.escape(b.alt)}" src="data:image/png;base64,{data}">')
        else:
            raise TypeError(f"not a document block: {b!r}")
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{html.escape(title)}</title>\n'
            f"<style>{_CSS}</style>\n</head>\n<body>\n" + "\n".join(body) + "\n</body>\n</html>\n")
