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


_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|#&~])")


def md_text(text: str) -> str:
    """``text`` as literal Markdown: each character Markdown could read as markup (emphasis, code,
    links, HTML, table pipes, headings, entities, strikethrough) is backslash-escaped and line
    breaks become spaces, so a name can neither format nor break a heading or a table row.

    >>> md_text("a|b *c*\\nd")
    'a\\\\|b \\\\*c\\\\* d'
    """
    return _MD_SPECIAL.sub(r"\\\1", " ".join(text.splitlines()))


def _md_paragraph(text: str) -> str:
    """:func:`md_text` outside the paragraph's ```code``` spans, which stay as they are."""
    return "".join(part if i % 2 else md_text(part) for i, part in enumerate(re.split(r"(`[^`]+`)", text)))


def to_markdown(blocks: Sequence[Block], image_dir: str = "") -> str:
    """Markdown; each image refers to ``image_dir/name`` (the caller writes the files). Text is
    literal (:func:`md_text`): headings, table cells and paragraphs outside ```code``` spans."""
    parts = []
    for b in blocks:
        if isinstance(b, Heading):
            parts.append(f"{'#' * b.level} {md_text(b.text)}")
        elif isinstance(b, Paragraph):
            parts.append(_md_paragraph(b.text))
        elif isinstance(b, Table):
            lines = ["| " + " | ".join(map(md_text, b.header)) + " |",
                     "|" + "---|" + "---:|" * (len(b.header) - 1)]
            lines += ["| " + " | ".join(map(md_text, row)) + " |" for row in b.rows]
            parts.append("\n".join(lines))
        elif isinstance(b, Image):
            parts.append(f"![{md_text(b.alt)}]({image_dir + '/' if image_dir else ''}{b.name})")
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
