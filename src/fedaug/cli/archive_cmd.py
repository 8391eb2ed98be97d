"""``fedaug archive SRC DEST``: copy a grid's finished runs without their checkpoints (to commit
them, or to bring them back into ``runs/compare`` where ``fedaug compare`` counts them as done); with
``--keep-unfinished`` its stopped runs too, each with its newest checkpoint; a tarball of archived grids
(``benchmarks/paper_scale_gpu.sh``'s) is merged grid by grid."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedaug.report.archive import Archived


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "archive", help="copy a grid's finished runs without checkpoints (to keep them, or back)",
        description="Copy every finished run of the grid directory SRC to DEST with its config, summary and "
                    "report, its per-round records gzipped, and no checkpoints; merge the grid's "
                    "invocations.jsonl and write DEST's tables. Runs already in DEST are kept. The same "
                    "command brings an archive back: fedaug compare then counts its cells as done. SRC may be a "
                    "tarball of archived grids (benchmarks/paper_scale_gpu.sh's): each of its grids is merged into "
                    "DEST/<grid>, its unfinished runs kept.",
        epilog="Examples: fedaug archive runs/compare/fedfa_table5_digits4 results/fedfa_table5_digits4;  "
               "fedaug archive results/fedfa_table5_digits4 runs/compare/fedfa_table5_digits4;  "
               "fedaug archive paper_scale.tar.gz results")
    p.add_argument("src", help="a grid directory ('fedaug compare' output), an archive of one, or a tarball of "
                               "archived grids")
    p.add_argument("dest", help="where the runs go (created); for a tarball, the directory that holds the grids")
    p.add_argument("--keep-unfinished", action="store_true",
                   help="also copy each cell's unfinished run (stopped by --time-limit) with its records and its "
                        "newest checkpoint, so that fedaug compare continues it once it is brought back; an "
                        "unfinished run in DEST is replaced by one that got further, or by the run finished")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from fedaug.report.archive import archive_grid, merge_tarball

    src = Path(args.src)
    if src.is_file():
        for name, done in merge_tarball(src, Path(args.dest)).items():
            print(said(Path(args.dest) / name, done))
    else:
        print(said(Path(args.dest), archive_grid(src, Path(args.dest), keep_unfinished=args.keep_unfinished)))
    return 0


def said(dest: Path, done: Archived) -> str:
    """What an archive did to ``dest``, in one line."""
    unfinished = f" ({done.unfinished} unfinished, with their newest checkpoint)" if done.unfinished else ""
    replaced = f", {done.replaced} unfinished run(s) replaced" if done.replaced else ""
    return (f"{dest}: {done.copied} run(s) copied{unfinished}, {done.present} already there{replaced}, "
            f"{done.merged} invocation line(s) merged")
