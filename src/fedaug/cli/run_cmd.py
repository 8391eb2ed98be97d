"""``fedaug run [config|preset] [key=value ...]``: run one experiment into a new run directory."""

from __future__ import annotations

import argparse
from typing import Any

from fedaug.config.load import load_config
from fedaug.core.runtime import configure_process
from fedaug.core.serialize import to_json
from fedaug.engine.records.rundir import REPORT
from fedaug.engine.run import run_experiment
from fedaug.engine.records.tracking import log_run_files
from fedaug.report.document import md_text, to_markdown
from fedaug.report.incidents import incidents_table, run_incidents
from fedaug.report.table import results_table


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("run", help="run one experiment (default: the digits4 preset)",
                       description="Run one experiment and write a run directory.")
    p.add_argument("source", nargs="?", default=None,
                   help="a preset name (fedaug list presets) or a TOML config file; default: digits4")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="override config values, e.g. train.rounds=5 method.options.fedavg.bn=local")
    add_output_flags(p)
    p.set_defaults(func=main)


def add_output_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-q", "--quiet", action="store_true", help="no progress display")
    p.add_argument("--format", choices=("table", "json"), default="table",
                   help="print the results as a Markdown table (default) or the summary as JSON")


def finish(summary: dict[str, Any], run_dir: Any, fmt: str) -> int:
    """Write the report (the run's name as literal Markdown; the rounds with rejections, drop-outs,
    attacks or kept aggregates, if any) and add it to the run's MLflow run when ``[log]`` tracks one,
    print the results (JSON: strict, non-finite numbers as null) and the run directory."""
    table = results_table(summary)
    incidents = run_incidents(run_dir.rounds())
    extra = (f"\n## Rejections, drop-outs and attacks\n\n{to_markdown([incidents_table(incidents)])}"
             if incidents else "")
    run_dir.write_report(f"# {md_text(str(summary['name']))}\n\n{table}\n{extra}")
    log_run_files(run_dir.path, [run_dir.path / REPORT])
    if fmt == "json":
        print(to_json(summary, indent=2))
    else:
        print(table)
        print(f"\nrun directory: {run_dir.path}")
    return 0


def main(args: argparse.Namespace) -> int:
    if args.source is not None and "=" in args.source:  # only overrides were given
        args.overrides.insert(0, args.source)
        args.source = None
    cfg, _ = load_config(args.source, args.overrides)
    configure_process(cfg.threads, cfg.deterministic)
    summary, run_dir = run_experiment(cfg, quiet=args.quiet)
    return finish(summary, run_dir, args.format)
