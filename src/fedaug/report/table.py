"""The per-client results table printed at the end of a run and written to ``report.md``."""

from __future__ import annotations

from typing import Any


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}"


def results_table(summary: dict[str, Any]) -> str:
    """A Markdown table of test accuracy (%) per client, their mean and the pooled test set, at
    the final round and at the best round (chosen by the split in ``summary['best']['by']``)."""
    final, best = summary["final"], summary["best"]
    if final is None:
        return "(no evaluation was run)"
    fe, be = final["eval"], best["eval"]
    head = (f"| client | test acc final (round {final['round']}) "
            f"| test acc best (round {best['round']}, by {best['by']}) | test n |")
    lines = [head, "|---|---:|---:|---:|"]
    for name, res in fe["clients"].items():
        lines.append(f"| {name} | {_pct(res['test']['acc'])} | {_pct(be['clients'][name]['test']['acc'])} "
                     f"| {res['test']['n']} |")
    lines.append(f"| **mean over clients** | **{_pct(fe['mean']['test_acc'])}** "
                 f"| **{_pct(be['mean']['test_acc'])}** | |")
    lines.append(f"| pooled test set | {_pct(fe['pooled']['test_acc'])} | {_pct(be['pooled']['test_acc'])} "
                 f"| {fe['pooled']['n']} |")
    return "\n".join(lines)
