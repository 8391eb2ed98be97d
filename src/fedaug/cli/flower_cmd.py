"""``fedaug flower ...``: run any experiment on Flower (the ``flower`` extra; docs/flower.md).

- ``fedaug flower app CONFIG [key=value ...] --out DIR``: write a ready Flower app for the config;
- ``fedaug flower local CONFIG [key=value ...] --dir DIR [--tls] [--auth] [--start]``: a loopback
  trial (one SuperLink, one SuperNode per client): print its commands, or start it;
- ``fedaug flower run CONFIG [key=value ...] [--engine inprocess|simulation]``: run through
  Flower's message path in this process, or in Flower's simulation runtime (Ray).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedaug.cli.run_cmd import add_import_flag, add_output_flags, cli_imports, finish
from fedaug.core.errors import FedaugError

if TYPE_CHECKING:
    from fedaug.config.schema import RunConfig


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("flower", help="run an experiment on Flower (app, loopback trial, simulation)",
                       description="Run any fedaug experiment on Flower's Message API (docs/flower.md).")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    app = actions.add_parser("app", help="write a ready Flower app (pyproject.toml with the config embedded)")
    _source(app)
    app.add_argument("--out", required=True, type=Path, help="the app directory to write")
    app.add_argument("--force", action="store_true", help="overwrite an app already there")
    _settings(app)
    app.set_defaults(func=app_main)

    local = actions.add_parser("local", help="a loopback trial: print (or --start) SuperLink, SuperNodes, flwr run")
    _source(local)
    local.add_argument("--dir", required=True, type=Path, help="the trial directory (app, homes, logs, certificates)")
    local.add_argument("--nodes", type=int, default=None,
                       help="number of SuperNodes (default: the dataset's number of clients)")
    local.add_argument("--tls", action="store_true", help="TLS with a self-signed CA made for the trial")
    local.add_argument("--auth", action="store_true", help="SuperNode authentication (a key pair per SuperNode)")
    local.add_argument("--data-dir", action="append", default=[], metavar="DIR",
                       help="a SuperNode's local data directory (repeat once per SuperNode, in partition order)")
    local.add_argument("--device", default="", metavar="DEVICE",
                       help="every SuperNode's device (auto, cpu, cuda, cuda:N, mps; node config 'device'); "
                            "default: the config's device")
    local.add_argument("--start", action="store_true", help="start the trial here, run it, stop every process")
    _settings(local)
    local.set_defaults(func=local_main)

    run = actions.add_parser("run", help="run through Flower's message path here, or in Flower's simulation (Ray)")
    _source(run)
    run.add_argument("--engine", choices=("inprocess", "simulation"), default="inprocess",
                     help="inprocess: ClientApps called in this process (default); simulation: Ray workers")
    add_output_flags(run)
    run.set_defaults(func=run_main)


def _source(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", nargs="?", default=None, help="a preset name or a TOML config file; default: digits4")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="override config values, e.g. train.rounds=5")
    add_import_flag(p)


def _settings(p: argparse.ArgumentParser) -> None:
    p.add_argument("--round-timeout", type=float, default=600.0,
                   help="seconds the server waits for one phase's replies; 0 waits for all (default 600)")
    p.add_argument("--connect-timeout", type=float, default=120.0,
                   help="seconds the server waits for every SuperNode at the start (default 120)")


def _config(args: argparse.Namespace) -> RunConfig:
    from fedaug.config.load import load_config

    if args.source is not None and "=" in args.source:  # only overrides were given
        args.overrides.insert(0, args.source)
        args.source = None
    cfg, _ = load_config(args.source, args.overrides, cli_imports(args))
    return cfg


def _num_clients(cfg: RunConfig, data_dir: str | None = None) -> int:
    from fedaug.data.registry import load_dataset

    options = {**cfg.data.options, **({"root": data_dir} if data_dir else {})}
    return load_dataset(cfg.data.name, cfg.seed, **options).num_clients


def _timeouts(args: argparse.Namespace) -> dict[str, Any]:
    return {"round_timeout": args.round_timeout, "connect_timeout": args.connect_timeout}


def app_main(args: argparse.Namespace) -> int:
    from fedaug.engine.flower.app import write_app

    out = write_app(_config(args), args.out, force=args.force, **_timeouts(args))
    print(f"Flower app written to {out}\nrun it: flwr run {out} <federation>   (docs/flower.md)")
    return 0


def local_main(args: argparse.Namespace) -> int:
    from fedaug.engine.flower.app import write_app
    from fedaug.engine.flower.local import LoopbackTrial

    cfg = _config(args)
    cfg.out_dir = str(Path(cfg.out_dir).resolve())  # the SuperLink's server process writes the run here
    nodes = args.nodes or (len(args.data_dir) if args.data_dir else _num_clients(cfg))
    app = write_app(cfg, args.dir / "app", force=True, **_timeouts(args))
    trial = LoopbackTrial(app, args.dir, nodes, tls=args.tls, auth=args.auth, data_dirs=args.data_dir,
                          device=args.device)
    if not args.start:
        trial.prepare()
        print(f"# Loopback trial in {trial.workdir}: run each line in its own terminal, in this order.")
        for command in trial.commands():
            print(command.shell())
        return 0
    with trial.running():
        out = trial.call(trial.flwr_run(), echo=sys.stdout).stdout
    found = re.search(r"run directory (\S+)", out)
    if found is None:
        raise FedaugError(f"the run printed no run directory; see the logs in {trial.workdir}")
    print(f"\nrun directory: {found.group(1)}")
    return 0


def run_main(args: argparse.Namespace) -> int:
    from fedaug.engine.records.rundir import RunDir

    cfg = _config(args)
    if args.engine == "simulation":
        from fedaug.engine.flower.simulation import run_flower_simulation as run
    else:
        from fedaug.engine.flower.inprocess import run_in_process as run
    summary = run(cfg, _num_clients(cfg), quiet=args.quiet)
    return finish(summary, RunDir(summary["run_dir"]), args.format)
