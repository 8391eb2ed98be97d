"""``fedaug run [config|preset] [key=value ...]``: run one experiment into a new run directory."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("run", help="run one experiment (default: the digits4 preset)",
                       description="Run one experiment and write a run directory.")
    p.add_argument("source", nargs="?", default=None,
                   help="a preset name (fedaug list presets) or a TOML config file; default: digits4")
    p.add_argument("overrides", nargs="*", metavar="key=value",
                   help="override config values, e.g. train.rounds=5 method.options.fedavg.bn=local")
    add_import_flag(p)
    add_output_flags(p)
    p.set_defaults(func=main)


def add_import_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   help="import your module first (it registers datasets, models or methods): a module name or "
                        "the path of a .py file or package; repeatable; a run records it in its config.toml "
                        "(imports), so that 'fedaug resume' imports it again")


def cli_imports(args: argparse.Namespace) -> list[str]:
    """The ``--import`` modules, resolved against the current directory
    (:func:`fedaug.core.plugins.resolve_import`)."""
    from fedaug.core.plugins import resolve_imports

    return resolve_imports(args.imports, Path.cwd())


def import_now(args: argparse.Namespace) -> list[str]:
    """Import the ``--import`` modules at once (for commands that write no config: ``list``,
    ``data describe``); the resolved entries.

    Raises:
        ConfigError: naming every module that could not be imported and why.
    """
    from fedaug.core.errors import ConfigError
    from fedaug.core.plugins import import_problems

    entries = cli_imports(args)
    problems = import_problems(entries)
    if problems:
        raise ConfigError("; ".join(problems))
    return entries


def add_output_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-q", "--quiet", action="store_true", help="no progress display (nor, on resume, the round it "
                                                               "continues from)")
    p.add_argument("--format", choices=("table", "json"), default="table",
                   help="print the results as a Markdown table (default) or the summary as JSON")


def finish(summary: dict[str, Any], run_dir: Any, fmt: str) -> int:
    """Write the report (the run's name as literal Markdown; the run's notices and the rounds with
    rejections, drop-outs, attacks or kept aggregates, if any) and add it to the run's MLflow run when
    ``[log]`` tracks one, print the results (JSON: strict, non-finite numbers as null) and the run directory."""
    from fedaug.core.serialize import to_json
    from fedaug.engine.records.rundir import REPORT
    from fedaug.engine.records.tracking import log_run_files
    from fedaug.report.document import md_text, to_markdown
    from fedaug.report.incidents import incidents_table, run_incidents
    from fedaug.report.table import results_table

    table = results_table(summary)
    incidents = run_incidents(run_dir.rounds())
    extra = "".join(f"\n## Notice (round {n['round']})\n\n{md_text(n['text'])}\n" for n in summary.get("notices", []))
    extra += (f"\n## Rejections, drop-outs and attacks\n\n{to_markdown([incidents_table(incidents)])}"
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
    from fedaug.config.load import load_config
    from fedaug.core.runtime import configure_process
    from fedaug.engine.run import run_experiment

    if args.source is not None and "=" in args.source:  # only overrides were given
        args.overrides.insert(0, args.source)
        args.source = None
    cfg, _ = load_config(args.source, args.overrides, cli_imports(args))
    configure_process(cfg.threads, cfg.deterministic)
    summary, run_dir = run_experiment(cfg, quiet=args.quiet)
    return finish(summary, run_dir, args.format)
