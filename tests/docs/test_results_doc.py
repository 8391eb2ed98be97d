"""docs/results.md against the archives in results/: every claim's row at a glance (the seeds its verdict rests
on, the runs' rounds x local epochs with the paper's, the data, the verdict) and every comparison's difference,
95 % confidence interval and p-value, recomputed here from the archived runs' summaries and configs with scipy,
not with the page's generator (experiments/results_page.py) or fedaug.report.claims; the same, in a second row
and under the grid's section, for a grid's paper-scale archive (results/GRID-paper-scale) where there is one. A
page written before the archives changed (more seeds archived, a cell rerun) fails here until it is written
again."""

from __future__ import annotations

import json
import math
import tomllib
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import ttest_rel

from fedaug.report.document import md_text
from fedaug.report.grid import load_grid, slug
from tests.experiments.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "results.md").read_text()
SCRIPT = load_script("results_page")
CLAIMED = [(title, grid) for title, grid, _ in SCRIPT.TABLES if grid in SCRIPT.CLAIMS]


@cache
def grid_seeds(archive: str) -> list[int]:
    """The seeds of the archived grid ``archive`` (a directory of results/), from its grid.json."""
    return json.loads((ROOT / "results" / archive / "grid.json").read_text())["seeds"]


def archives(grid: str) -> list[str]:
    """The archives that judge ``grid``'s claims: its own, and its paper-scale variant's where results/ has one."""
    return [grid, *[name for name in (f"{grid}-paper-scale",) if (ROOT / "results" / name).is_dir()]]


@cache
def finished(grid: str) -> dict[tuple[str, str], dict[int, tuple[float, dict]]]:
    """(setting, method) -> seed -> (final mean client test score, resolved config) of every archived run of
    ``grid`` (a directory of results/) that finished, read from its grid.json, run directories, summary.json and
    config.toml alone."""
    out = ROOT / "results" / grid
    meta = json.loads((out / "grid.json").read_text())
    cells: dict[tuple[str, str], dict[int, tuple[float, dict]]] = {}
    for setting in meta["settings"]:
        for method in meta["methods"]:
            runs = cells.setdefault((setting, method), {})
            for seed in meta["seeds"]:
                dirs = sorted(p for p in (out / slug(setting) / slug(method) / f"seed{seed}").glob("*")
                              if (p / "config.toml").is_file())
                if dirs and (dirs[-1] / "summary.json").is_file():  # the newest run of the cell, if it finished
                    summary = json.loads((dirs[-1] / "summary.json").read_text())
                    score = summary["final"]["eval"]["mean"][f"test_{summary['metric']}"]
                    runs[seed] = (math.nan if score is None else score,
                                  tomllib.loads((dirs[-1] / "config.toml").read_text()))
    return cells


def claim_rows() -> list[list[str]]:
    """The claims-at-a-glance table's rows, cell by cell, as the page has them."""
    table = PAGE.split("## The claims at a glance", 1)[1].split("\n## ", 1)[0]
    return [line.strip("| ").split(" | ") for line in table.splitlines() if line.startswith("| ")][1:]


def expected(grid: str, claim, archive: str | None = None) -> tuple[list[str], list[str]]:
    """The row's seeds, scale and data cells and its verdict, and the claim's comparisons in the
    words of the page, from :func:`finished` and scipy, on the archive ``archive`` (default: the grid's own; a
    paper-scale one may be unfinished: under 2 common seeds its row says how many compared cells finished)."""
    archive = archive or grid
    cells = finished(archive)
    settings = claim.settings or tuple(dict.fromkeys(s for s, _ in cells))
    compared = [cells[s, m] for s in settings for m in (claim.method, *claim.against)]
    seeds = sorted(set.intersection(*(set(c) for c in compared)))
    configs = [config for c in cells.values() for _, config in c.values()]
    scale = ", ".join(f"{r} x {e}" for r, e in sorted({(c["train"]["rounds"], c["train"]["local_epochs"])
                                                       for c in configs})) or "-"
    paper = load_grid(grid).paper
    data = "the paper's" if configs and {c["data"]["name"] for c in configs} <= set(paper.datasets) else "stand-in"
    head = [str(len(seeds)), f"{scale} ({paper.text()})", data]
    if len(seeds) < 2 and any(len(runs) < len(grid_seeds(archive)) for runs in cells.values()):
        total = len(compared) * len(grid_seeds(archive))
        waiting = "partial grid" if archive == grid else f"running: {sum(map(len, compared))} of {total} cells finished"
        return [*head, waiting], []
    ways, words = [], []
    for setting in settings:
        for other in claim.against:
            a = np.array([cells[setting, claim.method][s][0] for s in seeds])
            b = np.array([cells[setting, other][s][0] for s in seeds])
            test = ttest_rel(a, b)
            ci = test.confidence_interval(0.95)
            diff = claim.direction * (a - b).mean()
            ways.append((diff > 0, test.pvalue < claim.alpha))
            where = other if len(settings) == 1 else f"{other}, {setting}"
            words.append(f"{100 * (a - b).mean():+.1f} vs {where} (95 % CI [{100 * ci.low:+.1f}, "
                         f"{100 * ci.high:+.1f}], p {test.pvalue:.3g} (n={len(seeds)}))")
    verdict = ("reversed" if any(not ahead and resolved for ahead, resolved in ways) else
               "reproduced" if all(ahead and resolved for ahead, resolved in ways) else "not reproduced")
    agreeing = sum(ahead for ahead, _ in ways)
    return [*head, f"{verdict} ({agreeing} of {len(ways)} comparisons in the claimed direction)"], words


def test_the_claims_table_states_each_verdicts_seeds_scale_and_data_as_the_archives_give_them():
    claims = [(title, grid, claim, archive) for title, grid in CLAIMED for claim in SCRIPT.CLAIMS[grid]
              for archive in archives(grid)]
    rows = claim_rows()
    assert len(rows) == len(claims)
    for row, (title, grid, claim, archive) in zip(rows, claims):
        text = claim.text if archive == grid else SCRIPT.PAPER_ROW
        assert row[:3] == [md_text(title.split(":")[0]), md_text(text), md_text(claim.method)]
        assert row[3:] == [md_text(cell) for cell in expected(grid, claim, archive)[0]], (archive, claim.text)


@pytest.mark.parametrize("title, grid", CLAIMED)
def test_each_comparison_shows_its_difference_interval_and_p_as_the_archives_give_them(title, grid):
    section = PAGE.split(f"## {md_text(title)}\n", 1)[1].split("\n## ", 1)[0]
    for claim in SCRIPT.CLAIMS[grid]:
        for archive in archives(grid):
            for words in expected(grid, claim, archive)[1]:
                assert md_text(words) in section, (archive, claim.text, words)


def test_the_introduction_counts_the_seeds_per_cell():
    counts = {len(runs) for _, grid in CLAIMED for runs in finished(grid).values() if runs}
    seeds = f"{min(counts)} seeds" if len(counts) == 1 else f"{min(counts)} to {max(counts)} seeds"
    assert f"one torch thread per run), {seeds} per cell." in PAGE
