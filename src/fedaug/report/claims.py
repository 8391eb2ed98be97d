"""A paper's claim as a comparison on a finished grid, and its verdict: reproduced, reversed or not
reproduced, from paired t-tests over the seeds (the evidence docs/results.md marks each claim with).

A claim says that ``method`` is ahead of (``direction = +1``) or behind (``-1``) each method of
``against`` in every setting of ``settings``. Each (setting, other method) pair is one comparison:
the paired t-test of the two cells' scores (:func:`fedaug.report.stats.paired_ttest`, with the 95 %
confidence interval of the mean difference) over the claim's seeds, those every cell the claim
compares has finished, so that all its comparisons rest on the same seeds. The verdict:

* **reproduced**: every comparison goes the claimed way with ``p < alpha``;
* **reversed**: at least one comparison goes the other way with ``p < alpha``;
* **not reproduced**: neither (the evidence says in how many comparisons the direction holds and
  in how many it is resolved).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedaug.core.errors import ConfigError
from fedaug.report.stats import PairedTest, interval_text, paired_ttest

REPRODUCED, REVERSED, NOT_REPRODUCED = "reproduced", "reversed", "not reproduced"


@dataclass(frozen=True)
class Claim:
    """One claim of a paper, as comparisons on one grid.

    Attributes:
        text: the claim in words (what the paper says).
        method: the method the claim is about (a grid method label).
        against: the methods it is compared with.
        settings: the grid settings it is checked in (empty: every setting of the grid).
        direction: +1 when ``method`` should score higher, -1 when lower.
        which: ``"final"`` or ``"best"`` score.
        alpha: significance level of the paired t-tests.
    """

    text: str
    method: str
    against: tuple[str, ...]
    settings: tuple[str, ...] = ()
    direction: int = 1
    which: str = "final"
    alpha: float = 0.05


@dataclass(frozen=True)
class Comparison:
    """``method`` against ``other`` in ``setting``: the paired test of ``method - other``."""

    setting: str
    other: str
    test: PairedTest


@dataclass(frozen=True)
class Verdict:
    """A claim's verdict (:data:`REPRODUCED`, :data:`REVERSED` or :data:`NOT_REPRODUCED`), its
    comparisons and the seeds they rest on (every compared cell finished them, sorted)."""

    claim: Claim
    verdict: str
    comparisons: tuple[Comparison, ...]
    seeds: tuple[int, ...]

    @property
    def agreeing(self) -> int:
        """How many comparisons go the claimed way (whatever their p-value)."""
        return sum(1 for c in self.comparisons if c.test.diff is not None and self.claim.direction * c.test.diff > 0)

    def evidence(self) -> str:
        """The comparisons in words: per comparison the difference in points, its 95 % confidence
        interval and its p-value, and how many go the claimed way and how many are resolved."""
        parts = []
        for c in self.comparisons:
            where = c.other if len({x.setting for x in self.comparisons}) == 1 else f"{c.other}, {c.setting}"
            diff = "n/a" if c.test.diff is None else f"{100 * c.test.diff:+.1f}"
            ci = interval_text(c.test.ci_low, c.test.ci_high, scale=100, decimals=1)
            parts.append(f"{diff} vs {where} (95 % CI {ci}, p {c.test.text()})")
        resolved = sum(1 for c in self.comparisons if _significant(c.test, self.claim.alpha))
        return (f"claimed direction in {self.agreeing} of {len(self.comparisons)}, p < {self.claim.alpha:g} in {resolved}: "
                + "; ".join(parts))


def _significant(test: PairedTest, alpha: float) -> bool:
    return test.p is not None and test.p < alpha


def _cell_scores(summary: dict[str, Any], setting: str, method: str, which: str) -> dict[int, float]:
    cells = summary["settings"][setting]["methods"]
    if method not in cells:
        raise ConfigError(f"claim: setting '{setting}' has no method '{method}'; it has {', '.join(cells)}")
    cell = cells[method]
    if cell.get("n", 0) == 0:
        return {}
    return dict(zip(cell["seeds"], cell[which]["values"]))


def judge(claim: Claim, summary: dict[str, Any]) -> Verdict:
    """The verdict of ``claim`` on a :func:`fedaug.report.results.summarize` result.

    Raises:
        ConfigError: the claim names a setting or method the grid does not have, or has an invalid
            ``direction`` or ``which``.
    """
    if claim.direction not in (1, -1):
        raise ConfigError(f"claim direction must be +1 or -1, got {claim.direction!r}")
    if claim.which not in ("final", "best"):
        raise ConfigError(f"claim 'which' must be 'final' or 'best', got {claim.which!r}")
    settings = claim.settings or tuple(summary["settings"])
    unknown = [s for s in settings if s not in summary["settings"]]
    if unknown:
        raise ConfigError(f"claim: unknown setting(s) {unknown}; the grid has {', '.join(summary['settings'])}")
    cells = {(setting, method): _cell_scores(summary, setting, method, claim.which)
             for setting in settings for method in (claim.method, *claim.against)}
    seeds = sorted(set.intersection(*(set(scores) for scores in cells.values())))
    comparisons = []
    for setting in settings:
        mine = cells[setting, claim.method]
        for other in claim.against:
            theirs = cells[setting, other]
            test = paired_ttest([mine[s] for s in seeds], [theirs[s] for s in seeds])
            comparisons.append(Comparison(setting, other, test))
    ways = [(c.test.diff or 0.0) * claim.direction for c in comparisons]
    significant = [_significant(c.test, claim.alpha) for c in comparisons]
    if any(w < 0 and s for w, s in zip(ways, significant)):
        verdict = REVERSED
    elif comparisons and all(w > 0 and s for w, s in zip(ways, significant)):
        verdict = REPRODUCED
    else:
        verdict = NOT_REPRODUCED
    return Verdict(claim, verdict, tuple(comparisons), tuple(seeds))
