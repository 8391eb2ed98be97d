"""``fedaug compare GRID | --method LABEL [key=value ...] ...``: run a grid of methods x settings x
seeds (resumable, optionally in parallel) and write one comparison table (docs/compare_and_report.md)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from fedaug.cli.run_cmd import add_import_flag, cli_imports
from fedaug.core.errors import ConfigError

if TYPE_CHECKING:
    from fedaug.report.grid import GridSpec
    from fedaug.report.runner import CellOutcome


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "compare", help="run a grid of methods x settings x seeds and tabulate mean ± std",
        description="Run every (setting, method, seed) cell of a grid that is not finished yet (finished "
                    "cells are kept, interrupted ones resumed), then write table.md, table.csv and "
                    "table.json: mean ± std over seeds, per client and the mean over clients, the paired "
                    "t-test against the baseline, and communication per method.",
        epilog="Examples: fedaug compare fedfa_table5_digits4 --jobs 2;  fedaug compare fedfa_table5_digits4 --ray "
               "head:6379;  fedaug compare --base digits4 "
               "--method FedAvg --method FedFA method.augs=[fedfa] --seeds 0 1 2 --set train.rounds=5")
    p.add_argument("grid", nargs="?", help="a grid file (TOML) or a shipped grid (fedaug list grids)")
    p.add_argument("--base", help="without a grid file: the preset or config file every cell starts from")
    p.add_argument("--method", nargs="+", action="append", metavar=("LABEL", "KEY=VALUE"),
                   help="without a grid file: a method's label and its overrides (repeat for each method)")
    p.add_argument("--setting", nargs="+", action="append", metavar=("LABEL", "KEY=VALUE"),
                   help="without a grid file: a setting's label and its overrides (repeatable)")
    p.add_argument("--seeds", nargs="+", type=int,
                   help="seeds (default: the grid's, or 0; with --scale paper: 0 1 2 3 4)")
    p.add_argument("--scale", default="stand-in", metavar="{stand-in,paper}",
                   help="with a grid file: 'paper' runs its paper-scale variant GRID-paper-scale: every cell at the "
                        "paper's rounds and local epochs (the grid's paper_rounds, paper_local_epochs), the same "
                        "data, seeds 0-4, its own output directory (docs/compare_and_report.md, 'Paper scale')")
    p.add_argument("--only-methods", nargs="+", default=[], metavar="LABEL",
                   help="with a grid file: run and tabulate only these of its methods (and its baseline); "
                        "the cells are the whole grid's, so with --out they can share its runs by --reuse")
    p.add_argument("--only-settings", nargs="+", default=[], metavar="LABEL",
                   help="with a grid file: run and tabulate only these of its settings")
    p.add_argument("--set", nargs="+", dest="set_overrides", default=[], metavar="KEY=VALUE",
                   help="overrides applied to every cell, last (e.g. train.rounds=5)")
    p.add_argument("--baseline", help="the method each one is compared with (default: the grid's, or the first)")
    p.add_argument("--jobs", type=int, default=1, help="cells run in parallel processes (default 1; at most the cores)")
    p.add_argument("--ray", nargs="?", const="auto", metavar="ADDRESS",
                   help="run each cell as a task on a Ray cluster (the ray extra; docs/cluster.md), reserving the "
                        "cell's ray.num_cpus (default threads) and ray.num_gpus: its head's host:port, ray://host:port, "
                        "or without ADDRESS the cluster of RAY_ADDRESS or of 'ray start' on this machine ('local': "
                        "a Ray of the command's own, started here even where another runs, stopped when it is done)")
    p.add_argument("--ray-files", choices=("auto", "shared", "shipped"), default="auto",
                   help="with --ray: where cells write their run directories: 'shared' into --out on every node (a "
                        "shared file system), 'shipped' on the node, then sent back here; 'auto' (default): shared "
                        "where the node sees --out, else shipped")
    p.add_argument("--out", help="output directory (default: runs/compare/<grid name>)")
    p.add_argument("--reuse", metavar="DIR",
                   help="copy in finished runs found under DIR (e.g. runs/compare) whose config equals a "
                        "cell's, instead of training that cell again")
    p.add_argument("--keep-going", action="store_true",
                   help="when a cell fails, run every other cell, then report all failures (exit status 2)")
    p.add_argument("--time-limit", metavar="DURATION",
                   help="stop before this much time has passed (90s, 9m, 2h, 1h30m): running cells stop at a round "
                        "boundary with a checkpoint, cells that would not fit are not started, the tables are "
                        "written, and the command exits with status 75; the same command continues "
                        "(docs/cluster.md: a Slurm job's wall time)")
    p.add_argument("--pack", action=argparse.BooleanOptionalAction, default=None,
                   help="train the cells that share a step's shape (model, the method's step, precision) as one "
                        "program each: every round, their sampled clients train as one batched group, each cell "
                        "keeping its own records and run directory (docs/engine.md, 'Packed cells'; for GPUs: on a "
                        "CPU it is slower than cells one at a time); default: the grid file's 'pack', else off")
    p.add_argument("--pack-size", type=int, metavar="N",
                   help="with --pack: at most N cells a pack (memory); default: every cell of one step's shape")
    p.add_argument("--table-only", action="store_true", help="run nothing; tabulate the finished cells")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress on stderr (what runs, at once; cells done / running / left, each running cell's "
                        "round and ETA, the grid's ETA, a line per finished cell)")
    p.add_argument("--format", choices=("table", "json"), default="table",
                   help="print the Markdown table (default) or the summary as JSON")
    add_import_flag(p)
    p.set_defaults(func=main)


def spec_from_args(args: argparse.Namespace) -> GridSpec:
    """The grid named by ``args``: a grid file, or ``--base``/``--method``/``--setting``."""
    from fedaug.report.grid import grid_from_args, load_grid, select
    from fedaug.report.paper_scale import at_scale

    imports = cli_imports(args)
    if args.grid is not None:
        given = [f"--{k}" for k in ("base", "method", "setting") if getattr(args, k)]
        if given:
            raise ConfigError(f"give a grid file or {'/'.join(given)} on the command line, not both "
                              "(put the methods and settings into the grid file)")
        spec = select(load_grid(args.grid, seeds=args.seeds, baseline=args.baseline, overrides=args.set_overrides,
                                imports=imports), args.only_methods, args.only_settings)
        return at_scale(spec, args.scale, args.seeds)
    if args.scale != "stand-in":
        raise ConfigError(f"--scale {args.scale} runs a grid file at another scale (a paper's rounds and local epochs "
                          "that the file states); a grid on the command line states none: give a grid file")
    if args.only_methods or args.only_settings:
        raise ConfigError("--only-methods and --only-settings pick from a grid file's methods and settings; "
                          "without a grid file give just the --method and --setting you want")
    if not args.method:
        raise ConfigError("give a grid file (fedaug list grids) or at least one --method LABEL [key=value ...]")
    return grid_from_args(args.base, args.method, args.setting or [], args.seeds or [0], baseline=args.baseline,
                          overrides=args.set_overrides, imports=imports)


def main(args: argparse.Namespace) -> int:
    from fedaug.core.runtime import configure_process
    from fedaug.report.deadline import STOPPED_STATUS, now, parse_time_limit
    from fedaug.report.progress import GridProgress
    from fedaug.report.ray_cells import RayCells
    from fedaug.report.runner import CellError, log_invocation, run_grid, write_grid_file
    from fedaug.report.table import write_tables

    deadline = now() + parse_time_limit(args.time_limit) if args.time_limit else None  # counted from here
    if args.ray is None and args.ray_files != "auto":
        raise ConfigError(f"--ray-files {args.ray_files} says where cells on a Ray cluster write; add --ray [ADDRESS]")
    if args.table_only and args.time_limit:
        raise ConfigError("--time-limit limits the cells' training, and --table-only trains none: drop one of them")
    spec = spec_from_args(args)
    pack = spec.pack if args.pack is None else args.pack
    if args.pack_size is not None and (not pack or args.pack_size < 2):
        raise ConfigError(f"--pack-size {args.pack_size} bounds the cells of a pack: give it with --pack (or a grid "
                          "file's pack = true), and at least 2")
    out = Path(args.out or Path("runs") / "compare" / spec.name)
    failure: CellError | None = None
    outcomes: list[CellOutcome] = []
    if args.table_only:
        write_grid_file(spec, out)
    else:
        configure_process()  # each cell's thread count is set by the runner
        t0 = time.perf_counter()
        display = None if args.quiet else GridProgress(spec.name)
        try:
            with display if display is not None else nullcontext():
                outcomes = run_grid(spec, out, args.jobs, on_done=display.finished if display else None,
                                    reuse=Path(args.reuse) if args.reuse else None, keep_going=args.keep_going,
                                    watch=display, ray=RayCells(args.ray, args.ray_files) if args.ray else None,
                                    deadline=deadline, pack=pack, pack_size=args.pack_size,
                                    on_plan=None if args.quiet else tell_plan)
        except CellError as exc:  # tabulate what finished, then report the failure
            failure, outcomes = exc, exc.outcomes
        where = [f"--ray {args.ray}", f"--ray-files {args.ray_files}"] if args.ray else [f"--jobs {args.jobs}"]
        wall = time.perf_counter() - t0
        log_invocation(out, logged_command(args, where), args.jobs, wall, outcomes, failure is not None,
                       args.time_limit)
        if not args.quiet and failure is None:
            worked = sum(o.status in ("ran", "resumed", "stopped") for o in outcomes)
            reused = sum(o.status == "reused" for o in outcomes)
            print(f"wall time: {wall:.0f} s for {worked} of {len(outcomes)} cells run "
                  f"({where[0]}){f', {reused} reused' if reused else ''}", file=sys.stderr)
    files = write_tables(out)
    if args.format == "json":
        print(files["json"].read_text(), end="")
    else:
        print(files["markdown"].read_text(), end="")
        print(f"\ntables: {', '.join(str(f) for f in files.values())}")
    if failure is not None:
        raise failure
    if any(o.unfinished for o in outcomes):
        print(what_is_left(outcomes, args), file=sys.stderr)
        return STOPPED_STATUS
    return 0


def tell_plan(lines: list[str]) -> None:
    """The packs of a packed grid and why each other cell trains alone, on stderr."""
    for line in lines:
        print(f"fedaug compare: {line}", file=sys.stderr)


def logged_command(args: argparse.Namespace, where: list[str]) -> str:
    """The invocation as ``invocations.jsonl`` records it: the grid, ``where`` it ran, and the options that
    choose and run its cells."""
    return " ".join(["fedaug compare", args.grid or "(methods on the command line)", *where,
                     *([f"--scale {args.scale}"] if args.scale != "stand-in" else []),
                     *([f"--seeds {' '.join(map(str, args.seeds))}"] if args.seeds else []),
                     *([f"--only-methods {' '.join(map(repr, args.only_methods))}"] if args.only_methods else []),
                     *([f"--only-settings {' '.join(map(repr, args.only_settings))}"] if args.only_settings else []),
                     *([f"--set {' '.join(args.set_overrides)}"] if args.set_overrides else []),
                     *([f"--reuse {args.reuse}"] if args.reuse else []),
                     *[f"--import {m}" for m in args.imports],
                     *(["--keep-going"] if args.keep_going else []),
                     *(["--pack"] if args.pack else ["--no-pack"] if args.pack is False else []),
                     *([f"--pack-size {args.pack_size}"] if args.pack_size else []),
                     *([f"--time-limit {args.time_limit}"] if args.time_limit else [])])


def what_is_left(outcomes: list[CellOutcome], args: argparse.Namespace) -> str:
    """What a grid stopped at its time limit left, and the command that continues it (the one given)."""
    counts = {status: sum(o.status == status for o in outcomes) for status in ("not started", "busy")}
    finished = sum(o.status in ("done before", "ran", "resumed", "reused") for o in outcomes)
    stopped = [o for o in outcomes if o.status == "stopped"]
    parts = [f"{finished} of {len(outcomes)} cells finished",
             f"{len(stopped)} stopped" + (f" ({'; '.join(o.cell.label + o.detail() for o in stopped)})"
                                          if stopped else ""),
             f"{counts['not started']} not started"] + ([f"{counts['busy']} busy in another process"]
                                                          if counts["busy"] else [])
    return (f"fedaug compare: stopped at the time limit (--time-limit {args.time_limit}): {', '.join(parts)}; "
            "their checkpoints are saved. Exit status 75: continue with the same command, in the same directory "
            f"({os.getcwd()}):\n  {shlex.join(['fedaug', *args.argv])}")
