"""``fedaug``: entry point; dispatches to one module per subcommand, turns errors into exit codes.

The subcommand modules import what they run only when they run it, so that ``fedaug --help``,
``--version`` and ``fedaug list`` do not import torch."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence

from fedaug.cli import data_cmd, list_cmd, resume_cmd, run_cmd
from fedaug.cli import archive_cmd, compare_cmd, env_cmd, flower_cmd, kernel_cmd, privacy_cmd, report_cmd
from fedaug.core.errors import FedaugError
from fedaug.core.version import RETIRED_ENV, __version__

SUBCOMMANDS = (run_cmd, resume_cmd, compare_cmd, archive_cmd, report_cmd, flower_cmd, list_cmd, data_cmd,
               privacy_cmd, kernel_cmd, env_cmd)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedaug",
        description="Federated learning on heterogeneous clients with federated augmentation.",
        epilog="Run 'fedaug COMMAND --help' for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"fedaug {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in SUBCOMMANDS:
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 2 a user error with its message on stderr, 75 stopped at a
    ``--time-limit``: :data:`~fedaug.report.deadline.STOPPED_STATUS`, 141 the reader of its output went away:
    ``fedaug list | head -1``)."""
    try:
        try:
            code = _command(argv)
        except SystemExit:  # argparse's help, version and usage errors
            _flush()
            raise
        _flush()
        return code
    except BrokenPipeError:
        return _closed_pipe()


def _flush() -> None:
    """Write what stdout and stderr still buffer, so that a closed pipe shows here (where :func:`main` ends
    quietly), not in the interpreter's last flush."""
    sys.stdout.flush()
    sys.stderr.flush()


#: the exit status of a command whose output pipe closed: 128 + SIGPIPE, as a shell reports a tool killed by it
CLOSED_PIPE = 128 + 13


def _closed_pipe() -> int:
    """End quietly after a write to a closed pipe (Python's documented recipe, "Note on SIGPIPE"): point
    stdout and stderr at the null device, so that nothing more is written to the pipe (the interpreter's
    last flush included), and return :data:`CLOSED_PIPE`. Whatever the command had written stays written; a
    run unwinds as on Ctrl-C (records and checkpoints as last written, run locks released)."""
    null = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        try:
            os.dup2(null, stream.fileno())
        except (AttributeError, OSError, ValueError):  # not a file with a descriptor (a test's capture)
            continue
    os.close(null)
    return CLOSED_PIPE


def _command(argv: Sequence[str] | None) -> int:
    """:func:`main` up to its output's last flush."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # key=value overrides may come after options (``fedaug run preset -q train.lr=0.1``)
    if extra and hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides.extend(extra)
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command is None:
        parser.print_help()
        return 0
    args.argv = list(argv) if argv is not None else sys.argv[1:]  # the command, to say how to run it again
    if os.environ.get(RETIRED_ENV):
        print(f"fedaug: warning: {RETIRED_ENV} is no longer read and changes nothing; the FFA layers' path is "
              "the config option method.options.fedfa.kernel (or vfda.kernel): \"off\" (default) or \"on\"",
              file=sys.stderr)
    in_main = threading.current_thread() is threading.main_thread()  # only there may a handler be set
    previous = signal.signal(signal.SIGTERM, _terminate) if in_main else None
    try:
        return args.func(args)
    except FedaugError as exc:
        print(f"fedaug: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        what = "terminated (SIGTERM)" if isinstance(exc, Terminated) else "interrupted"
        run_dir = getattr(exc, "run_dir", None)
        print(f"fedaug: {what}; " + (_saved(run_dir) if run_dir else "nothing that was written is lost: run the "
                                     "command again (or 'fedaug resume RUN_DIR' for a run it had started)"),
              file=sys.stderr)
        return 128 + (signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)


def _saved(run_dir: str) -> str:
    """What the interrupted run ``run_dir`` saved and what a resume does (:class:`~fedaug.cli.saved.Saved`)."""
    from fedaug.cli.saved import Saved

    try:
        return Saved.of(run_dir).interrupted()
    except FedaugError as exc:  # its config cannot be read: say where it is all the same
        return f"its run directory is '{run_dir}' ({exc})"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is, so that it unwinds like Ctrl-C: run locks released,
    records and checkpoints as they were last written."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated()
