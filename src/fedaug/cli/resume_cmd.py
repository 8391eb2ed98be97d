"""``fedaug resume <run dir> [--from-round K]``: finish an interrupted run from its newest checkpoint
(or from the checkpoint of round K)."""

from __future__ import annotations

import argparse
import shlex
import sys

from fedaug.cli.run_cmd import add_output_flags, finish


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("resume", help="finish an interrupted run",
                       description="Continue a run from its newest checkpoint (it says from which round; "
                                   "without one the run starts again from round 1); the result equals an "
                                   "uninterrupted run's. The modules the run imports (its config's imports) are "
                                   "imported again.")
    p.add_argument("run_dir", help="the run directory 'fedaug run' printed")
    p.add_argument("--device", help="compute the remaining rounds here (cpu, cuda, cuda:N, mps, auto) instead of "
                                    "on the run's own device; the resume warns that the device moved")
    p.add_argument("--workers", type=int, help="train the remaining rounds' clients on this many worker processes "
                                               "(the numbers do not change: docs/engine.md, 'Workers')")
    p.add_argument("--fleet", choices=("local", "ray"),
                   help="where the remaining rounds' workers run: 'local' (this machine, e.g. after the Ray cluster "
                        "is gone) or 'ray' (docs/cluster.md); the numbers do not change")
    p.add_argument("--from-round", type=int, metavar="K", dest="from_round",
                   help="continue from the checkpoint of round K instead of the newest (0: from the start); later "
                        "checkpoints are deleted and later records moved to metrics.aside.jsonl, e.g. to go back "
                        "before a round whose global state no client can train from")
    p.add_argument("--time-limit", metavar="DURATION",
                   help="stop before this much time has passed (90s, 9m, 2h, 1h30m), after a round, with its "
                        "checkpoint, and exit with status 75; the same command continues")
    add_output_flags(p)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from fedaug.cli.saved import Saved
    from fedaug.core.errors import CheckpointError, RunStopped
    from fedaug.core.runtime import configure_process
    from fedaug.engine.records.rundir import RunDir, stored_config
    from fedaug.engine.run import resume_experiment
    from fedaug.report.deadline import STOPPED_STATUS, Deadline, now, parse_time_limit

    deadline = Deadline.until(now() + parse_time_limit(args.time_limit)) if args.time_limit else None
    cfg = stored_config(RunDir.open(args.run_dir).path)
    configure_process(cfg.threads, cfg.deterministic)
    if args.from_round is not None and args.from_round < 0:
        raise CheckpointError(f"--from-round must be a round >= 0, got {args.from_round}")
    note = Saved.of(args.run_dir).resuming(args.from_round)
    if note and not args.quiet:
        print(f"fedaug: {note}", file=sys.stderr, flush=True)
    try:
        summary, run_dir = resume_experiment(args.run_dir, quiet=args.quiet, device=args.device,
                                             from_round=args.from_round, workers=args.workers, fleet=args.fleet,
                                             stop=deadline.watch() if deadline is not None else None)
    except RunStopped as exc:
        print(f"fedaug resume: stopped at the time limit (--time-limit {args.time_limit}) after round {exc.round} "
              f"of {exc.rounds}, its checkpoint saved. Exit status 75: continue with the same command: "
              f"{shlex.join(['fedaug', *args.argv])}", file=sys.stderr)
        return STOPPED_STATUS
    return finish(summary, run_dir, args.format)
