"""``fedaug list [methods|datasets|models|presets|keys]``: what is available, one line each."""

from __future__ import annotations

import argparse
import json

from fedaug.config.presets import PRESETS
from fedaug.config.schema import describe
from fedaug.data.registry import DATASETS
from fedaug.methods.recipe import METHODS
from fedaug.models.registry import MODELS
from fedaug.report.grid import GRIDS

KINDS = ("methods", "datasets", "models", "presets", "grids", "keys")


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("list", help="list methods, datasets, models, presets, comparison grids or config keys",
                       description="List what fedaug provides, one line each.")
    p.add_argument("kind", nargs="?", choices=KINDS, help="what to list (default: all but keys)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=main)


def rows(kind: str) -> list[tuple[str, str]]:
    """(name, one-line description) pairs of one kind."""
    if kind == "methods":
        return [(n, f"[{METHODS.get(n).role}] {METHODS.help(n)}") for n in METHODS]
    if kind == "datasets":
        return [(n, DATASETS.help(n)) for n in DATASETS]
    if kind == "models":
        return [(n, MODELS.help(n)) for n in MODELS]
    if kind == "presets":
        return sorted(PRESETS.items())
    if kind == "grids":
        return sorted(GRIDS.items())
    if kind == "keys":
        return [(k, f"{h} (default {d!r})") for k, d, h in describe()]
    raise ValueError(f"unknown kind '{kind}'; choose from {', '.join(KINDS)}")


def main(args: argparse.Namespace) -> int:
    kinds = [args.kind] if args.kind else [k for k in KINDS if k != "keys"]
    listing = {k: rows(k) for k in kinds}
    if args.format == "json":
        print(json.dumps({k: dict(v) for k, v in listing.items()}, indent=2))
        return 0
    for k, items in listing.items():
        print(f"{k}:")
        width = max((len(n) for n, _ in items), default=0)
        for n, h in items:
            print(f"  {n:<{width}}  {h}")
    return 0
