"""``fedaug resume <run dir>``: finish an interrupted run from its newest checkpoint."""

from __future__ import annotations

import argparse

from fedaug.cli.run_cmd import add_output_flags, finish
from fedaug.config.load import parse_config, read_toml
from fedaug.core.runtime import configure_process
from fedaug.engine.records import CONFIG, RunDir
from fedaug.engine.simulate import resume_experiment


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("resume", help="finish an interrupted run",
                       description="Continue a run from its newest checkpoint; the result equals an "
                                   "uninterrupted run's.")
    p.add_argument("run_dir", help="the run directory 'fedaug run' printed")
    p.add_argument("--device", help="compute the remaining rounds here (cpu, cuda, cuda:N, mps, auto) instead of "
                                    "on the run's own device; the resume warns that the device moved")
    p.add_argument("--workers", type=int, help="train the remaining rounds' clients on this many worker processes "
                                               "(the numbers do not change: docs/engine.md, 'Workers')")
    add_output_flags(p)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    cfg = parse_config(read_toml(RunDir.open(args.run_dir).path / CONFIG))
    configure_process(cfg.threads, cfg.deterministic)
    summary, run_dir = resume_experiment(args.run_dir, quiet=args.quiet, device=args.device,
                                         workers=args.workers)
    return finish(summary, run_dir, args.format)
