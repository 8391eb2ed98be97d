"""``fedaug kernel``: build the FFA layer's compiled CPU kernel ahead of time, or say where it stands."""

from __future__ import annotations

import argparse

from fedaug.layers import kernel


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("kernel", help="build the FFA layer's compiled CPU kernel (else built on first use)",
                       description="Compile (or find cached) the fused FFA kernel and print the library's "
                                   f"path. {kernel.MODE_ENV}=auto|on|off chooses whether layers use it; "
                                   f"{kernel.CACHE_ENV} moves the cache.")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    print(f"{kernel.build()}  ({kernel.MODE_ENV}={kernel.mode()})")
    return 0
