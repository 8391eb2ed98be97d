"""``fedaug kernel``: build fedaug's compiled CPU libraries ahead of time (the FFA layer's kernel, the
server's one-pass arithmetic on uploads, the clients' one-pass SGD step), or say where they stand."""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ThreadPoolExecutor

from fedaug.core.native import CACHE_ENV


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("kernel", help="build fedaug's compiled CPU libraries (the FFA kernel, the server's arithmetic, "
                                          "the clients' SGD step)",
                       description="Compile (or find cached) the fused FFA kernel, the server's library of "
                                   "one-pass arithmetic on uploads and the clients' one-pass SGD step, and print "
                                   "their paths, one a line. Runs use "
                                   "the FFA kernel only where their config asks for it (method.options.fedfa."
                                   "kernel = \"on\", likewise vfda; the default \"off\" is the pure-PyTorch path) "
                                   "and the other two wherever they are built (they give the bits of their "
                                   f"PyTorch paths, faster); {CACHE_ENV} moves the cache. A library that "
                                   "does not build is named on stderr with what a run does without it (exit 2).")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from fedaug.core import local_sgd, server_ops
    from fedaug.core.native import KernelBuildError
    from fedaug.engine.records.installation import LIBRARIES
    from fedaug.layers import kernel

    failed = 0
    builds = (("ffa_kernel", kernel.build), ("server_ops", server_ops.build), ("local_sgd", local_sgd.build))
    with ThreadPoolExecutor(len(builds)) as pool:  # each a compiler process, all at once
        pending = [(name, pool.submit(build)) for name, build in builds]
    for name, done in pending:
        try:
            print(done.result())
        except KernelBuildError as err:
            failed += 1
            print(f"fedaug kernel: {name} NOT built: {err}\n  without it {LIBRARIES[name][2]}", file=sys.stderr)
    return 2 if failed else 0
