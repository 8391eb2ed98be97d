"""``fedaug report <grid dir | run dirs> [--out DIR] [--features pca|tsne]``: an HTML page and a
Markdown file with tables, learning curves, per-client bars and communication vs accuracy."""

from __future__ import annotations

import argparse
from pathlib import Path

from fedaug.core.errors import ConfigError, suggest


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "report", help="HTML + Markdown report of a grid or of run directories",
        description="Write report.html (self-contained: images inlined, no scripts, nothing fetched), "
                    "report.md with report_files/*.png, and report.json (every number shown) for a "
                    "'fedaug compare' directory or for run directories (grouped by run name).")
    p.add_argument("paths", nargs="+", metavar="PATH", help="a grid directory, or run directories")
    p.add_argument("--out", help="output directory (default: PATH/report when one PATH is given)")
    p.add_argument("--features", nargs="?", const="pca", metavar="EMBEDDING",
                   help="add a 2-D embedding (pca, the default, or tsne) of the final model's features "
                        "coloured by client, with Davies-Bouldin scores (loads data and checkpoints)")
    p.add_argument("--feature-stage", help="model stage whose output is analysed (default: the penultimate)")
    p.add_argument("--feature-samples", type=int, default=100, help="test samples per client (default 100)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from fedaug.report.features import EMBEDDINGS
    from fedaug.report.page import write_report

    if args.out is None and len(args.paths) > 1:
        raise ConfigError("give --out when reporting on several run directories")
    if args.feature_samples < 1:
        raise ConfigError(f"--feature-samples must be >= 1, got {args.feature_samples}")
    if args.features is not None and args.features not in EMBEDDINGS:
        raise ConfigError(f"--features must be one of {', '.join(EMBEDDINGS)}, got {args.features!r}"
                          f"{suggest(args.features, EMBEDDINGS)}")
    out = Path(args.out) if args.out else Path(args.paths[0]) / "report"
    files = write_report(args.paths, out, features=args.features, stage=args.feature_stage,
                         per_client=args.feature_samples)
    for kind, path in files.items():
        print(f"{kind}: {path}")
    return 0
