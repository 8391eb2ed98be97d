"""Every timing in the README and docs/benchmarks.md names the machine it was measured on (issue 50):
a time measured on one CPU says little about another, so each paragraph (README) or section
(benchmarks.md: headings and bold lead-ins) with a time in it names the CPU or GPU, or says that the
CPU was not recorded."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
#: a time: "130 s", "0.5 ms", "5 min", a table's "s/round" or "ms/step" column
TIME = re.compile(r"\d\s?(ms|us|s|min)\b|s/round|ms/step")
#: a machine named, or its absence said
MACHINE = re.compile(r"Intel|Xeon|AMD EPYC|H100|H200|CPU (model )?(was )?not recorded")


def chunks(text: str, split_bold: bool) -> list[str]:
    """The document's paragraphs (blank-line separated), or with ``split_bold`` its sections: a heading or a
    line starting with a bold lead-in opens one. Code blocks stay inside their chunk."""
    out: list[list[str]] = [[]]
    code = False
    for line in text.splitlines():
        code ^= line.startswith("```")
        opens = line.startswith("#") or line.startswith("**") if split_bold else not line.strip()
        if not code and opens and out[-1]:
            out.append([])
        out[-1].append(line)
    return ["\n".join(c) for c in out if c]


@pytest.mark.parametrize(("name", "split_bold"), [("README.md", False), ("docs/benchmarks.md", True)])
def test_every_timing_names_its_machine(name, split_bold):
    unnamed = [c.strip()[:160] for c in chunks((ROOT / name).read_text(), split_bold)
               if TIME.search(c) and not MACHINE.search(c)]
    assert unnamed == [], f"{name}: timings without the machine they were measured on:\n" + "\n".join(unnamed)


def test_the_check_finds_an_unnamed_timing():
    text = "# A\n\nIt took 130 s.\n\n**B** on an Intel Xeon: 3 s/round.\n\n**C** 2 ms a step.\n```\n**D**\n```\n"

    def unnamed(split_bold: bool) -> list[str]:
        return [c.strip() for c in chunks(text, split_bold) if TIME.search(c) and not MACHINE.search(c)]

    assert unnamed(True) == ["# A\n\nIt took 130 s.", "**C** 2 ms a step.\n```\n**D**\n```"]
    assert unnamed(False) == ["It took 130 s.", "**C** 2 ms a step.\n```\n**D**\n```"]
