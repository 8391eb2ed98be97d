"""The per-client results table printed at the end of a run and written to ``report.md``."""

from __future__ import annotations

from typing import Any


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}"


def results_table(summary: dict[str, Any]) -> str:
    """A Markdown table of the test metric (%: accuracy, or foreground Dice for segmentation) per
    client, their mean and the pooled test set, at the final round and at the best round (chosen
    by the split in ``summary['best']['by']``)."""
    final, best, m = summary["final"], summary["best"], summary["metric"]
    if final is None:
        return "(no evaluation was run)"
    fe, be = final["eval"], best["eval"]
    head = (f"| client | test {m} final (round {final['round']}) "
            f"| test {m} best (round {best['round']}, by {best['by']}) | test n |")
    lines = [head, "|---|---:|---:|---:|"]
    for name, res in fe["clients"].items():
        lines.append(f"| {name} | {_pct(res['test'][m])} | {_pct(be['clients'][name]['test'][m])} "
                     f"| {res['test']['n']} |")
    lines.append(f"| **mean over clients** | **{_pct(fe['mean'][f'test_{m}'])}** "
                 f"| **{_pct(be['mean'][f'test_{m}'])}** | |")
    lines.append(f"| pooled test set | {_pct(fe['pooled'][f'test_{m}'])} | {_pct(be['pooled'][f'test_{m}'])} "
                 f"| {fe['pooled']['n']} |")
    return "\n".join(lines)
