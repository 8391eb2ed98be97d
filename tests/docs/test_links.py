"""The README and docs/ refer only to files the repository has: every relative Markdown link, and
every file or folder they cite by its path (``docs/engine.md``, ``src/fedaug/...``, ``tests/...``,
``experiments/...``, ``DESIGN.md``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: a Markdown link or image: ``[text](target)``
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
#: a path cited in the text: from a top-level folder of the repository, or a top-level Markdown file
CITED = re.compile(r"(?<![\w/.<-])((?:docs|src|tests|experiments|benchmarks|scripts|results)/[\w./-]*[\w/]"
                   r"|[A-Z][A-Z_]+\.md\b)")
#: a path segment that stands for any name: ``results/GRID``, ``runs/<name>``, ``x*``
PLACEHOLDER = re.compile(r"^[A-Z][A-Z_]*$|[<>*{}]")


def links(text: str) -> list[str]:
    """The local targets of a page's links outside code (web addresses and in-page anchors left out),
    anchor removed."""
    prose = re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", text, flags=re.S))
    out = []
    for target in LINK.findall(prose):
        if re.match(r"[a-z][a-z+.-]*:", target) or target.startswith("#"):
            continue
        out.append(target.split("#")[0])
    return out


def cited(text: str) -> list[str]:
    """The repository paths a page names in its text (Markdown's ``\\_`` read as ``_``)."""
    return [p.rstrip("./") for p in CITED.findall(text.replace("\\_", "_"))
            if not any(PLACEHOLDER.search(part) for part in p.split("/"))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_and_cited_file_exists(page):
    text = page.read_text()
    missing = [f"link {t}" for t in links(text) if not (page.parent / t).exists()]
    missing += [f"cited {p}" for p in cited(text) if not (ROOT / p).exists()]
    assert not missing, f"{page.relative_to(ROOT)} refers to what the repository lacks: {', '.join(missing)}"


def test_the_checks_find_what_they_look_for():
    text = ("See [engine](engine.md#runs), ![plot](figures/x.png), [web](https://flower.ai), [top](#top), `f[:l](x)`; "
            "as DESIGN.md says, `src/fedaug/engine/server.py` and experiments/fedfa\\_gamma.py, but not "
            "results/GRID/table.md or runs/<name>.")
    assert links(text) == ["engine.md", "figures/x.png"]
    assert cited(text) == ["DESIGN.md", "src/fedaug/engine/server.py", "experiments/fedfa_gamma.py"]
