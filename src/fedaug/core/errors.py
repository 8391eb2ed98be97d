"""The exception hierarchy of fedaug.

Every error a user can cause derives from :class:`FedaugError`; the message says what was wrong,
what was given, what is allowed and how to fix it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class FedaugError(Exception):
    """Base class of every error fedaug raises on purpose."""


class ConfigError(FedaugError, ValueError):
    """A configuration key, value or combination is invalid."""


class PayloadError(FedaugError, ValueError):
    """A message part failed validation (missing/extra names, shape, dtype, non-finite values)."""


class AggregationError(FedaugError, ValueError):
    """A server rule cannot fold this round's accepted replies (e.g. Krum with too few of them); the
    server keeps its previous state for the round and records why (docs/engine.md, "The trust boundary")."""


class AttachError(FedaugError, LookupError):
    """A module name to attach a layer after does not exist in the model."""

    def __str__(self) -> str:  # LookupError/KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class DataError(FedaugError, OSError):
    """A data source is missing or malformed; the message shows the expected layout or install."""


class CheckpointError(FedaugError, OSError):
    """A run directory or checkpoint cannot be read (missing, truncated or corrupted)."""


class StorageError(FedaugError, OSError):
    """A run directory cannot be written (a full disk, a quota, a read-only file system); what was
    written before stays intact and the run resumes once the cause is fixed."""


class RunStopped(Exception):
    """A run stopped on purpose after a round, its checkpoint saved, because its ``stop`` predicate said
    so (a time limit: :mod:`fedaug.report.deadline`). Not a failure, so not a :class:`FedaugError`:
    ``fedaug resume`` continues from round ``round + 1`` to the numbers of an uninterrupted run.

    Args:
        round: the last round trained, recorded and checkpointed.
        rounds: the rounds the run is configured for (``round < rounds``).

    Attributes:
        run_dir: the run directory (set as the exception leaves it, :class:`~fedaug.engine.records.rundir.RunDir`;
            absent for a run that writes none).

    >>> str(RunStopped(4, 10))
    'stopped after round 4 of 10'
    """

    def __init__(self, round: int, rounds: int) -> None:
        super().__init__(f"stopped after round {round} of {rounds}")
        self.round, self.rounds = round, rounds


def suggest(name: str, choices: Iterable[str]) -> str:
    """Return ``" (did you mean 'x'?)"`` for the closest choice, or ``""`` when none is close."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def unknown_name(kind: str, name: str, choices: Iterable[str]) -> str:
    """Format the message for an unknown registry name, listing choices and the closest one."""
    choices = sorted(choices)
    return f"unknown {kind} '{name}'; choose from {', '.join(choices)}{suggest(name, choices)}"
