"""``fedaug data describe <dataset> [key=value ...] [--plot out.png]``: per-client sizes and labels;
``fedaug data export GRID... --out DIR``: a data bundle of the federations the grids load (docs/data.md)."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from fedaug.cli.run_cmd import add_import_flag, import_now

if TYPE_CHECKING:
    from fedaug.data.base import FederatedData


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("data", help="inspect datasets", description="Inspect a registered dataset.")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    d = actions.add_parser("describe", help="per-client split sizes and label histograms",
                           description="Build a dataset and print per-client sizes and label histograms.")
    d.add_argument("dataset", help="a dataset name (fedaug list datasets)")
    d.add_argument("overrides", nargs="*", metavar="key=value", help="dataset options, e.g. num_clients=5 alpha=0.1")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--plot", metavar="PNG", help="also save a stacked bar chart of train labels per client")
    d.add_argument("--format", choices=("table", "json"), default="table")
    add_import_flag(d)
    d.set_defaults(func=main)
    e = actions.add_parser(
        "export", help="bundle the federations grids load, for a machine without the data sources",
        description="Build every distinct (dataset, seed, options) the cells of the grids load, once, and write them "
                    "as a data bundle into DIR (bundle.pt and bundle.json). With FEDAUG_DATA_BUNDLE=DIR, runs read "
                    "those federations from it, bit for bit as built, instead of building them (docs/data.md, "
                    "'Data bundles').",
        epilog="Example: fedaug data export fedfa_table5_digits4 fedfa_table7_digits4 --scale paper --out .data-bundle")
    e.add_argument("grids", nargs="+", metavar="GRID", help="grid files or shipped grids (fedaug list grids)")
    e.add_argument("--out", required=True, metavar="DIR", help="the bundle's directory (created; replaced)")
    e.add_argument("--scale", default="stand-in", metavar="{stand-in,paper}",
                   help="the grids at their own scale, or their paper-scale variants (fedaug compare --scale)")
    e.add_argument("--seeds", nargs="+", type=int, help="the seeds (default: each grid's, or 0-4 at --scale paper)")
    e.set_defaults(func=export)


def parse_options(pairs: list[str]) -> dict[str, Any]:
    """Dataset options as ``fedaug run`` reads ``data.options.KEY=VALUE``
    (:func:`fedaug.config.load.apply_overrides`): ``["a=1", "b=x", "c=[p, q]"]`` ->
    ``{"a": 1, "b": "x", "c": ["p", "q"]}``."""
    from fedaug.config.load import apply_overrides

    return apply_overrides({}, pairs, what="dataset option", example="num_clients=5")


def histograms(data: FederatedData) -> list[dict[str, Any]]:
    """Per client: name, group, split sizes and the train label histogram (classification) or
    the train pixel/voxel class counts (segmentation)."""
    import numpy as np

    rows = []
    for c in data.clients:
        hist = np.bincount(c.train.y.reshape(-1).numpy(), minlength=data.num_classes)
        rows.append({"client": c.name, "group": c.group, "train": len(c.train), "val": len(c.val), "test": len(c.test),
                     "train_labels": hist.tolist()})
    return rows


def table(data: FederatedData, rows: list[dict[str, Any]]) -> str:
    unit = "pixel counts" if data.task == "segmentation" else "counts"
    head = f"| client | group | train | val | test | train label {unit} (0..{data.num_classes - 1}) |"
    lines = [head, "|" + "---|" * 6]
    for r in rows:
        lines.append(f"| {r['client']} | {r['group']} | {r['train']} | {r['val']} | {r['test']} | "
                     f"{' '.join(map(str, r['train_labels']))} |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    counts = np.array([r["train_labels"] for r in rows], dtype=float)  # (K, C)
    fig, ax = plt.subplots(figsize=(max(4.0, 0.5 * len(rows) + 2), 3.5))
    bottom = np.zeros(len(rows))
    cmap = plt.get_cmap("tab20")
    for c in range(counts.shape[1]):
        ax.bar(range(len(rows)), counts[:, c], bottom=bottom, color=cmap(c % 20), label=str(c))
        bottom += counts[:, c]
    ax.set_xticks(range(len(rows)), [r["client"] for r in rows], rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("train samples")
    ax.set_title(title)
    if counts.shape[1] <= 20:
        ax.legend(title="class", fontsize=6, ncol=2, bbox_to_anchor=(1.01, 1), loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(args: argparse.Namespace) -> int:
    from fedaug.data.registry import load_dataset

    import_now(args)
    data = load_dataset(args.dataset, args.seed, **parse_options(args.overrides))
    rows = histograms(data)
    if args.format == "json":
        print(json.dumps({"dataset": data.name, "task": data.task, "num_classes": data.num_classes,
                          "input_shape": list(data.input_shape), "clients": rows}, indent=2))
    else:
        classes = data.info.get("classes")
        named = f" ({', '.join(map(str, classes))})" if classes else ""
        print(f"{data.name}: {data.task}, {data.num_classes} classes{named}, input {tuple(data.input_shape)}, "
              f"{data.num_clients} clients\n")
        print(table(data, rows))
    if args.plot:
        plot(rows, args.plot, f"{data.name}: train labels per client")
        if args.format != "json":
            print(f"\nplot: {args.plot}")
    return 0


def export(args: argparse.Namespace) -> int:
    """``fedaug data export``: bundle what the grids load, then say how big each pool is."""
    from pathlib import Path

    from fedaug.data.bundle import INDICES, export_bundle
    from fedaug.data.registry import build_dataset
    from fedaug.report.grid import cell_federations, load_grid
    from fedaug.report.paper_scale import at_scale

    specs = [at_scale(load_grid(g, seeds=args.seeds), args.scale, args.seeds) for g in args.grids]
    done = export_bundle([f for spec in specs for f in cell_federations(spec)], Path(args.out), build_dataset)
    print(f"{args.out}: {done.federations} federation(s) of {len(specs)} grid(s), {done.bytes / 2**20:.1f} MiB")
    for key, rows in done.rows.items():
        what = "row indices" if key == INDICES else "distinct rows"
        print(f"  {key}: {rows} {what}, {done.pool_bytes[key] / 2**20:.1f} MiB compressed")
    return 0
