"""``fedaug archive SRC DEST``: copy a grid's finished runs without their checkpoints (to commit
them, or to bring them back into ``runs/compare`` where ``fedaug compare`` counts them as done)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "archive", help="copy a grid's finished runs without checkpoints (to keep them, or back)",
        description="Copy every finished run of the grid directory SRC to DEST with its config, summary and "
                    "report, its per-round records gzipped, and no checkpoints; merge the grid's "
                    "invocations.jsonl and write DEST's tables. Runs already in DEST are kept. The same "
                    "command brings an archive back: fedaug compare then counts its cells as done.",
        epilog="Examples: fedaug archive runs/compare/fedfa_table5_digits4 results/fedfa_table5_digits4;  "
               "fedaug archive results/fedfa_table5_digits4 runs/compare/fedfa_table5_digits4")
    p.add_argument("src", help="a grid directory ('fedaug compare' output) or an archive of one")
    p.add_argument("dest", help="where the finished runs go (created)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from fedaug.report.archive import archive_grid

    done = archive_grid(Path(args.src), Path(args.dest))
    print(f"{args.dest}: {done.copied} run(s) copied, {done.present} already there, "
          f"{done.merged} invocation line(s) merged")
    return 0
