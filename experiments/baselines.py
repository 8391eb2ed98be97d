"""The baselines table (FedRDN, arXiv:2310.14390, Table 1 layout, on fedaug's data; docs/baselines.md):
one row per algorithm, and per dataset the mean client test accuracy (at the final round, and at
the best round by validation) without augmentation, with FedRDN and with FedFA (mean +/- std over
seeds), with each augmentation's gain over the algorithm alone and its paired t-test p-value; and a
figure of the final gains (``docs/figures/baselines_gains.png``: one bar per algorithm and
augmentation, ``*`` where p < 0.05).

The runs are the cells of the shipped grid ``baselines_digits4_fmnist`` (settings = dataset x
algorithm, methods = none / FedRDN / FedFA), run by ``fedaug compare`` (resumable, parallel,
reusing equal runs made elsewhere); this script only pivots its results::

    nice -n 5 .venv/bin/fedaug compare baselines_digits4_fmnist --jobs 2 --reuse runs
    .venv/bin/python experiments/baselines.py [--grid runs/compare/baselines_digits4_fmnist]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from fedaug.core.serialize import atomic_write_bytes, atomic_write_text
from fedaug.report.figures import gains_png
from fedaug.report.results import load_grid_results, summarize
from fedaug.report.runner import GRID_FILE
from fedaug.report.table import overview_cell

COLUMNS = ("none", "FedRDN", "FedFA")


def pivot(summary: dict[str, Any], which: str = "final") -> str:
    """Markdown: rows = algorithms, columns = (dataset, none / FedRDN / FedFA); cells at the final
    round or at the best round by validation (``which``)."""
    table: dict[str, dict[str, dict[str, Any]]] = {}
    datasets: list[str] = []
    for setting, s in summary["settings"].items():
        dataset, algorithm = (part.strip() for part in setting.split("|", 1))
        if dataset not in datasets:
            datasets.append(dataset)
        table.setdefault(algorithm, {})[dataset] = s["methods"]
    head = [f"{d}: {c}" for d in datasets for c in COLUMNS]
    seeds = len(summary["grid"]["seeds"])
    lines = ["| algorithm | " + " | ".join(head) + " |", "|---|" + "---|" * len(head)]
    for algorithm, by_dataset in table.items():
        cells = [overview_cell(by_dataset[d][c], which, seeds) if d in by_dataset else "-"
                 for d in datasets for c in COLUMNS]
        lines.append(f"| {algorithm} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", type=Path, default=Path("runs/compare/baselines_digits4_fmnist"),
                        help="the grid's output directory (fedaug compare --out)")
    parser.add_argument("--figure", type=Path, default=Path("docs/figures/baselines_gains.png"),
                        help="where the gains figure goes")
    args = parser.parse_args()
    if not (args.grid / GRID_FILE).is_file():
        parser.error(f"--grid {args.grid} holds no fedaug compare grid (no {GRID_FILE}); run "
                     "'fedaug compare baselines_digits4_fmnist --jobs 2 --reuse runs' first, or pass its --out")
    summary = summarize(load_grid_results(args.grid))
    text = "\n\n".join(f"{which.capitalize()} round:\n\n{pivot(summary, which)}" for which in ("final", "best"))
    atomic_write_text(args.grid / "pivot.md", text + "\n")
    atomic_write_bytes(args.figure, gains_png(summary))
    print(text)
    print(f"\ngains figure: {args.figure}")
    if summary["missing"]:
        print(f"\n{len(summary['missing'])} cells not finished yet; re-run the fedaug compare command")


if __name__ == "__main__":
    main()
