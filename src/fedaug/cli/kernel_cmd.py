"""``fedaug kernel``: build the FFA layer's compiled CPU kernel ahead of time, or say where it stands."""

from __future__ import annotations

import argparse

from fedaug.layers import kernel


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("kernel", help="build the FFA layer's compiled CPU kernel (else built when a run needs it)",
                       description="Compile (or find cached) the fused FFA kernel and print the library's "
                                   "path. Runs use it only where their config asks for it (method.options."
                                   "fedfa.kernel = \"on\", likewise vfda; the default \"off\" is the "
                                   f"pure-PyTorch path); {kernel.CACHE_ENV} moves the cache.")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    print(kernel.build())
    return 0
